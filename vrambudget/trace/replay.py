"""Replay a recorded trace through the caching-allocator model: peaks, the components live at
the peak, and a per-phase timeline. Pure Python (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from vrambudget.core.allocator import CachingAllocator
from vrambudget.workloads.marks import HOST

from .events import ALLOC, EMPTY_CACHE, Trace

__all__ = ["Replay", "replay"]

_TOP_PARTS = 6


@dataclass(frozen=True, slots=True)
class Replay:
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_phase: str
    peak_iteration: int
    components: dict[str, int]
    """Bytes (as requested, unrounded) of each component's live storages at the allocated peak."""
    parts: dict[str, tuple[tuple[str, int], ...]]
    timeline: tuple[tuple[int, str, int, int], ...]
    """(iteration, phase, max allocated, max reserved) per phase occurrence."""
    num_events: int
    num_alloc_retries: int
    component_peaks: dict[str, int]
    """The largest live bytes each component reached at any moment of the run."""


def replay(trace: Trace, *, expandable_segments: bool = False) -> Replay:
    alloc = CachingAllocator(expandable_segments=expandable_segments)
    tags = trace.tags
    skipped = {h for h, tag in tags.items() if tag == HOST}
    best_allocated = -1
    best_index = 0
    per_phase: dict[int, list[int]] = {}
    running: dict[str, int] = {}
    component_peaks: dict[str, int] = {}
    sizes: dict[int, int] = {}
    n = 0
    for i, (kind, handle, nbytes, phase_index) in enumerate(trace.events):
        if handle in skipped:
            continue
        if kind == EMPTY_CACHE:
            alloc.empty_cache()
            continue
        n += 1
        tag = tags.get(handle, "activations")
        if kind == ALLOC:
            alloc.malloc(handle, nbytes)
            sizes[handle] = nbytes
            now = running[tag] = running.get(tag, 0) + nbytes
            if now > component_peaks.get(tag, 0):
                component_peaks[tag] = now
        else:
            alloc.free(handle)
            running[tag] -= sizes.pop(handle)
        allocated, reserved = alloc.allocated_bytes, alloc.reserved_bytes
        if allocated > best_allocated:
            best_allocated, best_index = allocated, i
        slot = per_phase.get(phase_index)
        if slot is None:
            per_phase[phase_index] = [allocated, reserved]
        else:
            slot[0] = max(slot[0], allocated)
            slot[1] = max(slot[1], reserved)
    stats = alloc.stats()
    live: dict[int, int] = {}
    for kind, handle, nbytes, _ in trace.events[: best_index + 1]:
        if handle in skipped:
            continue
        if kind == ALLOC:
            live[handle] = nbytes
        else:
            live.pop(handle, None)
    components: dict[str, int] = {}
    by_part: dict[str, dict[str, int]] = {}
    for handle, nbytes in live.items():
        tag = tags.get(handle, "activations")
        components[tag] = components.get(tag, 0) + nbytes
        label = trace.parts.get(handle) if tag in ("runtime_workspace",) else None
        if label is None and tag in (
            "activations",
            "logits",
            "optimizer_state",
            "runtime_workspace",
        ):
            label = _module_kind(trace.modules.get(handle))
            if tag == "optimizer_state":
                label = trace.parts.get(handle, "optimizer step temporaries")
        if label is not None:
            bucket = by_part.setdefault(tag, {})
            bucket[label] = bucket.get(label, 0) + nbytes
    parts: dict[str, tuple[tuple[str, int], ...]] = {}
    for tag, bucket in by_part.items():
        items = sorted(bucket.items(), key=lambda kv: -kv[1])
        if len(items) > _TOP_PARTS:
            rest = sum(b for _, b in items[_TOP_PARTS - 1 :])
            items = [*items[: _TOP_PARTS - 1], ("other", rest)]
        parts[tag] = tuple(items)
    peak_phase_index = trace.events[best_index][3] if trace.events else 0
    iteration, phase = trace.phases[peak_phase_index]
    timeline = tuple(
        (trace.phases[p][0], trace.phases[p][1], a, r) for p, (a, r) in sorted(per_phase.items())
    )
    return Replay(
        peak_allocated_bytes=stats.peak_allocated_bytes,
        peak_reserved_bytes=stats.peak_reserved_bytes,
        peak_phase=phase,
        peak_iteration=iteration,
        components=components,
        parts=parts,
        timeline=timeline,
        num_events=n,
        num_alloc_retries=stats.num_alloc_retries,
        component_peaks=component_peaks,
    )


def _module_kind(module: str | None) -> str:
    """``layers.17`` -> ``decoder layers``; saved tensors made in backward have no module."""
    if module is None:
        return "backward and other temporaries"
    if module.startswith("layers."):
        return "layers (saved tensors and temporaries)"
    return module
