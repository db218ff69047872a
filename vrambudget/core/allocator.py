"""A pure-Python model of PyTorch's CUDA caching allocator, for replaying allocation traces.

A fake-tensor trace records which storages are allocated and freed, in order; what a budget
needs is what ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` would report
for that stream of requests. Both depend on the caching allocator's rounding, pooling,
best-fit, splitting and merging rules, so this module replays the stream through a model of
those rules instead of summing tensor sizes. It must not import torch: the service's analytic
path runs without it.

Source followed: ``c10/cuda/CUDACachingAllocator.cpp`` in pytorch/pytorch at commit
001074d25084fdb87a799823e395a50f5ec044d3 (``DeviceCachingAllocator``, the native backend), with
the option parsing of ``c10/cuda/CUDAAllocatorConfig.{h,cpp}`` and ``c10/core/AllocatorConfig``.
Function names below are the source's.

Modelled (one device, one stream, no CUDA graphs):

* ``round_size`` (512-byte granules, optional ``roundup_power2_divisions``), ``get_pool`` (the
  small pool holds rounded sizes <= ``kSmallSize``), ``get_allocation_size``.
* ``get_free_block``: best fit in ``BlockPool::blocks``, ordered by ``BlockComparatorSize``
  (stream, size, ptr), with the ``max_split_size`` oversize rules; for expandable segments, the
  walk that ranks a block by the size it could grow to.
* ``alloc_block`` with the ``set_per_process_memory_fraction`` capacity check, and the malloc
  fallback chain: ``release_available_cached_blocks`` (only with ``max_split_size``) then
  ``release_cached_blocks`` and a retry that counts ``num_alloc_retries``, then ``num_ooms``.
* ``should_split``, ``alloc_found_block``, ``free_block``/``try_merge_blocks``, ``release_blocks``
  and ``release_block``; the stats of ``DeviceStats`` that ``torch.cuda.memory_stats()`` shows as
  ``allocated_bytes``, ``requested_bytes``, ``reserved_bytes``, ``inactive_split_bytes``,
  ``segment``, ``allocation``, ``num_alloc_retries`` and ``num_ooms`` (aggregate pool).
* ``expandable_segments:True``: ``ExpandableSegment`` maps physical memory in pages of
  ``kSmallBuffer`` (2 MiB, small pool) or ``kLargeBuffer`` (20 MiB, large pool) into one virtual
  range per pool; ``find_expandable_block``, ``map_block``, ``try_allocate_expandable_block``,
  ``unmap_block`` and ``release_expandable_segment``. Reserved bytes grow by whole pages on a
  map and shrink by the whole free pages that ``release_cached_blocks`` unmaps.

Not modelled exactly:

* Device addresses. cudaMalloc's addresses are the driver's; the model hands out rising
  addresses (a bump pointer, never reused). Addresses only break ties between free blocks of
  equal size (``BlockComparatorSize``) and order the expandable search, but a different tie-break
  can change later merges, so peaks can differ in rare cases.
* Capacity. ``capacity_bytes`` is the source's ``allowed_memory_maximum`` check
  (``total_allocated_memory + alloc_size > allowed``), done before every cudaMalloc or map. A real
  device also runs out for reasons the model cannot see (CUDA context, other processes). With
  expandable segments the check uses ``get_allocation_size`` while mapping rounds up to 20 MiB
  pages, so reserved can pass the capacity by less than one page, as it does in the source; a
  physical map failure part-way through a request is not modelled.
* Expandable address space: the source reserves ``totalGlobalMem * 9 / 8`` per segment; the
  model uses ``capacity_bytes * 9 / 8``, or 64 TiB without a capacity.
* ``max_split_size`` with expandable segments: ``release_available_cached_blocks`` would call
  ``release_block`` on an expandable block, which the source asserts against; the model skips
  that step in expandable mode.
* ``num_segments`` is the source's ``segment`` stat, which counts cudaMalloc segments only: it
  stays 0 in expandable mode, as ``memory_stats()["segment.all.current"]`` does.
* Left out: multiple streams, ``record_stream`` and event deferral, CUDA-graph private pools,
  ``garbage_collection_threshold``, free-memory callbacks, IPC, switching expandable segments
  on or off mid-run, and newer releases' configurable large segment size and
  ``max_non_split_rounding_mb`` (their defaults, ``kLargeBuffer``, are what is modelled).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LARGE_BUFFER_BYTES",
    "MIN_BLOCK_SIZE_BYTES",
    "MIN_LARGE_ALLOC_BYTES",
    "ROUND_LARGE_BYTES",
    "SMALL_BUFFER_BYTES",
    "SMALL_SIZE_BYTES",
    "AllocatorOutOfMemory",
    "AllocatorStats",
    "CachingAllocator",
    "allocation_size",
    "round_size",
]

_MIB = 1 << 20

# The source's constants (CUDACachingAllocator.cpp, namespace Native, and kLargeBuffer above it).
MIN_BLOCK_SIZE_BYTES = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
SMALL_SIZE_BYTES = 1 * _MIB  # kSmallSize: largest "small" allocation
SMALL_BUFFER_BYTES = 2 * _MIB  # kSmallBuffer: small allocations are packed in 2 MiB segments
MIN_LARGE_ALLOC_BYTES = 10 * _MIB  # kMinLargeAlloc: 1..10 MiB requests use a kLargeBuffer
LARGE_BUFFER_BYTES = 20 * _MIB  # kLargeBuffer: large allocations may be packed in 20 MiB
ROUND_LARGE_BYTES = 2 * _MIB  # kRoundLarge: larger allocations round up to 2 MiB

# AllocatorConfig: kRoundUpPowerOfTwoIntervals intervals from 1 MiB (2**20) to 64 GiB.
_ROUNDUP_INTERVALS = 16
_ROUNDUP_START_LOG2 = 20

# A free block's sort key is size << _KEY_SHIFT | address, which orders like
# BlockComparatorSize (size, then ptr) for the one stream modelled.
_KEY_SHIFT = 80
_VA_BASE = 1 << 40  # first model address; nonzero so that no block sits at "null"
_DEFAULT_EXPANDABLE_VA_BYTES = 64 << 40

Divisions = int | Sequence[int] | None


class AllocatorOutOfMemory(Exception):
    """The request did not fit under ``capacity_bytes`` even after releasing cached segments.

    Mirrors the source's ``OutOfMemoryError``; ``allocation_bytes`` is what its message calls
    "Tried to allocate" (the ``get_allocation_size`` of the request), and the allocated and
    reserved figures are taken after the cache release, as in the source's message.
    """

    def __init__(
        self,
        *,
        requested_bytes: int,
        allocation_bytes: int,
        allocated_bytes: int,
        reserved_bytes: int,
        capacity_bytes: int,
    ) -> None:
        super().__init__(
            f"out of memory: tried to allocate {allocation_bytes} bytes (request of "
            f"{requested_bytes}); {allocated_bytes} allocated, {reserved_bytes} reserved, "
            f"capacity {capacity_bytes}"
        )
        self.requested_bytes = requested_bytes
        self.allocation_bytes = allocation_bytes
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes
        self.capacity_bytes = capacity_bytes


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    """A snapshot of the counters ``torch.cuda.memory_stats()`` reports (aggregate pool).

    ``allocated_bytes`` sums the (rounded, possibly unsplit) sizes of live blocks;
    ``requested_bytes`` their unrounded request sizes; ``reserved_bytes`` the segments held from
    the device; ``inactive_split_bytes`` the free blocks that are part of a split segment (free
    memory that ``empty_cache`` cannot return; always 0 for expandable segments, which the source
    leaves out of this stat). ``num_allocs``/``num_frees`` are ``allocation.all.allocated`` and
    ``.freed``.
    """

    allocated_bytes: int
    peak_allocated_bytes: int
    requested_bytes: int
    peak_requested_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int
    inactive_split_bytes: int
    peak_inactive_split_bytes: int
    num_segments: int
    num_alloc_retries: int
    num_ooms: int
    num_allocs: int
    num_frees: int


def _normalize_divisions(divisions: Divisions) -> tuple[int, ...] | None:
    """One division count per power-of-two interval, as ``roundup_power2_divisions`` holds them.

    A single int sets every interval (``roundup_power2_divisions:4``); a sequence gives the 16
    intervals from 1 MiB up. The config parser accepts only powers of two (0 means off).
    """
    if divisions is None:
        return None
    values = (divisions,) * _ROUNDUP_INTERVALS if isinstance(divisions, int) else tuple(divisions)
    if len(values) != _ROUNDUP_INTERVALS:
        raise ValueError(f"roundup_power2_divisions needs {_ROUNDUP_INTERVALS} intervals")
    for value in values:
        if value < 0 or value & (value - 1):
            raise ValueError(f"roundup_power2_divisions must be powers of 2, got {value}")
    return values if any(value > 1 for value in values) else None


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """The source's ``roundup_power2_next_division``: ceil to 1/divisions of a power of two."""
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    power2_division = power2_floor >> (divisions.bit_length() - 1)
    if power2_division == 0:
        return power2_floor << 1
    floor = size & ~(power2_division - 1)
    return size if floor == size else floor + power2_division


