"""Allocator overhead: what the caching allocator reserves beyond the tensors' bytes.

Shown in answers::

    512-byte rounding of every weight tensor + fragmentation_fraction x the largest transient
    bytes (activations, logits, step temporaries)

The fraction is a device type's calibrated value or the built-in default below; the caching
allocator itself is modelled event by event in :mod:`vrambudget.core.allocator` (the trace tier).
"""

from __future__ import annotations

from ..allocator import MIN_BLOCK_SIZE_BYTES
from ..units import round_up

__all__ = [
    "ALLOCATOR_FRAGMENTATION_FRACTION",
    "CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION",
    "EAGER_INFERENCE_FRAGMENTATION_FRACTION",
    "EXPANDABLE_FRACTIONS",
    "EXPANDABLE_MEASURED_RATIO",
    "EXPANDABLE_REPLAY_MEDIANS",
    "EXPANDABLE_SOURCE",
    "FIXED_FRACTIONS",
    "FORMULA",
    "FRAGMENTATION_SOURCE",
    "INFERENCE_FRAGMENTATION_FRACTION",
    "ROUNDING_PART",
    "ROUNDING_SOURCE",
    "SOURCE",
    "TRAINING_FRAGMENTATION_FRACTION",
    "block_rounding",
    "fragmentation",
    "overhead",
    "parts",
    "ppm",
    "source",
]

FORMULA = (
    "512-byte rounding of every weight tensor + fragmentation_fraction x the largest "
    "transient bytes (activations, logits, step temporaries)"
)

ROUNDING_PART = "512-byte rounding of weight tensors"
ROUNDING_SOURCE = "c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize = 512)"
# Fragmentation of transient memory in the caching allocator (reserved - allocated), as a
# fraction of the largest transient bytes of the workload (segments cached at that moment stay
# reserved). Inference and training: the median over the oracle grid of the trace tier's replay
# of c10/cuda/CUDACachingAllocator.cpp (docs/ACCURACY.md; spread 0.07-0.69 training, 0.09-1.2
# inference) -- to be replaced by probe calibration. Generic workloads: a 5% assumption.
ALLOCATOR_FRAGMENTATION_FRACTION = 0.05
TRAINING_FRAGMENTATION_FRACTION = 0.21
INFERENCE_FRAGMENTATION_FRACTION = 0.34
# Eager attention's scores (the product, scaled and masked copies, the fp32 softmax and the cast
# back, per layer) are runs of equal-sized large requests whose best fit splits the fp32
# segments: the median of the replay over research/fragmentation_grids.py's 16 eager
# workloads (Qwen2.5 0.5B/1.5B, GPT-2, Gemma 2 2B; 0.14-0.74). The H100 and H200 campaigns'
# eager run measured 0.558 (max_memory_reserved - max_memory_allocated over the same bytes).
EAGER_INFERENCE_FRAGMENTATION_FRACTION = 0.51
# Full activation checkpointing: each layer's recomputed forward and its backward temporaries
# are allocated and freed between the gradients that stay. The median of the replay over
# research/fragmentation_grids.py's 16 full-checkpointing steps (Qwen2.5 0.5B/1.5B, GPT-2,
# Granite 3.1 2B; 0.12-0.92); the H100 campaign's two full-checkpointing steps measured 0.334
# and 0.343. Both grids' rows: research/data/fragmentation_grids.json, held to these constants
# by tests/research/test_fragmentation_grids.py.
CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION = 0.26
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: one segment per pool and stream grows by
# mapping 2 MiB pages, so a freed block is merged back into it instead of staying cached in a
# segment of its own. Two sources, and the larger fraction is taken:
# * the replay: per class, the median of research/fragmentation_grids.py's grid of that class
#   replayed with it (16 workloads each; ranges: SDPA inference 0.03-0.40, eager 0.003-0.29,
#   training 0.003-0.10, full checkpointing 0.002-0.40; held to these medians by
#   tests/research/test_fragmentation_grids.py);
# * published A/Bs that give both readings: over seven training workloads (cosmos-rl, TorchRec,
#   five of Giles Thomas's DeepSpeed fine-tunes) the gap reserved beyond allocated with
#   expandable segments is a median 0.48 of the gap without (0.26-0.79;
#   research/overhead_measurements.md).
# The replay cuts the fraction further than the runs did (its medians are 0.17-0.78 of the
# fixed ones); until a measurement of the same workloads says otherwise the measured ratio is
# a floor.
EXPANDABLE_REPLAY_MEDIANS: dict[str, float] = {
    "sdpa": 0.14,
    "eager": 0.09,
    "training": 0.04,
    "checkpointing": 0.20,
}
EXPANDABLE_MEASURED_RATIO = 0.48
FIXED_FRACTIONS: dict[str, float] = {
    "sdpa": INFERENCE_FRAGMENTATION_FRACTION,
    "eager": EAGER_INFERENCE_FRAGMENTATION_FRACTION,
    "training": TRAINING_FRAGMENTATION_FRACTION,
    "checkpointing": CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION,
}
"""Each class's fraction with fixed segments, by research/fragmentation_grids.py's grid names."""
EXPANDABLE_FRACTIONS: dict[str, float] = {
    k: round(max(m, FIXED_FRACTIONS[k] * EXPANDABLE_MEASURED_RATIO), 2)
    for k, m in EXPANDABLE_REPLAY_MEDIANS.items()
}
"""sdpa 0.16, eager 0.24, training 0.10, checkpointing 0.20."""
EXPANDABLE_SOURCE = (
    "with expandable_segments:True, the larger of the trace tier's replay of "
    "c10/cuda/CUDACachingAllocator.cpp (its ExpandableSegment; medians over 16 workloads per "
    "class, research/fragmentation_grids.py: inference 0.14, eager attention 0.09, training "
    "0.04, full checkpointing 0.20) and 0.48 x the fixed-segment fraction (the median over "
    "seven published training A/Bs of the gap reserved beyond allocated with and without "
    "them, 0.26-0.79: cosmos-rl#388, torchrec#4375, gpjt/fine-tune-2024-04; "
    "research/overhead_measurements.md): inference 0.16, eager attention 0.24, training 0.10, "
    "full checkpointing 0.20"
)
FRAGMENTATION_SOURCE = (
    "median of the trace tier's replay of c10/cuda/CUDACachingAllocator.cpp over its oracle grid "
    "(docs/ACCURACY.md), until calibrated by probes; public measurements bracket it: reserved but "
    "unallocated at OOM time is 0.5% (training) / 1.8% (inference) of allocated (medians of 19 "
    "PyTorch OOM messages), at the peak +59% to +108% of allocated in RL training with varying "
    "shapes (cosmos-rl), -34% with expandable segments (pytorch/torchtune#1185), GMLake "
    "(ASPLOS'24) 15% less fragmentation on A100 (research/overhead_measurements.md); "
    "inference with eager attention: 0.51, training with full checkpointing: 0.26, the medians "
    "of the replay over 16 workloads each (research/fragmentation_grids.py; 0.14-0.74 and "
    "0.12-0.92); measured: 0.558 (eager, an H100 and an H200), 0.334-0.343 (full "
    "checkpointing, an H100)"
)
SOURCE = f"{ROUNDING_SOURCE}; fraction: {FRAGMENTATION_SOURCE}"


