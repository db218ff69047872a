"""Replay a recorded trace through the caching-allocator model (the loop the analytic walk
replays with too, :func:`vrambudget.core.allocator.replay.replay_events`): peaks, the
components live at the peak, and a per-phase timeline. Pure Python (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from vrambudget.core.allocator import SegmentOrder
from vrambudget.core.allocator.replay import replay_events
from vrambudget.workloads.marks import HOST

from .events import Trace

__all__ = ["Replay", "replay"]

_TOP_PARTS = 6


@dataclass(frozen=True, slots=True)
class Replay:
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_inactive_split_bytes: int
    """The most bytes held in free parts of split segments at once (fragmentation)."""
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


def replay(
    trace: Trace, *, expandable_segments: bool = False, segment_order: SegmentOrder = "falling"
) -> Replay:
    tags = trace.tags
    r = replay_events(
        trace.events,
        skip={h for h, tag in tags.items() if tag == HOST},
        tags=tags,
        expandable_segments=expandable_segments,
        segment_order=segment_order,
    )
    components: dict[str, int] = {}
    by_part: dict[str, dict[str, int]] = {}
    for handle, nbytes in r.live.items():
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
    peak_phase_index = trace.events[r.peak_index][3] if trace.events else 0
    iteration, phase = trace.phases[peak_phase_index]
    timeline = tuple(
        (trace.phases[p][0], trace.phases[p][1], a, rs) for p, (a, rs) in sorted(r.phases.items())
    )
    return Replay(
        peak_allocated_bytes=r.stats.peak_allocated_bytes,
        peak_reserved_bytes=r.stats.peak_reserved_bytes,
        peak_inactive_split_bytes=r.stats.peak_inactive_split_bytes,
        peak_phase=phase,
        peak_iteration=iteration,
        components=components,
        parts=parts,
        timeline=timeline,
        num_events=r.num_events,
        num_alloc_retries=r.stats.num_alloc_retries,
        component_peaks=r.tag_peaks,
    )


def _module_kind(module: str | None) -> str:
    """``layers.17`` -> ``decoder layers``; saved tensors made in backward have no module."""
    if module is None:
        return "backward and other temporaries"
    if module.startswith("layers."):
        return "layers (saved tensors and temporaries)"
    return module
