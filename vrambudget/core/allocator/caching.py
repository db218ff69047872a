"""``DeviceCachingAllocator``: malloc (best fit, split, the malloc fallback chain), free, and
releasing cached segments (the model and its limits: :mod:`vrambudget.core.allocator`)."""

from __future__ import annotations

from bisect import bisect_left
from typing import Literal

from ..units import MiB
from .blocks import _KEY_SHIFT, _Block, _expandable_size, _Pool
from .expandable import _ExpandableSegments
from .sizes import (
    LARGE_BUFFER_BYTES,
    MIN_BLOCK_SIZE_BYTES,
    SMALL_SIZE_BYTES,
    Divisions,
    _get_allocation_size,
    _normalize_divisions,
    _round_size,
)
from .stats import AllocatorOutOfMemory, AllocatorStats

__all__ = ["CachingAllocator", "SegmentOrder"]

SegmentOrder = Literal["falling", "rising"]

_VA_BASE = 1 << 40  # first expandable range; nonzero so that no block sits at "null"
_SEGMENT_VA_TOP = 1 << 60
"""cudaMalloc segments are placed downward from here: each new segment ends where the previous
one began (see :mod:`vrambudget.core.allocator`, "Device addresses")."""
_DEFAULT_EXPANDABLE_VA_BYTES = 64 << 40


