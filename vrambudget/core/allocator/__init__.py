"""A pure-Python model of PyTorch's CUDA caching allocator, for replaying allocation traces.

A fake-tensor trace records which storages are allocated and freed, in order; what a budget
needs is what ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` would report
for that stream of requests. Both depend on the caching allocator's rounding, pooling,
best-fit, splitting and merging rules, so this package replays the stream through a model of
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

* Device addresses. cudaMalloc's addresses are the driver's. The model places each new segment
  just below the previous one (a falling bump pointer, never reused), as the driver placed them
  on the measured H100 and H200 runs: with rising addresses the replay of a batched eager-attention
  prefill (Qwen2.5-0.5B, 4 x 2,048 tokens) reserved 18.9% less than measured, with falling ones
  it is within 2 MiB of ``max_memory_reserved`` and within 1 MiB of the inactive-split peak
  (``research/allocator_addresses.py`` replays the campaign's fourteen single-stream runs both
  ways).
  Addresses only break ties between free blocks of equal size (``BlockComparatorSize``) and
  order the expandable search, but a tie-break decides which segment a request splits, and so
  later merges and whether the next large request fits in the cache. A driver that reuses freed
  ranges (after ``empty_cache``) can still differ.
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

Modules: ``sizes`` (the source's constants, ``round_size``, ``get_allocation_size``), ``stats``
(the ``DeviceStats`` snapshot, the out-of-memory error), ``blocks`` (``Block``, ``BlockPool``,
``ExpandableSegment``), ``pools`` (free lists, counters, freeing and merging), ``expandable``
(mapping and unmapping pages) and ``caching`` (``CachingAllocator``: malloc, free, release).
"""

from __future__ import annotations

from .caching import CachingAllocator, SegmentOrder
from .sizes import (
    LARGE_BUFFER_BYTES,
    MIN_BLOCK_SIZE_BYTES,
    MIN_LARGE_ALLOC_BYTES,
    ROUND_LARGE_BYTES,
    SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
    allocation_size,
    round_size,
)
from .stats import AllocatorOutOfMemory, AllocatorStats

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
    "SegmentOrder",
    "allocation_size",
    "round_size",
]
