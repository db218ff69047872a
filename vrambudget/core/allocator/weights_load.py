"""What the caching allocator reserves for a model's weights, allocated one tensor after another
and never freed (a serving engine builds its modules on the device, then copies the
checkpoint into them).

``CUDACachingAllocator.cpp`` gives each request a block of a segment sized by
``get_allocation_size``: requests of at most 1 MiB share 2 MiB segments (the small pool),
requests below 10 MiB share 20 MiB segments (``kLargeBuffer``), larger ones get a segment of
their own rounded up to 2 MiB (``kRoundLarge``), whose remainder is split off only when it is
above 1 MiB (``should_split``). None of that is released by ``torch.cuda.empty_cache()``
while a block of the segment is live, so a reading of the device's free memory after loading
(SGLang's "Load weight end ... mem usage") is the replay's reserved bytes, not the tensors'
sum. Qwen3-14B over 4 GPUs: each rank's fused q/k/v projection is 5,120 x 1,792 x 2 B =
17.5 MiB, its o_proj 12.5 MiB, gate_up 85 MiB, down 42.5 MiB: segments of 18, 14, 86 and 44
MiB, 4.5 MiB a layer beyond the tensors, 180 MiB over 40 layers.
"""

from __future__ import annotations

from functools import lru_cache

from .caching import CachingAllocator

__all__ = ["loaded_reserved_bytes"]


@lru_cache(maxsize=4096)
def loaded_reserved_bytes(sizes: tuple[int, ...]) -> int:
    """Reserved bytes after allocating tensors of ``sizes`` bytes in that order (no frees).
    Zero-byte entries are skipped (torch allocates nothing for them)."""
    a = CachingAllocator()
    for handle, nbytes in enumerate(sizes):
        if nbytes > 0:
            a.malloc(handle, nbytes)
    return a.reserved_bytes
