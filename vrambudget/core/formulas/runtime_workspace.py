"""Runtime workspace: library workspaces (cuBLAS, cuBLASLt) and buffers the runtime keeps (a
QLoRA dequantized weight, the autocast weight cache, a quantized kernel's scratch).

Shown in answers::

    cuBLAS (+ cuBLASLt before torch 2.12) workspace per process (+ QLoRA dequantization
    buffer, autocast weight cache, exllama scratch)
"""

from __future__ import annotations

from ..units import MiB

__all__ = [
    "BLAS_PART",
    "CUBLASLT_WORKSPACE_BYTES",
    "CUBLAS_SOURCE",
    "CUBLAS_WORKSPACE_DEFAULT_BYTES",
    "CUBLAS_WORKSPACE_LARGE_BYTES",
    "FORMULA",
    "KERNEL_SCRATCH_PART",
    "SOURCE",
    "cublas_workspace_bytes",
    "default_workspace",
    "exllama_scratch",
    "separate_cublaslt",
]

FORMULA = (
    "cuBLAS (+ cuBLASLt before torch 2.12) workspace per process (+ QLoRA dequantization "
    "buffer, autocast weight cache, exllama scratch)"
)
BLAS_PART = "cuBLAS/cuBLASLt workspace"
KERNEL_SCRATCH_PART = "quantized kernel scratch (exllama)"

# aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize, one per (handle, stream), read
# from the released wheels (research/stack_behaviours.md section 5): ":4096:2:16:8" = 8,519,680 B
# by default; 32 MiB (4096 * 8 * 1024) for compute capability exactly 9.0 in torch 2.0-2.11, for
# major 9, 10 and 12 in 2.12, for major 9-12 in 2.14 (2.13 taken as 2.14).
CUBLAS_WORKSPACE_DEFAULT_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_LARGE_BYTES = 4096 * 8 * 1024
# aten/src/ATen/cuda/CUDABlas.cpp: a separate cuBLASLt workspace of 1024 KiB in torch 2.0-2.11;
# from 2.12 cuBLASLt shares the cuBLAS workspace of its handle and stream by default
# (unified_cublas_and_lt_workspaces(), TORCH_CUBLASLT_UNIFIED_WORKSPACE unset).
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024
CUBLAS_SOURCE = "pytorch aten/src/ATen/cuda/CublasHandlePool.cpp (getChosenWorkspaceSize)"
SOURCE = (
    f"{CUBLAS_SOURCE}; cuBLASLt shares it from torch 2.12, 1 MiB of its own before (CUDABlas.cpp)"
)
_HIPBLAS_SOURCE = "pytorch CublasHandlePool.cpp: hipBLAS 32 MiB, 128 MiB for gfx94x/gfx95x"
_UNIFIED = (2, 12)


def _torch(version: tuple[int, ...] | None) -> tuple[int, ...]:
    return version if version else (2, 15)  # the current release


def separate_cublaslt(torch_version: tuple[int, ...] | None = None) -> bool:
    """torch before 2.12 keeps a cuBLASLt workspace of its own beside cuBLAS's."""
    return _torch(torch_version)[:2] < _UNIFIED


def cublas_workspace_bytes(
    compute_capability: str | None,
    vendor: str = "nvidia",
    torch_version: tuple[int, ...] | None = None,
) -> int:
    """cuBLAS workspace of one handle/stream for a torch release (default: the current one).
    ROCm (hipBLAS) uses 32 MiB, 128 MiB on gfx94x."""
    if vendor == "amd":
        return 32 * MiB
    if compute_capability is None:
        return CUBLAS_WORKSPACE_LARGE_BYTES  # unknown device: the larger default
    major, _, minor = compute_capability.partition(".")
    t = _torch(torch_version)[:2]
    if t < (2, 12):
        large = (int(major), int(minor or 0)) == (9, 0)
    elif t < (2, 13):
        large = int(major) in (9, 10, 12)
    else:
        large = int(major) in (9, 10, 11, 12)
    return CUBLAS_WORKSPACE_LARGE_BYTES if large else CUBLAS_WORKSPACE_DEFAULT_BYTES


def default_workspace(
    compute_capability: str | None,
    vendor: str,
    gfx_target: str | None,
    torch_version: tuple[int, ...] | None = None,
) -> tuple[int, str]:
    """(bytes, source) of one process's library workspaces on a device type: cuBLAS (and,
    before torch 2.12, cuBLASLt's own) on NVIDIA, hipBLAS on AMD.

    Worked numbers (torch 2.15): an H100 (9.0) 33,554,432 B; an A100 (8.0) 8,519,680 B;
    torch 2.11 on an A100: 8,519,680 + 1,048,576 = 9,568,256 B; torch 2.11 on a B200 (10.0):
    8,519,680 + 1,048,576 = 9,568,256 B."""
    if vendor == "amd":
        ws = 128 * MiB if (gfx_target or "").startswith(("gfx94", "gfx95")) else 32 * MiB
        return ws, _HIPBLAS_SOURCE
    lt = CUBLASLT_WORKSPACE_BYTES if separate_cublaslt(torch_version) else 0
    return cublas_workspace_bytes(compute_capability, vendor, torch_version) + lt, SOURCE


def exllama_scratch(kernel: str, in_features: int, out_features: int) -> tuple[int, int]:
    """(fixed, per layer) bytes of AutoGPTQ's exllama scratch for one quantized linear layer:
    the fixed buffer is the largest layer's, allocated once per device; the per-layer bytes
    add up over every layer.

    ``exllamav2`` (auto-gptq 0.5.1 ``nn_modules/qlinear/qlinear_exllamav2.py`` 160-190,
    ``modeling/_utils.py`` 361-381): ``scratch_space_fixed`` = temp_dq (in x out x 2 + 128) +
    temp_fwd (out x max_input_len 2048 x max_batch_size 8 x 4 + 128), kept on
    ``model.device_tensors``; ``q_perm`` and ``q_invperm`` int16 (in,) per layer (lines 61-63).
    ``exllama`` (``modeling/_utils.py`` 306, 326-341): temp_dq fp16 of the largest qweight x 8
    elements = in x out x 2 B.

    Worked number: Llama 2 7B's gate/up projection (in 4,096, out 11,008) under exllamav2:
    90,177,536 + 128 + 721,420,288 + 128 = 811,598,080 B; its 32 x (6 x 4,096 + 11,008) input
    features add 4 x 1,138,688 = 4,554,752 B."""
    if kernel == "exllamav2":
        return 2 * in_features * out_features + 65_536 * out_features + 256, 4 * in_features
    return 2 * in_features * out_features, 0
