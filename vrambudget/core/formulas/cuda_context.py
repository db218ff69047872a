"""CUDA context: device memory the driver takes per process before any tensor exists.

Shown in answers::

    one context per process, and the kernel images its ops load

with two parts where lazy module loading applies: the context as created, and the kernel
images the workload's first calls of each op load into it afterwards (outside the caching
allocator, so neither ``max_memory_reserved`` nor the bare context shows them; NVML and
nvidia-smi do).

with the device type's source: a calibration profile's measurement, or one of the built-in
defaults below.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from ..units import MiB

__all__ = [
    "CONTEXT_INTERCEPT",
    "CONTEXT_PART",
    "CONTEXT_PER_THREAD",
    "CONTEXT_POINTS",
    "CUDA_CONTEXT_BYTES",
    "CUDA_CONTEXT_DATACENTER_BYTES",
    "CUDA_CONTEXT_DATACENTER_SOURCE",
    "CUDA_CONTEXT_EAGER_BYTES",
    "CUDA_CONTEXT_EAGER_CUDA10_BYTES",
    "CUDA_CONTEXT_EAGER_CUDA10_SOURCE",
    "CUDA_CONTEXT_EAGER_CURRENT_BYTES",
    "CUDA_CONTEXT_EAGER_CURRENT_SOURCE",
    "CUDA_CONTEXT_EAGER_SOURCE",
    "CUDA_CONTEXT_SOURCE",
    "EAGER_LIBRARY_IMAGES_BYTES",
    "FORMULA",
    "KERNEL_IMAGES_INFERENCE_BYTES",
    "KERNEL_IMAGES_PART",
    "KERNEL_IMAGES_SOURCE",
    "KERNEL_IMAGES_TRAINING_BYTES",
    "MIN_FITTED_THREADS",
    "RESIDENT_THREADS_PER_SM",
    "SOURCE",
    "default_context",
    "eager_context",
    "kernel_images",
    "per_device",
    "start_context",
    "wheel_cuda",
]

FORMULA = "one context per process, and the kernel images its ops load"
CONTEXT_PART = "CUDA context"
KERNEL_IMAGES_PART = "kernel images loaded after the context"

# Device memory of a PyTorch process's CUDA context with lazy module loading (the default since
# torch 1.13, pytorch/pytorch#86509): 426 MiB on an RTX 6000 Ada, torch 2.10.0+cu130, measured by
# nvidia-smi per process before any tensor (unslothai/unsloth-zoo#1053). Other public points:
# 256 MiB RTX 3090 torch 2.7.1 (invoke-ai/InvokeAI#9413); "around 400MB if CUDA >= 11.7 is used
# and lazy module loading enabled" (pytorch/pytorch#109888). It grows with the SM count and with
# kernels loaded as ops first run; eager module loading costs 0.7-1.7 GB (pytorch/pytorch#55277).
# Datacenter Hopper/Blackwell (compute capability 9.x/10.x): ~534 MiB for a bare primary
# context on an H100 (meta-pytorch/torchcomms#777, 2026 stack, lazy loading; the only public
# datacenter lazy-loading record found). The median of the six public lazy-loading bare-context
# records is 463 MiB (range 256-616).
CUDA_CONTEXT_BYTES = 426 * MiB
CUDA_CONTEXT_SOURCE = (
    "measured: 426 MiB, RTX 6000 Ada, torch 2.10 (lazy loading), "
    "unslothai/unsloth-zoo#1053; ~400 MB per pytorch/pytorch#109888; "
    "public range 256-616 MiB (research/overhead_measurements.md)"
)
CUDA_CONTEXT_DATACENTER_BYTES = 534 * MiB
CUDA_CONTEXT_DATACENTER_SOURCE = (
    "measured: ~534 MiB, H100, bare primary context, lazy loading (meta-pytorch/torchcomms#777); "
    "public range 256-616 MiB (research/overhead_measurements.md)"
)
SOURCE = CUDA_CONTEXT_SOURCE
# Eager module loading (CUDA_MODULE_LOADING=EAGER, or a CUDA runtime before 11.7): every kernel
# image of torch's libraries is loaded into the context at creation. The one same-machine A/B
# (pytorch/pytorch#86509, torch 1.13): 666,632,192 B eager against 287,047,680 B lazy,
# cudaMemGetInfo total - free with a 6.4 MB tensor. Other eager points: 721 MB GTX 1080 cu101,
# 1,687 MB RTX 3090 cu111 (pytorch/pytorch#55277), 543 MiB (pytorch/pytorch#81257).
CUDA_CONTEXT_EAGER_BYTES = 666_632_192
CUDA_CONTEXT_EAGER_SOURCE = (
    "measured: 666,632,192 B with eager module loading against 287,047,680 B lazy on one "
    "machine (pytorch/pytorch#86509); eager range 543 MiB - 1,687 MB "
    "(research/overhead_measurements.md)"
)
# Eager loading forced on a current stack (CUDA 12 and later): one H200, torch 2.11.0+cu130,
# CUDA_MODULE_LOADING=EAGER, NVML after context creation and a first 2 MiB tensor,
# 1,322,057,728 B, less the tensor's 2,097,152 B segment (bench/gpu/stack_overheads.py; the
# same step lazily: 650,969,088 B). Today's wheels carry far more kernel images than torch 1.13's.
CUDA_CONTEXT_EAGER_CURRENT_BYTES = 1_319_960_576
CUDA_CONTEXT_EAGER_CURRENT_SOURCE = (
    f"measured: {CUDA_CONTEXT_EAGER_CURRENT_BYTES:,} B for the context (and "
    "517,996,544 B of cuBLAS images at the first GEMM) with CUDA_MODULE_LOADING=EAGER on an "
    "H200, torch 2.11 cu130; the same step lazily 648,871,936 B "
    "(research/overhead_measurements.md)"
)


# Kernel images under lazy module loading: each op's first call loads its module into the
# context, outside the caching allocator. Measured on one H200 (torch 2.11.0+cu130, driver
# 580.159.04) as NVML's per-process peak minus max_memory_reserved() minus the bare context --
# the basis the comparison's `unexplained` quantity uses -- over whole workloads of the GPU
# campaign (research/data/gpu/gpu_campaign_2026-12-04T164803_h200-sxm-141gb.json): 161,939,456
# to 180,813,824 B for six inference runs (transformers generate, the built-in builders, eager
# attention), 245,825,536 B for every training step (backward and optimizer kernels as well).
# The largest of each is taken. bench/gpu/stack_overheads.py isolates single ops: 69.2 MB for
# a first bf16 GEMM's images, ~0 for flash SDPA, 8.4 MB for a first cuDNN convolution.
KERNEL_IMAGES_INFERENCE_BYTES = 180_813_824
KERNEL_IMAGES_TRAINING_BYTES = 245_825_536
KERNEL_IMAGES_SOURCE = (
    f"kernel images: measured outside the allocator and the context, "
    f"{KERNEL_IMAGES_INFERENCE_BYTES:,} B for inference and {KERNEL_IMAGES_TRAINING_BYTES:,} B "
    "for a training step (largest of each), one H200, torch 2.11 cu130, lazy loading "
    "(research/overhead_measurements.md)"
)
# Under eager loading each library's whole image set loads when the library first loads: the
# context as created holds torch's own kernels, and cuBLAS's arrive with the first GEMM. Same
# H200 and script under CUDA_MODULE_LOADING=EAGER: outside the allocator after the context
# step 1,319,960,576 B, after the first bf16 GEMM 1,837,957,120 B (1,894,580,224 NVML - 56,623,104
# reserved): 517,996,544 B of cuBLAS images (a first cuDNN convolution adds 214 MB more; not
# counted, no LLM workload here convolves).
EAGER_LIBRARY_IMAGES_BYTES = 517_996_544


# The eager context of CUDA 10 wheels, read with nvidia-smi beside a tensor and no GEMM: 721 MB
# on a GTX 1080 (torch 1.8.2+cu101, pytorch/pytorch#55277) and 1,035 MiB less a 163,840,000 B
# tensor (its 158 MiB of segments) = 877 MiB on an RTX 2080 Ti (torch 1.6.0+cu101,
# pytorch/pytorch#49877); the larger is taken. The first GEMM did not add cuBLAS's images on
# top: transformers' 2020 benchmark pages read about 800 MiB beside BERT's weights on a TITAN
# RTX after a forward's GEMMs (torch 1.4 and 1.5; research/data/corpus/
# v2026-12-06_inference.json), under the 2080 Ti's context alone. (CUDA 11.0-11.6 readings
# disagree too much to replace the torch 1.13 A/B: 1,486 and 1,687 MiB on an RTX 3090 with
# torch 1.7.1+cu110 and 1.8.2+cu111, pytorch/pytorch#49877 and #55277, against 543 MiB for an
# NGC torch 1.11 with CUDA 11.5, pytorch/pytorch#81257.)
CUDA_CONTEXT_EAGER_CUDA10_BYTES = 877 * MiB
CUDA_CONTEXT_EAGER_CUDA10_SOURCE = (
    "measured, eager module loading, CUDA 10.1 with a tensor and no GEMM: 721 MB GTX 1080 "
    "(pytorch/pytorch#55277), 877 MiB RTX 2080 Ti (pytorch/pytorch#49877), the larger; "
    "cuBLAS's images in it (BERT on a TITAN RTX, transformers' 2020 benchmarks, ~800 MiB after "
    "its GEMMs; research/overhead_measurements.md)"
)


def kernel_images(
    kind: str, vendor: str, eager: bool, cuda_version: tuple[int, ...] | None = None
) -> int:
    """Bytes of kernel images a workload's ops load after the context exists, on NVIDIA: the
    measured inference or training value under lazy loading; under eager loading cuBLAS's
    whole image set, loaded with the library at the first GEMM (none beyond the context with
    CUDA 10, whose measured contexts hold them). 0 on other vendors (not measured)."""
    if vendor != "nvidia":
        return 0
    if eager:
        old = cuda_version is not None and cuda_version < (11,)
        return 0 if old else EAGER_LIBRARY_IMAGES_BYTES
    return KERNEL_IMAGES_TRAINING_BYTES if kind == "training" else KERNEL_IMAGES_INFERENCE_BYTES


def eager_context(cuda_version: tuple[int, ...] | None, lazy_with_images: int) -> tuple[int, str]:
    """(bytes, source) of a context as created under eager module loading: the published CUDA
    10 readings, the torch 1.13 A/B for CUDA 11, the current-stack measurement from CUDA 12 on
    (or unknown); never below the lazy context with its largest kernel images (eager loading
    loads at least those)."""
    if cuda_version is not None and cuda_version < (11,):
        value, source = CUDA_CONTEXT_EAGER_CUDA10_BYTES, CUDA_CONTEXT_EAGER_CUDA10_SOURCE
    elif cuda_version is not None and cuda_version < (12,):
        value, source = CUDA_CONTEXT_EAGER_BYTES, CUDA_CONTEXT_EAGER_SOURCE
    else:
        value, source = CUDA_CONTEXT_EAGER_CURRENT_BYTES, CUDA_CONTEXT_EAGER_CURRENT_SOURCE
    return max(value, lazy_with_images), source


def wheel_cuda(torch_version: str) -> tuple[int, ...] | None:
    """The CUDA of a torch build, where a request names none: its local tag (``+cu101`` ->
    (10, 1)); else by release: CUDA 10 before 1.7.0 (which shipped the first CUDA 11 wheels),
    CUDA 11 before 2.1 (which shipped the first CUDA 12 ones, cu121) -- for 1.7-1.12, whose
    default pip wheels were cu102 and whose cu11x ones came from PyTorch's index, the larger
    context of the two (an Ampere GPU needs the latter); None after (the current stack's)."""
    tag = torch_version.partition("+")[2]
    if tag.startswith("cu") and tag[2:].isdigit() and len(tag) >= 4:
        digits = tag[2:]
        return (int(digits[:-1]), int(digits[-1]))
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    if m is None:
        return None
    release = (int(m[1]), int(m[2]))
    if release < (1, 7):
        return (10,)
    if release < (2, 1):
        return (11,)
    return None


# The context grows with the GPU: the driver reserves local memory (the per-thread stack,
# cudaLimitStackSize) for every thread the device can hold resident at once, SMs x resident
# threads per SM, and the bare lazy-loading contexts measured on three GPU types of three
# architectures lie on one line in that count (CONTEXT_POINTS; within 0.6 MiB of each). The
# resident threads per SM are a compute-capability fact.
RESIDENT_THREADS_PER_SM: dict[str, int] = {
    "7.0": 2048,
    "7.2": 2048,
    "7.5": 1024,
    "8.0": 2048,
    "8.6": 1536,
    "8.7": 2048,
    "8.9": 1536,
    "9.0": 2048,
    "10.0": 2048,
    "10.3": 2048,
    "12.0": 1536,
    "12.1": 1536,
}
RESIDENT_THREADS_SOURCE = (
    "CUDA C++ Programming Guide, Technical Specifications per Compute Capability: maximum "
    "number of resident threads per SM (2048 on 7.0, 8.0, 8.7, 9.0, 10.x; 1536 on 8.6, 8.9, "
    "12.x; 1024 on 7.5)"
)


@dataclass(frozen=True, slots=True)
class ContextPoint:
    """One published bare-context measurement under lazy module loading, on a named GPU; its
    SM count and compute capability are the catalog entries' (``gpu_ids``), which
    tests/core/formulas/test_cuda_context_line.py holds them to."""

    gpu: str
    gpu_ids: tuple[str, ...]
    sm_count: int
    compute_capability: str
    bytes: int
    source: str

    @property
    def resident_threads(self) -> int:
        return self.sm_count * RESIDENT_THREADS_PER_SM[self.compute_capability]


CONTEXT_POINTS: tuple[ContextPoint, ...] = (
    ContextPoint(
        "RTX 3090",
        ("rtx-3090-24gb",),
        82,
        "8.6",
        256 * MiB,
        "256 MiB, nvidia-smi per process of an idle server, torch 2.7.1+cu128 "
        "(invoke-ai/InvokeAI#9413)",
    ),
    ContextPoint(
        "RTX 6000 Ada",
        ("rtx-6000-ada-48gb",),
        142,
        "8.9",
        426 * MiB,
        "426 MiB, nvidia-smi after mem_get_info only, torch 2.10.0+cu130 "
        "(unslothai/unsloth-zoo#1053)",
    ),
    ContextPoint(
        "H100 SXM and H200",
        ("h100-sxm5-80gb", "h200-sxm-141gb"),
        132,
        "9.0",
        548_995_072,
        "548,995,072 B on both, NVML in a fresh process before any tensor, torch 2.11.0+cu130 "
        "(this project's GPU campaigns of 2026-12-04 and 2026-12-05, "
        "research/overhead_measurements.md)",
    ),
)
"""The bare-context measurements the line is fitted to (research/overhead_measurements.md,
section 1)."""


def _least_squares() -> tuple[Fraction, Fraction]:
    """(intercept bytes, bytes per resident thread) of the least-squares line through
    :data:`CONTEXT_POINTS`, exact."""
    xs = [Fraction(p.resident_threads) for p in CONTEXT_POINTS]
    ys = [Fraction(p.bytes) for p in CONTEXT_POINTS]
    mx = sum(xs, Fraction(0)) / len(xs)
    my = sum(ys, Fraction(0)) / len(ys)
    sxy = sum(((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)), Fraction(0))
    sxx = sum(((x - mx) ** 2 for x in xs), Fraction(0))
    slope = sxy / sxx
    return my - slope * mx, slope


CONTEXT_INTERCEPT, CONTEXT_PER_THREAD = _least_squares()
MIN_FITTED_THREADS = min(p.resident_threads for p in CONTEXT_POINTS)
"""Below the smallest measured GPU the line is not extrapolated: a GPU with fewer resident
threads takes the smallest measured GPU's context (the larger, safe side)."""


def start_context(sm_count: int, compute_capability: str) -> tuple[int, str] | None:
    """(bytes, source) of the bare context at a process's start on ``sm_count`` SMs of
    ``compute_capability``, before any kernel runs: the line through :data:`CONTEXT_POINTS`
    (None where the resident threads per SM are not known). What an engine that measures the
    free memory at its start sees (SGLang).

    Worked number: an L40S, 142 SMs of 8.9 (218,112 resident threads), takes
    ceil(intercept + 218,112 x the per-thread slope) = 447,228,195 B (426.5 MiB)."""
    per_sm = RESIDENT_THREADS_PER_SM.get(compute_capability)
    if per_sm is None:
        return None
    threads = max(sm_count * per_sm, MIN_FITTED_THREADS)
    value = math.ceil(CONTEXT_INTERCEPT + CONTEXT_PER_THREAD * threads)
    below = " (fewer than the smallest measured GPU: its value)" * (
        sm_count * per_sm < MIN_FITTED_THREADS
    )
    source = (
        f"{value:,} B: {sm_count} SMs x {per_sm} resident threads{below} on the line through "
        "the bare lazy-loading contexts of three GPUs, "
        f"{float(CONTEXT_INTERCEPT) / MiB:.1f} MiB + "
        f"{float(CONTEXT_PER_THREAD):,.0f} B per resident thread ("
        + "; ".join(f"{p.gpu}: {p.source}" for p in CONTEXT_POINTS)
        + f"); {RESIDENT_THREADS_SOURCE}"
    )
    return value, source


def default_context(compute_capability: str | None, vendor: str) -> tuple[int, str]:
    """(bytes, source) of one process's context in a workload's budget, on a device type: 534
    MiB on NVIDIA compute capability 9.x/10.x (Hopper, datacenter Blackwell), 426 MiB
    otherwise. Not :func:`start_context`'s line: on the smaller GPUs the whole runs measured
    outside the allocator (nvidia-smi readings of V100s and RTX 4090s, already 1-7% above
    their estimates) hold more than that bare line plus the kernel images measured on an H200,
    and no other architecture's images are measured (docs/ACCURACY.md, "The CUDA context at a
    process's start")."""
    major = int(compute_capability.split(".")[0]) if compute_capability else 0
    if vendor == "nvidia" and major in (9, 10):
        return CUDA_CONTEXT_DATACENTER_BYTES, CUDA_CONTEXT_DATACENTER_SOURCE
    return CUDA_CONTEXT_BYTES, CUDA_CONTEXT_SOURCE


def per_device(context_bytes: int, processes: int) -> int:
    """``processes x context``: one context per process on the device.

    Worked number: two inference instances on an H100: 2 x 534 MiB = 1,119,879,168 B."""
    return context_bytes * processes
