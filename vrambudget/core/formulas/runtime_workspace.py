"""Runtime workspace: library workspaces (cuBLAS, cuBLASLt) and transient buffers the runtime
keeps (a QLoRA dequantized weight, the autocast weight cache).

Shown in answers::

    cuBLAS + cuBLASLt workspace per process (+ QLoRA dequantization buffer, autocast weight
    cache)
"""

from __future__ import annotations

from ..units import MiB

__all__ = [
    "CUBLASLT_WORKSPACE_BYTES",
    "CUBLAS_SOURCE",
    "CUBLAS_WORKSPACE_DEFAULT_BYTES",
    "CUBLAS_WORKSPACE_LARGE_BYTES",
    "FORMULA",
    "SOURCE",
    "cublas_workspace_bytes",
    "default_workspace",
]

FORMULA = (
    "cuBLAS + cuBLASLt workspace per process (+ QLoRA dequantization buffer, autocast weight cache)"
)

# aten/src/ATen/cuda/CublasHandlePool.cpp: default workspace ":4096:2:16:8" = 8,519,680 B, and
# 32 MiB (4096 * 8 * 1024) on compute capability 9.x/10.x/11.x/12.x (torch main: Hopper and
# Blackwell); one per (handle, stream).
CUBLAS_WORKSPACE_DEFAULT_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_LARGE_BYTES = 4096 * 8 * 1024
# aten/src/ATen/cuda/CUDABlas.cpp: cuBLASLt workspace 1024 KiB ("default size in KiB according
# to #73328"), a separate persistent block per handle+stream in torch 2.8/2.9 (#156495).
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024
CUBLAS_SOURCE = "pytorch aten/src/ATen/cuda/CublasHandlePool.cpp (getChosenWorkspaceSize)"
SOURCE = f"{CUBLAS_SOURCE} + cuBLASLt 1 MiB (CUDABlas.cpp)"
_HIPBLAS_SOURCE = "pytorch CublasHandlePool.cpp: hipBLAS 32 MiB, 128 MiB for gfx94x/gfx95x"


def cublas_workspace_bytes(compute_capability: str | None, vendor: str = "nvidia") -> int:
    """cuBLAS workspace of one handle/stream. ROCm (hipBLAS) uses 32 MiB, 128 MiB on gfx94x."""
    if vendor == "amd":
        return 32 * MiB
    if compute_capability is None:
        return CUBLAS_WORKSPACE_LARGE_BYTES  # unknown device: the larger default
    major = int(compute_capability.split(".")[0])
    return (
        CUBLAS_WORKSPACE_LARGE_BYTES
        if major in (9, 10, 11, 12)
        else (CUBLAS_WORKSPACE_DEFAULT_BYTES)
    )


def default_workspace(
    compute_capability: str | None, vendor: str, gfx_target: str | None
) -> tuple[int, str]:
    """(bytes, source) of one process's library workspaces on a device type: cuBLAS +
    cuBLASLt on NVIDIA, hipBLAS on AMD.

    Worked number: an H100 (9.0): 33,554,432 + 1,048,576 = 34,603,008 B; an A100 (8.0):
    8,519,680 + 1,048,576 = 9,568,256 B."""
    if vendor == "amd":
        ws = 128 * MiB if (gfx_target or "").startswith(("gfx94", "gfx95")) else 32 * MiB
        return ws, _HIPBLAS_SOURCE
    return cublas_workspace_bytes(compute_capability) + CUBLASLT_WORKSPACE_BYTES, SOURCE
