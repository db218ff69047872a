"""The one replay loop (vrambudget/core/allocator/replay.py) both walking tiers read their
event streams with: the allocated peak, the phases' peaks, the tensors live at the peak and
each tag's peak, by hand."""

from __future__ import annotations

from vrambudget.core.allocator.replay import ALLOC, EMPTY_CACHE, FREE, replay_events
from vrambudget.core.units import MiB


def test_a_stream_by_hand() -> None:
    """4 MiB then 6 MiB (one 20 MiB segment, kLargeBuffer, split for both), the 4 MiB freed,
    2 MiB (from the freed block); the cache emptied (the segment is still in use: kept).
    Allocated peak 10 MiB after event 1 with both live; phase 0 (10 MiB, 20 MiB), phase 1
    (8 MiB, 20 MiB); the weights tag peaks at 4 MiB, activations at 6 + 2 = 8 MiB."""
    events = [
        (ALLOC, 1, 4 * MiB, 0),
        (ALLOC, 2, 6 * MiB, 0),
        (FREE, 1, 0, 1),
        (ALLOC, 3, 2 * MiB, 1),
        (EMPTY_CACHE, 0, 0, 1),
    ]
    r = replay_events(events, tags={1: "weights"})
    assert r.stats.peak_allocated_bytes == 10 * MiB
    assert r.stats.peak_reserved_bytes == 20 * MiB
    assert r.peak_index == 1
    assert r.live == {1: 4 * MiB, 2: 6 * MiB}
    assert r.phases == {0: (10 * MiB, 20 * MiB), 1: (8 * MiB, 20 * MiB)}
    assert r.tag_peaks == {"weights": 4 * MiB, "activations": 8 * MiB}
    assert r.num_events == 4


def test_skipped_handles_are_off_the_device() -> None:
    """Handle 2 (host memory) skipped: the peak is the 4 MiB alone, then 2 MiB."""
    events = [
        (ALLOC, 1, 4 * MiB, 0),
        (ALLOC, 2, 6 * MiB, 0),
        (FREE, 1, 0, 0),
        (ALLOC, 3, 2 * MiB, 0),
    ]
    r = replay_events(events, skip={2})
    assert r.stats.peak_allocated_bytes == 4 * MiB
    assert r.live == {1: 4 * MiB}
    assert r.tag_peaks == {}
    assert r.num_events == 3
