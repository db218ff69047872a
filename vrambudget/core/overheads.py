"""Runtime overheads that only real hardware fixes exactly: built-in defaults with their sources.

These are the numbers that calibration (probe measurements) is meant to replace; until then each
one names the public measurement or source line it comes from and its conditions.
"""

from __future__ import annotations

from dataclasses import dataclass

from .units import MiB

__all__ = [
    "ALLOCATOR_FRAGMENTATION_FRACTION",
    "CUBLASLT_WORKSPACE_BYTES",
    "CUDA_CONTEXT_BYTES",
    "CUDA_CONTEXT_DATACENTER_BYTES",
    "DDP_BUCKET_NOTE",
    "FRAGMENTATION_SOURCE",
    "INFERENCE_FRAGMENTATION_FRACTION",
    "KMIN_BLOCK_BYTES",
    "NCCL_GROUP_BYTES",
    "NCCL_PAIR_BYTES",
    "ROUNDING_PART",
    "TRAINING_FRAGMENTATION_FRACTION",
    "ZERO_PREFETCH_BUCKET_ELEMENTS",
    "ZERO_REDUCE_BUCKET_ELEMENTS",
    "Overheads",
    "cublas_workspace_bytes",
    "device_overheads",
]

# Device memory of a PyTorch process's CUDA context with lazy module loading (the default since
# torch 1.13, pytorch/pytorch#86509): 426 MiB on an RTX 6000 Ada, torch 2.10.0+cu130, measured by
# nvidia-smi per process before any tensor (unslothai/unsloth-zoo#1053). Other public points:
# 256 MiB RTX 3090 torch 2.7.1 (invoke-ai/InvokeAI#9413); "around 400MB if CUDA >= 11.7 is used
# and lazy module loading enabled" (pytorch/pytorch#109888). It grows with the SM count and with
# kernels loaded as ops first run; eager module loading costs 0.7-1.7 GB (pytorch/pytorch#55277).
# Datacenter Hopper/Blackwell (compute capability 9.x/10.x): ~534 MiB for a bare primary
# context on an H100 (meta-pytorch/torchcomms#777, 2026 stack, lazy loading; the only public
# datacenter lazy-loading record found). The median of the six public lazy-loading bare-context
# records is 463 MiB (range 256-616, docs/research/overhead_measurements.md).
CUDA_CONTEXT_BYTES = 426 * MiB
CUDA_CONTEXT_SOURCE = ("measured: 426 MiB, RTX 6000 Ada, torch 2.10 (lazy loading), "
                       "unslothai/unsloth-zoo#1053; ~400 MB per pytorch/pytorch#109888; "
                       "public range 256-616 MiB (docs/research/overhead_measurements.md)")
CUDA_CONTEXT_DATACENTER_BYTES = 534 * MiB
CUDA_CONTEXT_DATACENTER_SOURCE = (
    "measured: ~534 MiB, H100, bare primary context, lazy loading (meta-pytorch/torchcomms#777); "
    "public range 256-616 MiB (docs/research/overhead_measurements.md)")

# aten/src/ATen/cuda/CublasHandlePool.cpp: default workspace ":4096:2:16:8" = 8,519,680 B, and
# 32 MiB (4096 * 8 * 1024) on compute capability 9.x/10.x/11.x/12.x (torch main: Hopper and
# Blackwell); one per (handle, stream).
CUBLAS_WORKSPACE_DEFAULT_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_LARGE_BYTES = 4096 * 8 * 1024
# aten/src/ATen/cuda/CUDABlas.cpp: cuBLASLt workspace 1024 KiB ("default size in KiB according
# to #73328"), a separate persistent block per handle+stream in torch 2.8/2.9 (#156495).
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024
CUBLAS_SOURCE = "pytorch aten/src/ATen/cuda/CublasHandlePool.cpp (getChosenWorkspaceSize)"

# c10/cuda/CUDACachingAllocator.cpp: "all sizes are rounded to at least 512 bytes".
KMIN_BLOCK_BYTES = 512
ROUNDING_PART = "512-byte rounding of weight tensors"
# Fragmentation of transient memory in the caching allocator (reserved - allocated), as a
# fraction of the largest transient bytes of the workload (segments cached at that moment stay
# reserved). Inference and training: the median over the oracle grid of the trace tier's replay
# of c10/cuda/CUDACachingAllocator.cpp (bench/trace_accuracy.py, docs/ACCURACY.md; spread
# 0.07-0.69 training, 0.09-1.2 inference) -- to be replaced by probe calibration. Generic
# workloads: a 5% assumption.
ALLOCATOR_FRAGMENTATION_FRACTION = 0.05
TRAINING_FRAGMENTATION_FRACTION = 0.21
INFERENCE_FRAGMENTATION_FRACTION = 0.34

