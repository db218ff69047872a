"""The source's size constants and its rounding: what block a request gets (``round_size``)
and what segment a cache miss reserves (``get_allocation_size``), with the option parsing of
``roundup_power2_divisions`` (``CUDAAllocatorConfig``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..units import MiB

__all__ = [
    "LARGE_BUFFER_BYTES",
    "MIN_BLOCK_SIZE_BYTES",
    "MIN_LARGE_ALLOC_BYTES",
    "ROUND_LARGE_BYTES",
    "SMALL_BUFFER_BYTES",
    "SMALL_SIZE_BYTES",
    "Divisions",
    "allocation_size",
    "round_size",
]


# The source's constants (CUDACachingAllocator.cpp, namespace Native, and kLargeBuffer above it).
MIN_BLOCK_SIZE_BYTES = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
SMALL_SIZE_BYTES = 1 * MiB  # kSmallSize: largest "small" allocation
SMALL_BUFFER_BYTES = 2 * MiB  # kSmallBuffer: small allocations are packed in 2 MiB segments
MIN_LARGE_ALLOC_BYTES = 10 * MiB  # kMinLargeAlloc: 1..10 MiB requests use a kLargeBuffer
LARGE_BUFFER_BYTES = 20 * MiB  # kLargeBuffer: large allocations may be packed in 20 MiB
ROUND_LARGE_BYTES = 2 * MiB  # kRoundLarge: larger allocations round up to 2 MiB

# AllocatorConfig: kRoundUpPowerOfTwoIntervals intervals from 1 MiB (2**20) to 64 GiB.
_ROUNDUP_INTERVALS = 16
_ROUNDUP_START_LOG2 = 20

Divisions = int | Sequence[int] | None


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