def source(fragmentation_source: str) -> str:
    """The line's source: the rounding rule and the device type's fraction."""
    return f"{ROUNDING_SOURCE}; fraction: {fragmentation_source}"


def ppm(fraction: float) -> int:
    """A fraction in millionths, so that the overhead is exact integer arithmetic."""
    return round(fraction * 1_000_000)


def block_rounding(size: int) -> int:
    """Bytes a ``size``-byte tensor loses to the allocator's 512-byte blocks
    (``kMinBlockSize``, :data:`vrambudget.core.allocator.MIN_BLOCK_SIZE_BYTES`).

    Worked number: a 1,000-byte tensor takes 1,024 B (24 B lost); a 4,096-element bf16 norm
    weight (8,192 B) loses nothing."""
    return round_up(size, MIN_BLOCK_SIZE_BYTES) - size


def fragmentation(transient: int, fraction_ppm: int) -> int:
    """``ceil(fraction x largest transient bytes)``, in integers: exact for any size (floats
    would round above 2^53 bytes).

    Worked number: 1 GiB of activations at the inference fraction 0.34: 365,072,221 B."""
    return -(-transient * fraction_ppm // 1_000_000)


def overhead(rounding: int, transient: int, fraction_ppm: int) -> int:
    """The line: weight rounding + fragmentation of the largest transient bytes."""
    return rounding + -(-transient * fraction_ppm // 1_000_000)  # = rounding + fragmentation()


def parts(rounding: int, transient: int, fraction_ppm: int) -> tuple[tuple[str, int], ...]:
    return (
        (ROUNDING_PART, rounding),
        ("fragmentation of transient memory", fragmentation(transient, fraction_ppm)),
    )
