"""The caching-allocator model against hand-computed cases from CUDACachingAllocator.cpp's rules,
and against a naive reference model (linear scans) on random streams."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrambudget.core.allocator import (
    AllocatorOutOfMemory,
    CachingAllocator,
    allocation_size,
    round_size,
)

KIB = 1 << 10

MIB = 1 << 20


# -- rounding and segment sizes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (0, 512),  # the C++ round_size(0); malloc never rounds a 0-byte request
        (1, 512),
        (511, 512),
        (512, 512),
        (513, 1024),  # next 512-byte granule
        (1000, 1024),
        (MIB, MIB),  # 1 MiB exactly: a multiple of 512, still the small pool
        (MIB + 1, MIB + 512),  # 1 MiB + 1: large pool, 512-byte granule
        (10 * MIB - 1, 10 * MIB),
        (10 * MIB + MIB // 2, 10 * MIB + MIB // 2),  # already a multiple of 512
    ],
)
def test_round_size(nbytes: int, expected: int) -> None:
    assert round_size(nbytes) == expected


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (0, 0),  # no block, nothing reserved
        (1, 2 * MIB),  # small pool: kSmallBuffer
        (MIB, 2 * MIB),  # rounded 1 MiB is still <= kSmallSize
        (MIB + 1, 20 * MIB),  # large, below kMinLargeAlloc: kLargeBuffer
        (10 * MIB - 512, 20 * MIB),  # rounded size 10 MiB - 512 < 10 MiB
        (10 * MIB - 1, 10 * MIB),  # rounds to exactly 10 MiB, not < kMinLargeAlloc: 2 MiB round
        (10 * MIB, 10 * MIB),
        (10 * MIB + 1, 12 * MIB),  # ceil to kRoundLarge
        (10 * MIB + MIB // 2, 12 * MIB),
        (19 * MIB, 20 * MIB),
        (100 * MIB + 1, 102 * MIB),
    ],
)
def test_allocation_size(nbytes: int, expected: int) -> None:
    assert allocation_size(nbytes) == expected


def test_roundup_power2_divisions() -> None:
    # 4 divisions: 5 MiB + 1 lies in [4, 8) MiB, steps of 1 MiB -> 6 MiB.
    assert round_size(5 * MIB + 1, roundup_power2_divisions=4) == 6 * MIB
    # 2 divisions: 1.1 MiB in [1, 2) MiB, steps of 512 KiB -> 1.5 MiB.
    assert round_size(MIB + 100 * KIB, roundup_power2_divisions=2) == MIB + 512 * KIB
    # Powers of two stay; sizes <= 512 * divisions keep the 512 granule (1200 -> 1536).
    assert round_size(4 * MIB, roundup_power2_divisions=4) == 4 * MIB
    assert round_size(1200, roundup_power2_divisions=4) == 1536
    # Per interval: only [4, 8) MiB (index 2) divides by 4.
    per_interval = [0, 0, 4] + [0] * 13
    assert round_size(5 * MIB + 1, roundup_power2_divisions=per_interval) == 6 * MIB
    assert round_size(MIB + 100 * KIB, roundup_power2_divisions=per_interval) == MIB + 100 * KIB
    with pytest.raises(ValueError):
        round_size(1, roundup_power2_divisions=3)
    allocator = CachingAllocator(roundup_power2_divisions=4)
    assert allocator.malloc(1, 5 * MIB + 1) == 6 * MIB  # 6 MiB < 10 MiB: a 20 MiB segment
    assert allocator.reserved_bytes == 20 * MIB


# -- pools, splitting, best fit ------------------------------------------------------------------


def test_small_requests_pack_into_2_mib_segments() -> None:
    allocator = CachingAllocator()
    for handle in range(4):
        assert allocator.malloc(handle, 512 * KIB) == 512 * KIB
    stats = allocator.stats()
    # 4 x 512 KiB fill one 2 MiB segment; the last one fits exactly (no split).
    assert (stats.allocated_bytes, stats.reserved_bytes) == (2 * MIB, 2 * MIB)
    assert stats.num_segments == 1
    assert stats.inactive_split_bytes == 0
    assert stats.peak_inactive_split_bytes == 1536 * KIB  # after the first: 2 MiB - 512 KiB free
    allocator.malloc(4, 512 * KIB)  # a 5th needs a second segment
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_segments) == (4 * MIB, 2)
    assert stats.inactive_split_bytes == 1536 * KIB


def test_small_pool_splits_down_to_512_bytes() -> None:
    allocator = CachingAllocator()
    assert allocator.malloc(1, MIB) == MIB  # 2 MiB segment, 1 MiB left (>= 512): split
    assert allocator.malloc(2, MIB - 512) == MIB - 512  # 512 bytes left: still split
    assert allocator.stats().inactive_split_bytes == 512
    assert allocator.malloc(3, 1) == 512  # the last 512 bytes: exact fit
    assert allocator.reserved_bytes == 2 * MIB
    assert allocator.allocated_bytes == 2 * MIB
    assert allocator.stats().requested_bytes == MIB + MIB - 512 + 1


def test_mid_size_request_reserves_20_mib_and_shares_it() -> None:
    allocator = CachingAllocator()
    assert allocator.malloc(1, 1536 * KIB) == 1536 * KIB  # 20 MiB segment, 18.5 MiB left: split
    assert allocator.reserved_bytes == 20 * MIB
    assert allocator.stats().inactive_split_bytes == 20 * MIB - 1536 * KIB
    assert allocator.malloc(2, 1536 * KIB) == 1536 * KIB  # reuses the remainder
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_segments) == (20 * MIB, 1)
    assert stats.allocated_bytes == 3 * MIB
    assert stats.inactive_split_bytes == 17 * MIB


def test_large_split_needs_more_than_1_mib_left() -> None:
    allocator = CachingAllocator()
    # 10.5 MiB -> 12 MiB segment; 1.5 MiB left > kSmallSize: split.
    assert allocator.malloc(1, 10 * MIB + 512 * KIB) == 10 * MIB + 512 * KIB
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.allocated_bytes) == (12 * MIB, 10 * MIB + 512 * KIB)
    assert stats.inactive_split_bytes == 1536 * KIB
    # 11 MiB -> 12 MiB segment; 1 MiB left is not > 1 MiB: the whole block is handed out and
    # allocated_bytes counts block->size (alloc_found_block), requested_bytes the 11 MiB.
    assert allocator.malloc(2, 11 * MIB) == 12 * MIB
    stats = allocator.stats()
    assert stats.allocated_bytes == 10 * MIB + 512 * KIB + 12 * MIB
    assert stats.requested_bytes == 10 * MIB + 512 * KIB + 11 * MIB
    assert stats.reserved_bytes == 24 * MIB
    # 19 MiB -> 20 MiB segment (kRoundLarge), 1 MiB left: unsplit.
    assert allocator.malloc(3, 19 * MIB) == 20 * MIB


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    allocator = CachingAllocator()
    sizes = {1: 12 * MIB, 2: 16 * MIB, 3: 14 * MIB}
    for handle, size in sizes.items():
        assert allocator.malloc(handle, size) == size  # exact 2 MiB multiples: one segment each
    for handle in sizes:
        allocator.free(handle)
    assert allocator.reserved_bytes == 42 * MIB  # 12 + 16 + 14, all cached
    # 13 MiB: 14 MiB is the smallest fit; 1 MiB left is not split off.
    assert allocator.malloc(4, 13 * MIB) == 14 * MIB
    assert allocator.malloc(5, 11 * MIB) == 12 * MIB
    assert allocator.malloc(6, 15 * MIB) == 16 * MIB
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_segments) == (42 * MIB, 3)


@pytest.mark.parametrize(
    ("order", "reserved_mib", "segments"), [("falling", 60, 2), ("rising", 100, 3)]
)
def test_ties_between_equal_blocks_go_to_the_lower_address(
    order: str, reserved_mib: int, segments: int
) -> None:
    """Two free 20 MiB blocks: the rest of a split 40 MiB segment S1 and a whole 20 MiB
    segment S2 made after it. Best fit takes the lower address; with falling addresses (the
    driver's, research/allocator_addresses.py) that is S2, so S1 merges back whole when its
    other half is freed and a 40 MiB request fits in it. With rising ones it is S1's rest, and
    the 40 MiB request needs a third segment."""
    allocator = CachingAllocator(segment_order=order)  # type: ignore[arg-type]
    allocator.malloc(1, 40 * MIB)  # S1
    allocator.free(1)
    allocator.malloc(2, 20 * MIB)  # S1's first half; the second half stays free
    allocator.malloc(3, 20 * MIB)  # S1's second half
    allocator.malloc(4, 20 * MIB)  # S2: nothing cached is free
    allocator.free(3)
    allocator.free(4)  # free: S1's second half and S2, 20 MiB each
    allocator.malloc(5, 20 * MIB)  # the tie
    allocator.free(2)
    allocator.malloc(6, 40 * MIB)
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_segments) == (reserved_mib * MIB, segments)
    assert stats.allocated_bytes == 60 * MIB


def test_frees_merge_neighbours_and_the_merged_block_is_reused() -> None:
    allocator = CachingAllocator()
    for handle in (1, 2, 3):
        assert allocator.malloc(handle, 4 * MIB) == 4 * MIB  # one 20 MiB segment, split
    # 8 MiB are left; 7 MiB leave 1 MiB, not split: the 4th holds the 8 MiB block.
    assert allocator.malloc(4, 7 * MIB) == 8 * MIB
    assert allocator.stats().inactive_split_bytes == 0
    allocator.free(1)
    assert allocator.stats().inactive_split_bytes == 4 * MIB
    allocator.free(2)  # merges with the free block before it: one 8 MiB block
    assert allocator.stats().inactive_split_bytes == 8 * MIB
    # 7 MiB fits only the merged block; no new segment.
    assert allocator.malloc(5, 7 * MIB) == 8 * MIB
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_segments) == (20 * MIB, 1)
    assert stats.inactive_split_bytes == 0
    for handle in (3, 4, 5):
        allocator.free(handle)
    # Everything merged back into the unsplit segment: not "inactive split" any more.
    stats = allocator.stats()
    assert (stats.allocated_bytes, stats.inactive_split_bytes) == (0, 0)
    assert stats.reserved_bytes == 20 * MIB
    allocator.empty_cache()
    assert allocator.reserved_bytes == 0


def test_fragmentation_reserves_more_than_is_allocated() -> None:
    allocator = CachingAllocator()
    for handle in range(10):
        allocator.malloc(handle, 2 * MIB)  # 10 x 2 MiB tile one 20 MiB segment
    assert allocator.stats().num_segments == 1
    for handle in range(0, 10, 2):
        allocator.free(handle)  # 5 free 2 MiB holes, none adjacent
    stats = allocator.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.inactive_split_bytes) == (
        10 * MIB,
        20 * MIB,
        10 * MIB,
    )
    allocator.malloc(10, 3 * MIB)  # 10 MiB are free, but no hole holds 3 MiB: a new segment
    assert allocator.allocated_bytes == 13 * MIB
    assert allocator.reserved_bytes == 40 * MIB
    allocator.empty_cache()  # both segments hold live blocks: nothing to release
    assert allocator.reserved_bytes == 40 * MIB


def test_empty_cache_releases_only_wholly_free_segments() -> None:
    allocator = CachingAllocator()
    allocator.malloc(1, 1536 * KIB)  # 20 MiB segment, partly used
    allocator.malloc(2, 24 * MIB)  # its own 24 MiB segment (the 18.5 MiB remainder is too small)
    allocator.malloc(3, 512 * KIB)  # 2 MiB small segment
    allocator.free(2)
    allocator.free(3)
    assert allocator.reserved_bytes == 46 * MIB
    allocator.empty_cache()
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_segments) == (20 * MIB, 1)
    assert stats.inactive_split_bytes == 20 * MIB - 1536 * KIB  # the split remainder stays
    assert stats.peak_reserved_bytes == 46 * MIB


# -- capacity: retry and out of memory ---------------------------------------------------------


def test_capacity_frees_the_cache_then_retries_then_raises() -> None:
    allocator = CachingAllocator(capacity_bytes=40 * MIB)
    allocator.malloc(1, 12 * MIB)
    allocator.free(1)  # 12 MiB cached
    # 12 + 30 > 40: release_cached_blocks drops the cached 12 MiB, the retry succeeds.
    assert allocator.malloc(2, 30 * MIB) == 30 * MIB
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_alloc_retries, stats.num_ooms) == (30 * MIB, 1, 0)
    # 30 + 12 > 40 and nothing is cached: the retry fails too.
    with pytest.raises(AllocatorOutOfMemory) as caught:
        allocator.malloc(3, 12 * MIB - 5)
    oom = caught.value
    assert oom.requested_bytes == 12 * MIB - 5
    assert oom.allocation_bytes == 12 * MIB
    assert (oom.allocated_bytes, oom.reserved_bytes) == (30 * MIB, 30 * MIB)
    assert oom.capacity_bytes == 40 * MIB
    stats = allocator.stats()
    assert (stats.num_alloc_retries, stats.num_ooms, stats.allocated_bytes) == (2, 1, 30 * MIB)
    with pytest.raises(AllocatorOutOfMemory):
        allocator.malloc(3, 5 * MIB)  # a 5 MiB request needs kLargeBuffer: 30 + 20 > 40
    stats = allocator.stats()
    assert (stats.num_alloc_retries, stats.num_ooms) == (3, 2)


def test_a_cached_block_serves_before_any_release() -> None:
    allocator = CachingAllocator(capacity_bytes=40 * MIB)
    allocator.malloc(1, 30 * MIB)
    with pytest.raises(AllocatorOutOfMemory):
        allocator.malloc(2, 5 * MIB)  # needs a 20 MiB segment: 30 + 20 > 40
    allocator.free(1)
    # The cached 30 MiB block fits (get_free_block comes first) and is split: no release.
    assert allocator.malloc(2, 5 * MIB) == 5 * MIB
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_alloc_retries, stats.num_ooms) == (30 * MIB, 1, 1)
    assert stats.inactive_split_bytes == 25 * MIB


def test_max_split_size_oversize_rules() -> None:
    allocator = CachingAllocator(max_split_size_bytes=20 * MIB)
    assert allocator.malloc(1, 40 * MIB) == 40 * MIB
    allocator.free(1)
    # 10 MiB < max_split: an oversize cached block is not handed out; a new segment is made.
    assert allocator.malloc(2, 10 * MIB) == 10 * MIB
    assert allocator.reserved_bytes == 50 * MIB
    # 30 MiB >= max_split may take the 40 MiB block (within kLargeBuffer), unsplit.
    assert allocator.malloc(3, 30 * MIB) == 40 * MIB
    allocator.free(3)
    # 20 MiB >= max_split, but the 40 MiB block is >= 20 + kLargeBuffer: a new segment.
    assert allocator.malloc(4, 20 * MIB) == 20 * MIB
    assert allocator.reserved_bytes == 70 * MIB
    allocator.free(4)
    # 19.5 MiB < max_split: the cached 20 MiB block is itself oversize (>= max_split), so another
    # 20 MiB segment is made; 0.5 MiB left: unsplit.
    assert allocator.malloc(5, 19 * MIB + 512 * KIB) == 20 * MIB
    assert allocator.reserved_bytes == 90 * MIB
    # Without the option, the 40 MiB block would have been split for 10 MiB.
    plain = CachingAllocator()
    plain.malloc(1, 40 * MIB)
    plain.free(1)
    assert plain.malloc(2, 10 * MIB) == 10 * MIB
    assert (plain.reserved_bytes, plain.stats().inactive_split_bytes) == (40 * MIB, 30 * MIB)


def test_max_split_size_releases_oversize_blocks_without_counting_a_retry() -> None:
    allocator = CachingAllocator(max_split_size_bytes=20 * MIB, capacity_bytes=45 * MIB)
    allocator.malloc(1, 40 * MIB)
    allocator.free(1)
    # 40 + 10 > 45; release_available_cached_blocks frees the oversize 40 MiB block and
    # alloc_block is retried with isRetry=false: num_alloc_retries stays 0.
    assert allocator.malloc(2, 10 * MIB) == 10 * MIB
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_alloc_retries, stats.num_segments) == (10 * MIB, 0, 1)


def test_max_split_size_is_validated() -> None:
    with pytest.raises(ValueError):
        CachingAllocator(max_split_size_bytes=10 * MIB)  # below kLargeBuffer
    with pytest.raises(ValueError):
        CachingAllocator(max_split_size_bytes=30 * MIB + 1)  # the option is whole MB


# -- stats bookkeeping --------------------------------------------------------------------------


def test_peaks_and_reset_peak_stats() -> None:
    allocator = CachingAllocator()
    allocator.malloc(1, 12 * MIB)
    allocator.malloc(2, 14 * MIB)
    allocator.free(1)
    stats = allocator.stats()
    assert (stats.allocated_bytes, stats.peak_allocated_bytes) == (14 * MIB, 26 * MIB)
    assert (stats.reserved_bytes, stats.peak_reserved_bytes) == (26 * MIB, 26 * MIB)
    allocator.empty_cache()
    allocator.reset_peak_stats()
    stats = allocator.stats()
    assert (stats.peak_allocated_bytes, stats.peak_reserved_bytes) == (14 * MIB, 14 * MIB)
    assert stats.peak_requested_bytes == 14 * MIB
    assert (stats.num_allocs, stats.num_frees) == (2, 1)  # accumulated counters stay
    allocator.malloc(3, MIB)  # small pool: a 2 MiB segment
    stats = allocator.stats()
    assert (stats.peak_allocated_bytes, stats.peak_reserved_bytes) == (15 * MIB, 16 * MIB)


def test_zero_byte_requests_get_no_block() -> None:
    allocator = CachingAllocator()
    assert allocator.malloc(1, 0) == 0
    stats = allocator.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.num_allocs) == (0, 0, 0)
    allocator.free(1)
    assert allocator.stats().num_frees == 0


def test_bad_handles() -> None:
    allocator = CachingAllocator()
    allocator.malloc(1, 100)
    with pytest.raises(ValueError):
        allocator.malloc(1, 100)
    with pytest.raises(KeyError):
        allocator.free(2)
    with pytest.raises(ValueError):
        allocator.malloc(3, -1)
    allocator.free(1)
    with pytest.raises(KeyError):
        allocator.free(1)


# -- expandable segments ---------------------------------------------------------------------------


def test_expandable_small_pool_maps_2_mib_pages() -> None:
    allocator = CachingAllocator(expandable_segments=True)
    for handle in range(4):
        allocator.malloc(handle, 512 * KIB)
    assert allocator.reserved_bytes == 2 * MIB  # one 2 MiB page
    allocator.malloc(4, 512 * KIB)
    stats = allocator.stats()
    assert stats.reserved_bytes == 4 * MIB  # a second page, mapped after the first
    # The source counts no "segment" and no inactive_split for expandable segments.
    assert (stats.num_segments, stats.inactive_split_bytes) == (0, 0)
    assert stats.peak_inactive_split_bytes == 0


def test_expandable_large_pool_grows_by_20_mib_pages() -> None:
    allocator = CachingAllocator(expandable_segments=True)
    assert allocator.malloc(1, 1536 * KIB) == 1536 * KIB  # maps one 20 MiB page
    assert allocator.reserved_bytes == 20 * MIB
    allocator.free(1)
    allocator.empty_cache()
    assert allocator.reserved_bytes == 0
    # 30 MiB maps two pages (40 MiB); the 10 MiB left is split off (>= 512 B suffices).
    assert allocator.malloc(2, 30 * MIB) == 30 * MIB
    assert allocator.reserved_bytes == 40 * MIB
    # 15 MiB: the free 10 MiB at the end grows by one more page into 30 MiB.
    assert allocator.malloc(3, 15 * MIB) == 15 * MIB
    assert allocator.reserved_bytes == 60 * MIB
    # 15 MiB remain free at the end: a 14 MiB request fits without mapping.
    assert allocator.malloc(4, 14 * MIB) == 14 * MIB
    assert allocator.reserved_bytes == 60 * MIB
    assert allocator.allocated_bytes == 59 * MIB


def test_expandable_growth_counts_the_free_block_before_the_unmapped_tail() -> None:
    allocator = CachingAllocator(expandable_segments=True)
    allocator.malloc(1, 30 * MIB)  # pages [0, 40): A = [0, 30), free [30, 40)
    # 25 MiB: find_expandable_block starts at the free 10 MiB before the tail, so only 15 MiB
    # more are needed: one 20 MiB page, not the two that 25 MiB alone would take.
    assert allocator.malloc(2, 25 * MIB) == 25 * MIB
    assert allocator.reserved_bytes == 60 * MIB


def test_expandable_unmaps_free_pages_and_refills_the_gap_first() -> None:
    allocator = CachingAllocator(expandable_segments=True)
    allocator.malloc(1, 30 * MIB)  # pages [0, 40): A = [0, 30), free [30, 40)
    allocator.malloc(2, 15 * MIB)  # maps [40, 60): B = [30, 45), free [45, 60)
    allocator.free(1)  # free [0, 30)
    allocator.empty_cache()
    # Page [0, 20) is wholly free and unmapped; [20, 30) and [45, 60) hold parts of pages that
    # B also uses, so they stay mapped.
    assert allocator.reserved_bytes == 40 * MIB
    # 25 MiB: no free block is big enough; the lowest unmapped range plus the free 10 MiB after
    # it has room, so page [0, 20) is mapped again instead of growing the end.
    assert allocator.malloc(3, 25 * MIB) == 25 * MIB
    assert allocator.reserved_bytes == 60 * MIB
    assert allocator.stats().peak_reserved_bytes == 60 * MIB
    for handle in (2, 3):
        allocator.free(handle)
    allocator.empty_cache()
    assert allocator.reserved_bytes == 0


def test_expandable_best_fit_ranks_blocks_by_what_they_can_grow_to() -> None:
    allocator = CachingAllocator(expandable_segments=True)
    allocator.malloc(1, 12 * MIB)  # page [0, 20): A = [0, 12), free [12, 20)
    allocator.malloc(2, 8 * MIB)  # exact fit: B = [12, 20)
    allocator.malloc(3, 10 * MIB)  # page [20, 40): C = [20, 30), free X = [30, 40) + tail
    allocator.free(1)  # free Y = [0, 12): 12 MiB, no unmapped tail
    assert allocator.reserved_bytes == 40 * MIB
    # 9 MiB: X (10 MiB) is the smallest fit by size, but it can grow to the whole unmapped tail,
    # so get_free_block steps on to Y (12 MiB), whose expandable size is smaller.
    allocator.malloc(4, 9 * MIB)  # Y -> [0, 9) + free [9, 12)
    # X is still 10 MiB: an 11 MiB request must grow X by a page (had X been used, Y would fit).
    allocator.malloc(5, 11 * MIB)
    assert allocator.reserved_bytes == 60 * MIB


def test_expandable_capacity_counts_retries_and_ooms() -> None:
    allocator = CachingAllocator(expandable_segments=True, capacity_bytes=50 * MIB)
    allocator.malloc(1, 30 * MIB)  # 40 MiB mapped
    allocator.free(1)
    allocator.malloc(2, 1536 * KIB)  # served by the free 40 MiB block: no capacity check
    assert allocator.reserved_bytes == 40 * MIB
    allocator.free(2)
    # 44 MiB: the free block is 40 MiB; 40 + 44 > 50, so the cache is unmapped (all 40 MiB) and
    # the retry maps three pages (60 MiB): the check used get_allocation_size (44 MiB), not the
    # 20 MiB pages, so reserved passes the capacity, as in the source.
    assert allocator.malloc(3, 44 * MIB) == 44 * MIB
    stats = allocator.stats()
    assert (stats.reserved_bytes, stats.num_alloc_retries, stats.num_ooms) == (60 * MIB, 1, 0)
    with pytest.raises(AllocatorOutOfMemory):
        allocator.malloc(4, 30 * MIB)  # the 16 MiB left is too small; 60 + 30 > 50
    assert allocator.stats().num_ooms == 1


# -- random streams: a naive reference and invariants -------------------------------------------


class _Reference:
    """A linear-scan restatement of the native rules, independent of the model's bisect lists.

    Segments are lists of [offset, size, allocated] blocks; a free block's address order is
    (newest segment first, offset): the model places each new segment below the last one.
    """

    def __init__(self, capacity: int | None, max_split: int | None) -> None:
        self.capacity = capacity
        self.max_split = max_split
        self.segments: dict[int, tuple[bool, list[list[int]]]] = {}
        self.next_segment = 0
        self.live: dict[int, tuple[int, int, int]] = {}  # handle -> (segment, offset, requested)
        self.retries = self.ooms = 0
        self.peak_allocated = self.peak_reserved = self.peak_inactive = 0

    def reserved(self) -> int:
        return sum(sum(b[1] for b in blocks) for _, blocks in self.segments.values())

    def allocated(self) -> int:
        return sum(b[1] for _, blocks in self.segments.values() for b in blocks if b[2])

    def inactive(self) -> int:
        return sum(
            b[1]
            for _, blocks in self.segments.values()
            if len(blocks) > 1
            for b in blocks
            if not b[2]
        )

    def free_blocks(self, small: bool) -> list[tuple[int, int, int]]:
        return sorted(
            (
                (b[1], seg, b[0])
                for seg, (is_small, blocks) in self.segments.items()
                if is_small == small
                for b in blocks
                if not b[2]
            ),
            key=lambda b: (b[0], -b[1], b[2]),
        )

    def release(self, seg: int) -> None:
        assert len(self.segments[seg][1]) == 1
        del self.segments[seg]

    def new_segment(self, small: bool, alloc: int, is_retry: bool) -> int | None:
        if is_retry:
            self.retries += 1
        if self.capacity is not None and self.reserved() + alloc > self.capacity:
            return None
        seg = self.next_segment
        self.next_segment += 1
        self.segments[seg] = (small, [[0, alloc, 0]])
        return seg

    def release_available(self, small: bool, size: int) -> bool:
        if self.max_split is None:
            return False
        target = max(size, self.max_split)
        blocks = self.free_blocks(small)
        fits = [b for b in blocks if b[0] >= target]
        if fits:
            self.release(fits[0][1])
            return True
        released = 0
        for bsize, seg, _ in reversed(blocks):
            if released >= target or bsize < self.max_split:
                break
            released += bsize
            self.release(seg)
        return released >= target

    def empty_cache(self) -> None:
        for seg in [s for s, (_, blocks) in self.segments.items() if len(blocks) == 1]:
            if not self.segments[seg][1][0][2]:
                del self.segments[seg]
        self.note_peaks()

    def malloc(self, handle: int, nbytes: int) -> int:
        if nbytes == 0:
            self.live[handle] = (-1, 0, 0)
            return 0
        size = round_size(nbytes)
        small = size <= MIB
        alloc = allocation_size(nbytes)
        ms = self.max_split
        found: tuple[int, int] | None = None
        fits = [b for b in self.free_blocks(small) if b[0] >= size]
        if fits:
            bsize, seg, off = fits[0]
            oversize = ms is not None and (
                (size < ms and bsize >= ms) or (size >= ms and bsize >= size + 20 * MIB)
            )
            if not oversize:
                found = (seg, off)
        if found is None:
            seg_new = self.new_segment(small, alloc, False)
            if seg_new is None and self.release_available(small, size):
                seg_new = self.new_segment(small, alloc, False)
            if seg_new is None:
                self.empty_cache()
                seg_new = self.new_segment(small, alloc, True)
            if seg_new is None:
                self.ooms += 1
                raise AllocatorOutOfMemory(
                    requested_bytes=nbytes,
                    allocation_bytes=alloc,
                    allocated_bytes=0,
                    reserved_bytes=0,
                    capacity_bytes=self.capacity or 0,
                )
            found = (seg_new, 0)
        seg, off = found
        blocks = self.segments[seg][1]
        i = next(k for k, b in enumerate(blocks) if b[0] == off)
        remaining = blocks[i][1] - size
        split = remaining >= 512 if small else (ms is None or size < ms) and remaining > MIB
        if split:
            blocks.insert(i + 1, [off + size, remaining, 0])
            blocks[i][1] = size
        blocks[i][2] = 1
        self.live[handle] = (seg, off, nbytes)
        self.note_peaks()
        return blocks[i][1]

    def free(self, handle: int) -> None:
        seg, off, _ = self.live.pop(handle)
        if seg < 0:
            return
        blocks = self.segments[seg][1]
        i = next(k for k, b in enumerate(blocks) if b[0] == off)
        blocks[i][2] = 0
        if i + 1 < len(blocks) and not blocks[i + 1][2]:
            blocks[i][1] += blocks.pop(i + 1)[1]
        if i > 0 and not blocks[i - 1][2]:
            blocks[i - 1][1] += blocks.pop(i)[1]
        self.note_peaks()

    def note_peaks(self) -> None:
        self.peak_allocated = max(self.peak_allocated, self.allocated())
        self.peak_reserved = max(self.peak_reserved, self.reserved())
        self.peak_inactive = max(self.peak_inactive, self.inactive())


# Boundaries of the rules: pool and segment-size limits, and exact 2 MiB multiples, which make
# exact fits and blocks of equal size (address tie-breaks) and hit the max_split_size limits.
_BOUNDARY_SIZES = [
    0,
    1,
    512,
    513,
    MIB,
    MIB + 1,
    1536 * KIB,
    2 * MIB,
    10 * MIB - 1,
    10 * MIB,
    10 * MIB + 512 * KIB,
    11 * MIB,
    19 * MIB,
    19 * MIB + 512 * KIB,
    20 * MIB,
    21 * MIB,
    32 * MIB,
    40 * MIB,
    52 * MIB,
]

_SIZES = st.one_of(
    st.sampled_from(_BOUNDARY_SIZES),
    st.integers(1, 32).map(lambda n: n * 2 * MIB),
    st.integers(1, MIB),
    st.integers(MIB + 1, 12 * MIB),
    st.integers(12 * MIB, 64 * MIB),
)

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), _SIZES),
        st.tuples(st.just("free"), st.integers(0, 10**6)),
        st.tuples(st.just("empty_cache"), st.just(0)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(
    ops=_OPS,
    capacity=st.sampled_from([None, None, 64 * MIB, 150 * MIB]),
    max_split=st.sampled_from([None, None, 20 * MIB, 32 * MIB]),
)
def test_native_mode_matches_the_naive_reference(
    ops: list[tuple[str, int]], capacity: int | None, max_split: int | None
) -> None:
    _compare_with_reference(ops, capacity, max_split)


@pytest.mark.parametrize("capacity", [None, 96 * MIB, 400 * MIB])
@pytest.mark.parametrize("max_split", [None, 20 * MIB, 32 * MIB])
@pytest.mark.parametrize("seed", [0, 1])
def test_native_mode_matches_the_naive_reference_on_long_traces(
    seed: int, capacity: int | None, max_split: int | None
) -> None:
    rng = random.Random(seed)
    ops: list[tuple[str, int]] = []
    for _ in range(1500):
        roll = rng.random()
        if roll < 0.45:
            ops.append(("free", rng.randrange(10**6)))
        elif roll < 0.46:
            ops.append(("empty_cache", 0))
        else:
            kind = rng.randrange(4)
            if kind == 0:
                size = rng.choice(_BOUNDARY_SIZES)
            elif kind == 1:
                size = rng.randrange(1, 33) * 2 * MIB
            elif kind == 2:
                size = rng.randrange(1, MIB + 1)
            else:
                size = rng.randrange(MIB + 1, 64 * MIB)
            ops.append(("malloc", size))
    _compare_with_reference(ops, capacity, max_split)


def _compare_with_reference(
    ops: list[tuple[str, int]], capacity: int | None, max_split: int | None
) -> None:
    model = CachingAllocator(capacity_bytes=capacity, max_split_size_bytes=max_split)
    ref = _Reference(capacity, max_split)
    live: dict[int, tuple[int, int]] = {}  # handle -> (block size, requested)
    next_handle = 0
    for op, arg in ops:
        if op == "malloc":
            try:
                got = model.malloc(next_handle, arg)
            except AllocatorOutOfMemory:
                with pytest.raises(AllocatorOutOfMemory):
                    ref.malloc(next_handle, arg)
                continue
            assert got == ref.malloc(next_handle, arg)
            live[next_handle] = (got, arg)
            next_handle += 1
        elif op == "free" and live:
            handle = sorted(live)[arg % len(live)]
            del live[handle]
            model.free(handle)
            ref.free(handle)
        elif op == "empty_cache":
            model.empty_cache()
            ref.empty_cache()
        stats = model.stats()
        assert stats.allocated_bytes == ref.allocated() == sum(s for s, _ in live.values())
        assert stats.requested_bytes == sum(r for _, r in live.values())
        assert stats.reserved_bytes == ref.reserved()
        assert stats.inactive_split_bytes == ref.inactive()
        assert stats.num_segments == len(ref.segments)
        assert (stats.num_alloc_retries, stats.num_ooms) == (ref.retries, ref.ooms)
        assert stats.peak_allocated_bytes == ref.peak_allocated
        assert stats.peak_reserved_bytes == ref.peak_reserved
        assert stats.peak_inactive_split_bytes == ref.peak_inactive
        assert stats.allocated_bytes <= stats.reserved_bytes
        assert capacity is None or stats.reserved_bytes <= capacity
    model.empty_cache()
    stats = model.stats()
    # After a release only split segments remain, and all their free bytes are inactive_split.
    assert stats.inactive_split_bytes == stats.reserved_bytes - stats.allocated_bytes
    for handle in list(live):
        model.free(handle)
    model.empty_cache()
    stats = model.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.num_segments) == (0, 0, 0)
    assert (stats.requested_bytes, stats.inactive_split_bytes) == (0, 0)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS, capacity=st.sampled_from([None, None, 64 * MIB, 150 * MIB]))
def test_expandable_mode_invariants(ops: list[tuple[str, int]], capacity: int | None) -> None:
    model = CachingAllocator(expandable_segments=True, capacity_bytes=capacity)
    live: dict[int, tuple[int, int]] = {}
    next_handle = 0
    for op, arg in ops:
        if op == "malloc":
            before = model.stats()
            try:
                got = model.malloc(next_handle, arg)
            except AllocatorOutOfMemory:
                after = model.stats()
                assert after.allocated_bytes == before.allocated_bytes
                assert after.num_ooms == before.num_ooms + 1
                continue
            assert got == 0 if arg == 0 else got >= round_size(arg)
            live[next_handle] = (got, arg)
            next_handle += 1
        elif op == "free" and live:
            handle = sorted(live)[arg % len(live)]
            del live[handle]
            model.free(handle)
        elif op == "empty_cache":
            model.empty_cache()
        stats = model.stats()
        assert stats.allocated_bytes == sum(s for s, _ in live.values())
        assert stats.requested_bytes == sum(r for _, r in live.values())
        assert stats.allocated_bytes <= stats.reserved_bytes
        assert stats.reserved_bytes % (2 * MIB) == 0  # whole pages only
        assert (stats.num_segments, stats.inactive_split_bytes) == (0, 0)
        assert stats.peak_reserved_bytes >= stats.reserved_bytes
        assert stats.peak_allocated_bytes >= stats.allocated_bytes
    for handle in list(live):
        model.free(handle)
    model.empty_cache()
    stats = model.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.requested_bytes) == (0, 0, 0)
