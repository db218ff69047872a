"""Headroom: the safety margin kept free on top of the estimate.

Shown in answers::

    max(ceil(fraction x device subtotal), min_bytes)

``fraction`` is the caller's ``headroom.fraction``, or by default the one that reaches the
high end of the answer's error band (:mod:`vrambudget.core.bands`).
"""

from __future__ import annotations

from ..spec import Headroom

__all__ = ["FORMULA", "SOURCE", "headroom", "headroom_bytes"]

FORMULA = "max(ceil(fraction x device subtotal), min_bytes)"
SOURCE = (
    "headroom.fraction as requested, or by default the high end of the error band "
    "(devices[].band: published measurements of the workload's class, docs/ACCURACY.md)"
)


def headroom(subtotal: int, fraction_ppm: int, min_bytes: int) -> int:
    """``max(ceil(subtotal x fraction), min_bytes)`` with the fraction in millionths (exact).

    Worked number: a 20,000,000,000 B subtotal with fraction 0.05 and min_bytes 1 GiB:
    max(1,000,000,000, 1,073,741,824) = 1,073,741,824 B."""
    room = -(-subtotal * fraction_ppm // 1_000_000)
    return room if room > min_bytes else min_bytes


def headroom_bytes(subtotal: int, h: Headroom) -> int:
    """The headroom of a resolved ``h`` (its fraction set:
    :func:`vrambudget.core.bands.resolve_headroom`)."""
    assert h.fraction is not None, "resolve_headroom() first"
    return headroom(subtotal, round(h.fraction * 1_000_000), h.min_bytes)
