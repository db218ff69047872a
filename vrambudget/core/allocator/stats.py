"""What the allocator reports: the ``DeviceStats`` snapshot and the out-of-memory error."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AllocatorOutOfMemory", "AllocatorStats"]


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
