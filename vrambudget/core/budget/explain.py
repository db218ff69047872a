"""The words of an analytic budget: each line's formula and source (read from its component's
formula module) and input names, and the assembled device budget with its headroom and phases
(the workload side is :mod:`.inputs`)."""

from __future__ import annotations

from typing import Any

from ..bands import BandRule, band_of
from ..components import Component, Members
from ..formulas import TEXTS, allocator_overhead, communication_buffers
from ..formulas.cuda_context import KERNEL_IMAGES_SOURCE
from ..formulas.headroom import headroom as headroom_of
from ..memo import BoundedCache
from ..overheads import Overheads
from ..result import (
    CalibrationUse,
    DeviceBudget,
    Line,
    OverheadOrigin,
    Part,
    Phase,
)
from ..spec import (
    Headroom,
)

__all__ = ["NO_NAMES", "calibration_use", "constant_parts", "device_budget"]

C = Members  # the members as plain attributes (Component's read through a descriptor)
ORDER: tuple[Component, ...] = tuple(Component)
_INDEX: dict[Component, int] = {c: i for i, c in enumerate(ORDER)}  # a line's place
_HEADROOM_AT = _INDEX[C.HEADROOM]


def _sources(ov: Overheads) -> tuple[tuple[Component, str, str], ...]:
    """(component, formula, source) in vocabulary order for one device type (cached). The
    overhead lines name their origin: a calibration profile, or the built-in default's
    public source."""
    key = _text_key(ov)
    hit = _SOURCES.get(key)
    if hit is None:
        rows = []
        for c in ORDER:
            formula, source = TEXTS[c]
            if c is C.CUDA_CONTEXT:
                source = ov.cuda_context_source
                if ov.kernel_images_inference_bytes or ov.kernel_images_training_bytes:
                    source = f"{source}; {KERNEL_IMAGES_SOURCE}"
            elif c is C.RUNTIME_WORKSPACE:
                source = ov.workspace_source
            elif c is C.ALLOCATOR_OVERHEAD:
                source = allocator_overhead.source(ov.fragmentation_source)
            elif c is C.COMMUNICATION_BUFFERS:
                source = communication_buffers.source(ov.communication_source)
            rows.append((c, formula, source))
        hit = _SOURCES.put(key, tuple(rows))
    return hit


def _text_key(ov: Overheads) -> tuple[object, ...]:
    """What the explanation texts of ``ov`` depend on: a tuple of (interned) strings hashes in
    C, where hashing the dataclass would run Python code on every budget."""
    return (
        ov.cuda_context_source,
        bool(ov.kernel_images_inference_bytes or ov.kernel_images_training_bytes),
        ov.workspace_source,
        ov.fragmentation_source,
        ov.communication_source,
        ov.nccl_communicator_bytes is None,
        ov.profile,
        ov.profile_match,
    )


_SOURCES: BoundedCache[tuple[object, ...], tuple[tuple[Component, str, str], ...]] = BoundedCache(
    1024
)
NO_NAMES: dict[Component, tuple[str, ...]] = {}  # co-located lines name no single workload
_ROWS: BoundedCache[tuple[object, ...], tuple[tuple[Component, str, str, tuple[str, ...]], ...]] = (
    BoundedCache(1024)
)


def _rows(
    ov: Overheads, names: dict[Component, tuple[str, ...]]
) -> tuple[tuple[Component, str, str, tuple[str, ...]], ...]:
    """(component, formula, source, input names) per line, for one device type and workload
    kind (``names`` is one of the module-level ``INPUT_NAMES`` tables, so its id is stable)."""
    key = (
        ov.cuda_context_source,
        ov.workspace_source,
        ov.fragmentation_source,
        ov.communication_source,
        id(names),
    )
    hit = _ROWS.get(key)
    if hit is None:
        hit = _ROWS.put(key, tuple((c, f, src, names.get(c, ())) for c, f, src in _sources(ov)))
    return hit