def _round_size(nbytes: int, divisions: tuple[int, ...] | None) -> int:
    if nbytes < 0:
        raise ValueError(f"negative size {nbytes}")
    if nbytes < MIN_BLOCK_SIZE_BYTES:
        return MIN_BLOCK_SIZE_BYTES
    if divisions is not None:
        # CUDAAllocatorConfig::roundup_power2_divisions(size): interval of floor(log2(size)).
        index = min(max(nbytes.bit_length() - 1 - _ROUNDUP_START_LOG2, 0), _ROUNDUP_INTERVALS - 1)
        count = divisions[index]
        if count > 1 and nbytes > MIN_BLOCK_SIZE_BYTES * count:
            return _roundup_power2_next_division(nbytes, count)
    return -(-nbytes // MIN_BLOCK_SIZE_BYTES) * MIN_BLOCK_SIZE_BYTES


def _get_allocation_size(size: int) -> int:
    """The source's ``get_allocation_size`` of an already rounded size."""
    if size <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if size < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def round_size(nbytes: int, *, roundup_power2_divisions: Divisions = None) -> int:
    """The block size the allocator hands out for a request: the source's ``round_size``.

    Requests round up to a multiple of ``kMinBlockSize`` (512), at least 512 -- also for 0, as in
    the source, although ``CachingAllocator.malloc`` never rounds a 0-byte request (torch gives it
    no block). ``roundup_power2_divisions`` follows ``PYTORCH_CUDA_ALLOC_CONF``'s option.
    """
    return _round_size(nbytes, _normalize_divisions(roundup_power2_divisions))


def allocation_size(nbytes: int, *, roundup_power2_divisions: Divisions = None) -> int:
    """The segment a cache miss for ``nbytes`` reserves: ``get_allocation_size(round_size(n))``.

    2 MiB (``kSmallBuffer``) for rounded sizes up to 1 MiB, 20 MiB (``kLargeBuffer``) below
    10 MiB, else the size rounded up to 2 MiB (``kRoundLarge``). 0 bytes reserve nothing.
    """
    if nbytes == 0:
        return 0
    return _get_allocation_size(_round_size(nbytes, _normalize_divisions(roundup_power2_divisions)))


class _ExpandableSegment:
    """One reserved virtual range that physical pages are mapped into (``ExpandableSegment``)."""

    __slots__ = ("base", "page_bytes", "va_bytes")

    def __init__(self, base: int, page_bytes: int, va_bytes: int) -> None:
        self.base = base
        self.page_bytes = page_bytes
        self.va_bytes = va_bytes


class _Block:
    """The source's ``Block``: a range of a segment, linked to its neighbours by prev/next."""

    __slots__ = (
        "addr", "allocated", "mapped", "next", "pool", "prev", "requested_bytes", "segment", "size"
    )

    def __init__(
        self,
        addr: int,
        size: int,
        pool: _Pool,
        segment: _ExpandableSegment | None = None,
        mapped: bool = True,
    ) -> None:
        self.addr = addr
        self.size = size
        self.pool = pool
        self.requested_bytes = 0
        self.allocated = False
        self.mapped = mapped
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.segment = segment


class _Pool:
    """``BlockPool``: free mapped blocks sorted like ``blocks``; unmapped ones by address.

    ``whole`` indexes the free blocks that are a whole (unsplit) cudaMalloc segment, the only
    ones ``release_blocks`` can return, so that releasing never scans the split ones.
    """

    __slots__ = ("by_key", "is_small", "keys", "unmapped", "unmapped_addrs", "whole")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.keys: list[int] = []
        self.by_key: dict[int, _Block] = {}
        self.whole: dict[int, _Block] = {}
        self.unmapped_addrs: list[int] = []
        self.unmapped: dict[int, _Block] = {}


def _expandable_size(block: _Block) -> int:
    """What ``get_free_block`` ranks an expandable block by: its size plus an unmapped tail."""
    nxt = block.next
    return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


class CachingAllocator:
    """Replays mallocs and frees as ``DeviceCachingAllocator`` would on one device and stream.

    ``handle`` is the caller's id for an allocation (a storage in the trace); ``malloc`` returns
    the size of the block it got, which is what ``allocated_bytes`` counts. Options mirror
    ``PYTORCH_CUDA_ALLOC_CONF``: ``expandable_segments``, ``max_split_size_bytes``
    (``max_split_size_mb`` in bytes) and ``roundup_power2_divisions``; ``capacity_bytes`` is the
    limit ``set_per_process_memory_fraction`` sets (see the module docstring).
    """

    def __init__(
        self,
        *,
        expandable_segments: bool = False,
        capacity_bytes: int | None = None,
        max_split_size_bytes: int | None = None,
        roundup_power2_divisions: Divisions = None,
    ) -> None:
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"negative capacity {capacity_bytes}")
        if max_split_size_bytes is not None and (
            max_split_size_bytes < LARGE_BUFFER_BYTES or max_split_size_bytes % _MIB
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
        base_va = _DEFAULT_EXPANDABLE_VA_BYTES if capacity_bytes is None else (
            capacity_bytes + capacity_bytes // 8
        )
        self._expandable_va_bytes = max(base_va, LARGE_BUFFER_BYTES)
        self._small = _Pool(is_small=True)
        self._large = _Pool(is_small=False)
        self._live: dict[int, _Block | None] = {}
        self._next_va = _VA_BASE
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

    # -- pools ---------------------------------------------------------------------------------

    def _insert_free(self, pool: _Pool, block: _Block) -> None:
        key = (block.size << _KEY_SHIFT) | block.addr
        insort(pool.keys, key)
        pool.by_key[key] = block
        if block.prev is None and block.next is None and block.segment is None:
            pool.whole[block.addr] = block

    def _remove_free(self, pool: _Pool, block: _Block) -> None:
        key = (block.size << _KEY_SHIFT) | block.addr
        keys = pool.keys
        del keys[bisect_left(keys, key)]
        del pool.by_key[key]
        pool.whole.pop(block.addr, None)

    def _insert_unmapped(self, pool: _Pool, block: _Block) -> None:
        insort(pool.unmapped_addrs, block.addr)
        pool.unmapped[block.addr] = block

    def _remove_unmapped(self, pool: _Pool, block: _Block) -> None:
        addrs = pool.unmapped_addrs
        del addrs[bisect_left(addrs, block.addr)]
        del pool.unmapped[block.addr]

    # -- stats ---------------------------------------------------------------------------------

    def _add_reserved(self, nbytes: int) -> None:
        self._reserved += nbytes
        self._peak_reserved = max(self._peak_reserved, self._reserved)

    def _add_inactive(self, nbytes: int) -> None:
        self._inactive += nbytes
        self._peak_inactive = max(self._peak_inactive, self._inactive)

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
        block = _Block(self._next_va, alloc_size, pool)
        self._next_va += alloc_size
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

    # -- freeing -------------------------------------------------------------------------------

    def _free_block(self, pool: _Pool, block: _Block) -> None:
        """``free_block``: merge with free neighbours, re-pool, adjust ``inactive_split``."""
        requested_bytes = block.requested_bytes
        net_inactive = 0
        for candidate in (block.prev, block.next):
            net_inactive -= self._try_merge_blocks(pool, block, candidate)
        self._insert_free(pool, block)
        if block.prev is not None or block.next is not None:
            net_inactive += block.size
        if block.segment is None:
            if net_inactive > 0:
                self._add_inactive(net_inactive)
            else:
                self._inactive += net_inactive
        self._requested -= requested_bytes

    def _try_merge_blocks(self, pool: _Pool, dst: _Block, src: _Block | None) -> int:
        """``try_merge_blocks``: absorb a free neighbour of the same mapped state."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            self._remove_free(pool, src)
        else:
            self._remove_unmapped(pool, src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

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

    def _release_expandable_blocks(self, pool: _Pool) -> None:
        """``release_blocks`` for expandable segments: unmap whole free pages of free blocks."""
        for block in [pool.by_key[key] for key in pool.keys]:
            self._unmap_block(pool, block)
            if block.prev is None and block.next is None and not block.mapped:
                self._remove_unmapped(pool, block)  # release_expandable_segment

    # -- expandable segments -------------------------------------------------------------------

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """``find_expandable_block``: lowest unmapped range (with a free block before it) that
        has room for size, else a new segment spanning the whole reserved address space."""
        for addr in pool.unmapped_addrs:
            candidate = pool.unmapped[addr]
            prev = candidate.prev
            if prev is not None and not prev.allocated:
                candidate = prev
            room = 0
            walk: _Block | None = candidate
            while room < size and walk is not None and not walk.allocated:
                room += walk.size
                walk = walk.next
            if room >= size:
                return candidate
        page_bytes = SMALL_BUFFER_BYTES if pool.is_small else LARGE_BUFFER_BYTES
        va_bytes = -(-self._expandable_va_bytes // page_bytes) * page_bytes
        segment = _ExpandableSegment(self._next_va, page_bytes, va_bytes)
        self._next_va += va_bytes
        block = _Block(segment.base, va_bytes, pool, segment, mapped=False)
        self._insert_unmapped(pool, block)
        return block

    def _map_block(self, pool: _Pool, to_map: _Block, size: int) -> None:
        """``map_block`` / ``ExpandableSegment::map``: back the first size bytes with pages."""
        segment = to_map.segment
        assert segment is not None and not to_map.mapped
        page = segment.page_bytes
        mapped_bytes = -(-size // page) * page  # to_map starts on a page boundary
        self._remove_unmapped(pool, to_map)
        to_map.mapped = True
        if mapped_bytes < to_map.size:
            remaining = _Block(
                to_map.addr + mapped_bytes, to_map.size - mapped_bytes, pool, segment, mapped=False
            )
            remaining.prev = to_map
            remaining.next = to_map.next
            if to_map.next is not None:
                to_map.next.prev = remaining
            to_map.next = remaining
            self._insert_unmapped(pool, remaining)
            to_map.size = mapped_bytes
        self._try_merge_blocks(pool, to_map, to_map.prev)
        self._try_merge_blocks(pool, to_map, to_map.next)
        self._insert_free(pool, to_map)
        self._add_reserved(mapped_bytes)

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """``try_allocate_expandable_block``: map pages until one free block holds size."""
        candidate = self._find_expandable_block(pool, size)
        if not candidate.mapped:
            self._map_block(pool, candidate, min(candidate.size, size))
        while candidate.size < size:
            # free -> unmapped: map part of the unmapped block; it absorbs the free one.
            nxt = candidate.next
            assert nxt is not None and not nxt.mapped
            self._map_block(pool, nxt, min(size - candidate.size, nxt.size))
            candidate = nxt
        self._remove_free(pool, candidate)
        return candidate

    def _unmap_block(self, pool: _Pool, block: _Block) -> None:
        """``unmap_block`` / ``ExpandableSegment::unmap``: give back the whole free pages."""
        segment = block.segment
        assert segment is not None
        page = segment.page_bytes
        offset = block.addr - segment.base
        begin = -(-offset // page)
        end = (offset + block.size) // page
        if begin >= end:
            return
        self._remove_free(pool, block)
        unmapped_addr = segment.base + begin * page
        unmapped_bytes = (end - begin) * page
        before = unmapped_addr - block.addr
        if before > 0:
            before_free = _Block(block.addr, before, pool, segment)
            before_free.prev = block.prev
            if block.prev is not None:
                block.prev.next = before_free
            before_free.next = block
            block.prev = before_free
            self._insert_free(pool, before_free)
        after = block.size - before - unmapped_bytes
        if after > 0:
            after_free = _Block(unmapped_addr + unmapped_bytes, after, pool, segment)
            after_free.prev = block
            after_free.next = block.next
            if block.next is not None:
                block.next.prev = after_free
            block.next = after_free
            self._insert_free(pool, after_free)
        block.addr = unmapped_addr
        block.size = unmapped_bytes
        block.mapped = False
        self._try_merge_blocks(pool, block, block.prev)
        self._try_merge_blocks(pool, block, block.next)
        self._insert_unmapped(pool, block)
        self._reserved -= unmapped_bytes