# NCCL device memory per communicator, 4x A100 NVLink, PyTorch, 4 MB all-reduce: 544 MB for a
# 2-rank group, 688 MB for a larger group (NVIDIA/nccl#964). Buffers scale with channels x peers
# (NCCL_BUFFSIZE default 4 MiB per channel and peer, src/init.cc).
NCCL_PAIR_BYTES = 544 * 10**6
NCCL_GROUP_BYTES = 688 * 10**6
NCCL_SOURCE = "measured: 544 MB (2 ranks) / 688 MB (>2 ranks) per communicator, NVIDIA/nccl#964"

# DeepSpeed deepspeed/runtime/zero/config.py defaults (elements, not bytes).
ZERO_REDUCE_BUCKET_ELEMENTS = 500_000_000
ZERO_ALLGATHER_BUCKET_ELEMENTS = 500_000_000
ZERO_PREFETCH_BUCKET_ELEMENTS = 50_000_000
ZERO_SOURCE = "DeepSpeed runtime/zero/config.py: reduce_bucket_size 5e8, prefetch_bucket_size 5e7"
DDP_BUCKET_NOTE = ("torch DistributedDataParallel(gradient_as_bucket_view=False), the default: "
                   "\"the saved memory size will be equal to the total gradients size\"")


def cublas_workspace_bytes(compute_capability: str | None, vendor: str = "nvidia") -> int:
    """cuBLAS workspace of one handle/stream. ROCm (hipBLAS) uses 32 MiB, 128 MiB on gfx94x."""
    if vendor == "amd":
        return 32 * MiB
    if compute_capability is None:
        return CUBLAS_WORKSPACE_LARGE_BYTES  # unknown device: the larger default
    major = int(compute_capability.split(".")[0])
    return CUBLAS_WORKSPACE_LARGE_BYTES if major in (9, 10, 11, 12) else (
        CUBLAS_WORKSPACE_DEFAULT_BYTES)


FRAGMENTATION_SOURCE = (
    "median of the trace tier's replay of c10/cuda/CUDACachingAllocator.cpp over its oracle grid "
    "(docs/ACCURACY.md), until calibrated by probes; public measurements bracket it: reserved but "
    "unallocated at OOM time is 0.5% (training) / 1.8% (inference) of allocated (medians of 19 "
    "PyTorch OOM messages), at the peak +59% to +108% of allocated in RL training with varying "
    "shapes (cosmos-rl), -34% with expandable segments (pytorch/torchtune#1185), GMLake "
    "(ASPLOS'24) 15% less fragmentation on A100 (docs/research/overhead_measurements.md)")


def _ppm(fraction: float) -> int:
    return round(fraction * 1_000_000)


@dataclass(frozen=True, slots=True)
class Overheads:
    """Per-process device overheads for one device type: the built-in defaults, or a
    calibration profile's measurements (``profile`` names it)."""

    cuda_context_bytes: int
    cuda_context_source: str
    workspace_bytes: int
    workspace_source: str
    inference_fragmentation_ppm: int = _ppm(INFERENCE_FRAGMENTATION_FRACTION)
    training_fragmentation_ppm: int = _ppm(TRAINING_FRAGMENTATION_FRACTION)
    generic_fragmentation_ppm: int = _ppm(ALLOCATOR_FRAGMENTATION_FRACTION)
    fragmentation_source: str = FRAGMENTATION_SOURCE
    nccl_communicator_bytes: int | None = None
    """A measured NCCL communicator's bytes; None: the built-in pair/group values."""
    communication_source: str = NCCL_SOURCE
    profile: str | None = None
    """The calibration profile these values came from (None: built-in defaults)."""
    profile_match: tuple[str, ...] = ()
    """What the profile matched on (``gpu``, ``torch``, ``cuda``, ``driver``)."""


def device_overheads(compute_capability: str | None, vendor: str, gfx_target: str | None
                     ) -> Overheads:
    if vendor == "amd":
        ws = 128 * MiB if (gfx_target or "").startswith(("gfx94", "gfx95")) else 32 * MiB
        src = "pytorch CublasHandlePool.cpp: hipBLAS 32 MiB, 128 MiB for gfx94x/gfx95x"
    else:
        ws = cublas_workspace_bytes(compute_capability) + CUBLASLT_WORKSPACE_BYTES
        src = f"{CUBLAS_SOURCE} + cuBLASLt 1 MiB (CUDABlas.cpp)"
    major = int(compute_capability.split(".")[0]) if compute_capability else 0
    if vendor == "nvidia" and major in (9, 10):
        return Overheads(CUDA_CONTEXT_DATACENTER_BYTES, CUDA_CONTEXT_DATACENTER_SOURCE, ws, src)
    return Overheads(CUDA_CONTEXT_BYTES, CUDA_CONTEXT_SOURCE, ws, src)
