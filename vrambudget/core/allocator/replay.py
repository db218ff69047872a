"""An allocation event stream replayed through the allocator model: the stream both walking
tiers write (the analytic walk of an image-generation call, :mod:`vrambudget.core.diffusion.
walk`, and the trace tier's recorder, :mod:`vrambudget.trace.recorder`) and the one loop that
finds the allocated peak, each phase's peaks and the tensors live at the peak.

An event is ``(kind, handle, nbytes, phase index)``: ``ALLOC`` a tensor of ``nbytes``, ``FREE``
the handle's tensor, ``EMPTY_CACHE`` ``torch.cuda.empty_cache()`` (handle and bytes 0).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from .caching import CachingAllocator, SegmentOrder
from .stats import AllocatorStats

__all__ = ["ALLOC", "EMPTY_CACHE", "FREE", "Event", "Replayed", "replay_events"]

ALLOC, FREE, EMPTY_CACHE = 0, 1, 2

Event = tuple[int, int, int, int]
"""(kind, handle, nbytes, phase index)."""


@dataclass(frozen=True, slots=True)
class Replayed:
    stats: AllocatorStats
    peak_index: int
    """The event after which the allocated bytes were highest (0 for an empty stream)."""
    phases: dict[int, tuple[int, int]]
    """Phase index -> (the most bytes allocated, the most reserved) during it."""
    live: dict[int, int]
    """Handle -> requested bytes of each tensor live at the allocated peak."""
    tag_peaks: dict[str, int]
    """The most requested bytes each tag had live at any moment (with ``tags``)."""
    num_events: int
    """Allocations and frees replayed (skipped handles and cache releases not counted)."""


def replay_events(
    events: Sequence[Event],
    *,
    skip: Container[int] = (),
    tags: Mapping[int, str] | None = None,
    default_tag: str = "activations",
    expandable_segments: bool = False,
    segment_order: SegmentOrder = "falling",
) -> Replayed:
    """Replay ``events`` (``skip``: handles not on the device) through a
    :class:`~vrambudget.core.allocator.CachingAllocator` with default options (and
    ``expandable_segments``, ``segment_order``); with ``tags`` (handle -> tag, ``default_tag``
    otherwise) each tag's peak of live bytes is kept too."""
    alloc = CachingAllocator(expandable_segments=expandable_segments, segment_order=segment_order)
    best, best_index = -1, 0
    phases: dict[int, list[int]] = {}
    running: dict[str, int] = {}
    tag_peaks: dict[str, int] = {}
    sizes: dict[int, int] = {}
    n = 0
    for i, (kind, handle, nbytes, phase) in enumerate(events):
        if handle in skip:
            continue
        if kind == EMPTY_CACHE:
            alloc.empty_cache()
            continue
        n += 1
        if kind == ALLOC:
            alloc.malloc(handle, nbytes)
            if tags is not None:
                tag = tags.get(handle, default_tag)
                sizes[handle] = nbytes
                now = running[tag] = running.get(tag, 0) + nbytes
                if now > tag_peaks.get(tag, 0):
                    tag_peaks[tag] = now
        else:
            alloc.free(handle)
            if tags is not None:
                running[tags.get(handle, default_tag)] -= sizes.pop(handle)
        allocated, reserved = alloc.allocated_bytes, alloc.reserved_bytes
        if allocated > best:
            best, best_index = allocated, i
        slot = phases.get(phase)
        if slot is None:
            phases[phase] = [allocated, reserved]
        else:
            if allocated > slot[0]:
                slot[0] = allocated
            if reserved > slot[1]:
                slot[1] = reserved
    live: dict[int, int] = {}
    for kind, handle, nbytes, _ in events[: best_index + 1]:
        if handle in skip:
            continue
        if kind == ALLOC:
            live[handle] = nbytes
        elif kind == FREE:
            live.pop(handle, None)
    return Replayed(
        stats=alloc.stats(),
        peak_index=best_index,
        phases={p: (a, r) for p, (a, r) in phases.items()},
        live=live,
        tag_peaks=tag_peaks,
        num_events=n,
    )
