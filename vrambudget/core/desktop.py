"""What a desktop session holds on the GPU that drives it, before any workload of the user's
starts: the compositor's and the desktop applications' surfaces (Windows' WDDM driver, under
which WSL2 and Docker Desktop run too; Xorg or a Wayland compositor on Linux).

A request says the device drives one (``device.desktop_session``) and, where it does not also
say what other processes hold (``device.memory_in_use_bytes``, measured), the hold is the
median of published ``nvidia-smi`` readings of such desktops, with the spread of those readings
as its band: ``data/desktop_hold.json``, written by ``research/desktop_hold.py`` from
``research/data/desktop_hold.json`` (each reading with its quote and source).
"""

from __future__ import annotations

from functools import cache

import msgspec

from .data import data_file

__all__ = ["DesktopHold", "desktop_hold", "hold_basis"]


class DesktopHold(msgspec.Struct, frozen=True):
    """One kind of desktop session's hold, from its published readings."""

    measurements: int
    sources: int
    """Distinct published sources (threads, pages) among the readings."""
    typical_bytes: int
    """The readings' median: the memory in use an answer assumes."""
    low_bytes: int
    high_bytes: int
    """The split-conformal band of the readings at 90% (their extremes when they are too few
    for its ranks)."""
    coverage: float
    """The share of new desktops the band holds, as its readings guarantee (with few readings
    the band is their range: (n - 1) / (n + 1))."""
    what: str
    """The session in words (``a Windows desktop (WDDM: native, WSL2 or Docker Desktop)``)."""


class DesktopHolds(msgspec.Struct, frozen=True):
    schema: str
    source: str
    sessions: dict[str, DesktopHold]


@cache
def _holds() -> DesktopHolds:
    return data_file("desktop_hold.json", DesktopHolds)


def desktop_hold(session: str) -> DesktopHold:
    """The hold of a ``windows`` or ``linux`` desktop session."""
    return _holds().sessions[session]


def hold_basis(session: str) -> str:
    """Where an assumed hold comes from, for the answer."""
    h = desktop_hold(session)
    gib = 1 << 30
    return (
        f"{h.typical_bytes / gib:.2f} GiB assumed held by {h.what}: the median of "
        f"{h.measurements} published nvidia-smi readings ({h.sources} sources), which lie "
        f"between {h.low_bytes / gib:.2f} and {h.high_bytes / gib:.2f} GiB (a new desktop "
        f"inside with probability {100 * h.coverage:.0f}%; {_holds().source}); give "
        "device.memory_in_use_bytes, nvidia-smi's used memory before the workload starts, to "
        "replace it"
    )