def device_budget(
    label: str,
    stage: int | None,
    num_devices: int,
    peak: str,
    values: dict[Component, int],
    parts: dict[Component, Any],
    phases: tuple[tuple[str, int], ...],
    inputs: dict[str, Any],
    names: dict[Component, tuple[str, ...]],
    headroom: Headroom,
    ov: Overheads,
    transient: int | None = None,
    band: BandRule | None = None,
    counted: int = 0,
) -> DeviceBudget:
    """One device's explained budget; ``headroom`` resolved (its fraction set); ``counted``
    the floor of the band's low end (:func:`vrambudget.core.bands.band_of`)."""
    subtotal = sum(values.values())
    assert headroom.fraction is not None, "resolve_headroom() first"
    ppm, floor = round(headroom.fraction * 1_000_000), headroom.min_bytes
    room = headroom_of(subtotal, ppm, floor)
    inputs = {
        **inputs,
        "headroom_fraction": headroom.fraction,
        "headroom_min_bytes": floor,
        "subtotal_bytes": subtotal,
    }
    if transient is not None:
        inputs["largest_transient_bytes"] = transient
    get = values.get
    rows = _rows(ov, names)
    lines = [
        Line(c, get(c, 0), formula, used, source)
        if c not in parts
        else Line(c, get(c, 0), formula, used, source, _parts(parts[c]))
        for c, formula, source, used in rows
    ]
    _, formula, source, used = rows[_HEADROOM_AT]
    lines[_HEADROOM_AT] = Line(C.HEADROOM, room, formula, used, source)
    return DeviceBudget(
        label=label,
        pipeline_stage=stage,
        num_devices=num_devices,
        peak_phase=peak,
        lines=tuple(lines),
        total_bytes=subtotal + room,
        inputs=inputs,
        phases=tuple(
            [Phase(name=n, total_bytes=t + headroom_of(t, ppm, floor)) for n, t in phases]
        ),
        band=None if band is None else band_of(band, subtotal, counted),
    )


def _parts(p: Any) -> tuple[Part, ...]:
    """A line's parts: those of a tuple registered by :func:`constant_parts` built once."""
    if not p:
        return ()
    hit = _PARTS.get(id(p))
    if hit is not None and hit[0] is p:
        return hit[1]
    return tuple([Part(name=n, bytes=b) for n, b in p])


def constant_parts(p: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """``p``, whose line parts every budget that passes this same tuple shares (a stage's
    constant parts: the context's, the communication buffers')."""
    if p:
        _PARTS.put(id(p), (p, tuple([Part(name=n, bytes=b) for n, b in p])))  # holds p
    return p


_PARTS: BoundedCache[int, tuple[tuple[tuple[str, int], ...], tuple[Part, ...]]] = BoundedCache(1024)

_OVERHEAD_LINES = (
    C.CUDA_CONTEXT,
    C.RUNTIME_WORKSPACE,
    C.COMMUNICATION_BUFFERS,
    C.ALLOCATOR_OVERHEAD,
)


def calibration_use(ov: Overheads) -> CalibrationUse:
    """Which profile (or built-in default) each overhead line came from."""
    key = _text_key(ov)
    hit = _USES.get(key)
    if hit is None:
        from_profile = {
            C.CUDA_CONTEXT: ov.cuda_context_source.startswith("calibration profile"),
            C.RUNTIME_WORKSPACE: ov.workspace_source.startswith("calibration profile"),
            C.COMMUNICATION_BUFFERS: ov.nccl_communicator_bytes is not None,
            C.ALLOCATOR_OVERHEAD: "calibration profile" in ov.fragmentation_source,
        }
        sources = {c: src for c, _, src in _sources(ov)}
        hit = _USES.put(
            key,
            CalibrationUse(
                profile=ov.profile,
                matched_on=ov.profile_match,
                overheads=tuple(
                    OverheadOrigin(
                        component=c,
                        origin="profile" if from_profile[c] else "builtin",
                        profile=ov.profile if from_profile[c] else None,
                        source=sources[c],
                    )
                    for c in _OVERHEAD_LINES
                ),
            ),
        )
    return hit


_USES: BoundedCache[tuple[object, ...], CalibrationUse] = BoundedCache(1024)