class CachingAllocator(_ExpandableSegments):
    """Replays mallocs and frees as ``DeviceCachingAllocator`` would on one device and stream.

    ``handle`` is the caller's id for an allocation (a storage in the trace); ``malloc`` returns
    the size of the block it got, which is what ``allocated_bytes`` counts. Options mirror
    ``PYTORCH_CUDA_ALLOC_CONF``: ``expandable_segments``, ``max_split_size_bytes``
    (``max_split_size_mb`` in bytes) and ``roundup_power2_divisions``; ``capacity_bytes`` is the
    limit ``set_per_process_memory_fraction`` sets (see :mod:`vrambudget.core.allocator`).
    ``segment_order``: where new cudaMalloc segments go, below the last one (``falling``, what
    the driver did on the measured runs) or above it (``rising``, kept for comparison).
    """

    def __init__(
        self,
        *,
        expandable_segments: bool = False,
        capacity_bytes: int | None = None,
        max_split_size_bytes: int | None = None,
        roundup_power2_divisions: Divisions = None,
        segment_order: SegmentOrder = "falling",
    ) -> None:
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"negative capacity {capacity_bytes}")
        if max_split_size_bytes is not None and (
            max_split_size_bytes < LARGE_BUFFER_BYTES or max_split_size_bytes % MiB
        ):
            # parseMaxSplitSize: the option is whole MB and not below kLargeBuffer.
            raise ValueError(
                "max_split_size_bytes must be a whole number of MiB and at least 20 MiB, "
                f"got {max_split_size_bytes}"
            )
        self._expandable = expandable_segments
        self._capacity = capacity_bytes
        self._max_split = max_split_size_bytes
        self._divisions = _normalize_divisions(roundup_power2_divisions)
        base_va = (
            _DEFAULT_EXPANDABLE_VA_BYTES
            if capacity_bytes is None
            else (capacity_bytes + capacity_bytes // 8)
        )
        self._expandable_va_bytes = max(base_va, LARGE_BUFFER_BYTES)
        self._small = _Pool(is_small=True)
        self._large = _Pool(is_small=False)
        self._live: dict[int, _Block | None] = {}
        self._next_va = _VA_BASE
        self._falling = segment_order == "falling"
        self._segment_va = _SEGMENT_VA_TOP if self._falling else _SEGMENT_VA_TOP >> 1
        self._allocated = self._peak_allocated = 0
        self._requested = self._peak_requested = 0
        self._reserved = self._peak_reserved = 0
        self._inactive = self._peak_inactive = 0
        self._segments = 0
        self._retries = self._ooms = self._allocs = self._frees = 0

    # -- public -------------------------------------------------------------------------------

    @property
    def allocated_bytes(self) -> int:
        return self._allocated

    @property
    def reserved_bytes(self) -> int:
        return self._reserved

    def stats(self) -> AllocatorStats:
        return AllocatorStats(
            allocated_bytes=self._allocated,
            peak_allocated_bytes=self._peak_allocated,
            requested_bytes=self._requested,
            peak_requested_bytes=self._peak_requested,
            reserved_bytes=self._reserved,
            peak_reserved_bytes=self._peak_reserved,
            inactive_split_bytes=self._inactive,
            peak_inactive_split_bytes=self._peak_inactive,
            num_segments=self._segments,
            num_alloc_retries=self._retries,
            num_ooms=self._ooms,
            num_allocs=self._allocs,
            num_frees=self._frees,
        )

    def reset_peak_stats(self) -> None:
        """``resetPeakStats``: every peak drops to its current value; counters stay."""
        self._peak_allocated = self._allocated
        self._peak_requested = self._requested
        self._peak_reserved = self._reserved
        self._peak_inactive = self._inactive

    def malloc(self, handle: int, nbytes: int) -> int:
        """``DeviceCachingAllocator::malloc``; returns the block size now held by ``handle``.

        A 0-byte request gets no block and touches no stat (``NativeCachingAllocator::allocate``
        skips malloc for size 0); its handle may still be freed.
        """
        if handle in self._live:
            raise ValueError(f"handle {handle!r} is already allocated")
        if nbytes < 0:
            raise ValueError(f"negative size {nbytes}")
        if nbytes == 0:
            self._live[handle] = None
            return 0
        size = _round_size(nbytes, self._divisions)
        pool = self._small if size <= SMALL_SIZE_BYTES else self._large  # get_pool
        alloc_size = _get_allocation_size(size)
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, size, alloc_size, is_retry=False)
            if block is None and self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(pool, size, alloc_size, is_retry=False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, size, alloc_size, is_retry=True)
            if block is None:
                self._ooms += 1
                assert self._capacity is not None  # only the capacity check fails
                raise AllocatorOutOfMemory(
                    requested_bytes=nbytes,
                    allocation_bytes=alloc_size,
                    allocated_bytes=self._allocated,
                    reserved_bytes=self._reserved,
                    capacity_bytes=self._capacity,
                )
        split = self._should_split(pool, block, size)
        block = self._alloc_found_block(pool, block, size, nbytes, split)
        self._live[handle] = block
        return block.size

    def free(self, handle: int) -> None:
        """``DeviceCachingAllocator::free``: the block goes back to its pool and merges."""
        try:
            block = self._live.pop(handle)
        except KeyError:
            raise KeyError(f"handle {handle!r} is not allocated") from None
        if block is None:
            return
        block.allocated = False
        self._allocated -= block.size
        self._frees += 1
        self._free_block(block.pool, block)

    def empty_cache(self) -> None:
        """``emptyCache`` -> ``release_cached_blocks``: return every wholly free segment/page."""
        self._release_cached_blocks()

    # -- allocation ----------------------------------------------------------------------------

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        """``get_free_block``: the smallest free block >= size (lower_bound), oversize rules."""
        keys = pool.keys
        i = bisect_left(keys, size << _KEY_SHIFT)
        n = len(keys)
        if i == n:
            return None
        by_key = pool.by_key
        block = by_key[keys[i]]
        if self._expandable:
            # Rank by the size the block could grow to; steps happen only from a block with an
            # unmapped tail (one per segment), so this walk is short.
            while i + 1 < n:
                nxt = by_key[keys[i + 1]]
                if _expandable_size(nxt) >= _expandable_size(block):
                    break
                i += 1
                block = nxt
        max_split = self._max_split
        if max_split is not None:
            if size < max_split and block.size >= max_split:
                return None  # do not return an oversized block for a smaller request
            if size >= max_split and block.size >= size + LARGE_BUFFER_BYTES:
                return None  # oversized blocks serve requests only within kLargeBuffer
        del by_key[keys[i]]
        del keys[i]
        pool.whole.pop(block.addr, None)
        return block

    def _alloc_block(
        self, pool: _Pool, size: int, alloc_size: int, *, is_retry: bool
    ) -> _Block | None:
        """``alloc_block``: a new segment (cudaMalloc) or mapped pages, if capacity allows."""
        if is_retry:
            self._retries += 1
        if self._capacity is not None and self._reserved + alloc_size > self._capacity:
            return None
        if self._expandable:
            return self._try_allocate_expandable_block(pool, size)
        if self._falling:  # each new segment ends where the last one began
            self._segment_va -= alloc_size
            block = _Block(self._segment_va, alloc_size, pool)
        else:
            block = _Block(self._segment_va, alloc_size, pool)
            self._segment_va += alloc_size
        self._segments += 1
        self._add_reserved(alloc_size)
        return block

    def _should_split(self, pool: _Pool, block: _Block, size: int) -> bool:
        """``should_split``: small pool / expandable keep >= 512 B; large keeps > 1 MiB."""
        remaining = block.size - size
        if pool.is_small or self._expandable:
            return remaining >= MIN_BLOCK_SIZE_BYTES
        max_split = self._max_split
        return (max_split is None or size < max_split) and remaining > SMALL_SIZE_BYTES

    def _alloc_found_block(
        self, pool: _Pool, block: _Block, size: int, requested_bytes: int, split: bool
    ) -> _Block:
        """``alloc_found_block``: split off the remainder, update the stats."""
        already_split = block.prev is not None or block.next is not None
        native = block.segment is None
        if split:
            remaining = block
            block = _Block(remaining.addr, size, pool, remaining.segment)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            self._insert_free(pool, remaining)
            if native:
                if already_split:
                    self._inactive -= size  # an inactive split block shrinks by size bytes
                else:
                    self._add_inactive(remaining.size)  # a new inactive split block
        elif already_split and native:
            self._inactive -= block.size  # an inactive split block becomes active
        block.allocated = True
        block.requested_bytes = requested_bytes
        self._allocs += 1
        self._allocated += block.size
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        self._requested += requested_bytes
        self._peak_requested = max(self._peak_requested, self._requested)
        return block

    # -- releasing -----------------------------------------------------------------------------

    def _release_block(self, pool: _Pool, block: _Block) -> None:
        """``release_block``: cudaFree a wholly free segment."""
        assert block.prev is None and block.next is None and block.segment is None
        self._remove_free(pool, block)
        self._segments -= 1
        self._reserved -= block.size

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """``release_available_cached_blocks``: free oversize blocks, only with max_split_size."""
        max_split = self._max_split
        if max_split is None or self._expandable:
            return False
        target = max(size, max_split)
        keys = pool.keys
        i = bisect_left(keys, target << _KEY_SHIFT)
        if i < len(keys):
            self._release_block(pool, pool.by_key[keys[i]])
            return True
        released = 0
        while released < target and keys:
            block = pool.by_key[keys[-1]]  # the largest remaining block
            if block.size < max_split:
                break
            released += block.size
            self._release_block(pool, block)
        return released >= target

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks``: ``release_blocks`` on the large pool, then the small one."""
        for pool in (self._large, self._small):
            if self._expandable:
                self._release_expandable_blocks(pool)
            else:
                for block in list(pool.whole.values()):
                    self._release_block(pool, block)
