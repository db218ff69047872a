"""The BLAS workspaces a process's first GEMM allocates through the caching allocator, as the
allocations both walking tiers place in their streams (the analytic walk of an image-generation
call, :mod:`vrambudget.core.diffusion.call`, and the trace tier's recorder).

One number sizes them: the device type's ``workspace_bytes`` (the built-in cuBLAS + cuBLASLt
default of :mod:`.runtime_workspace`, or a calibration profile's measurement of a first GEMM).
On NVIDIA before torch 2.12 it is split into the cuBLAS workspace and the separate 1 MiB
cuBLASLt one (``CUDABlas.cpp``; a calibrated total below 1 MiB, ``CUBLAS_WORKSPACE_CONFIG=:16:8``,
is all cuBLASLt, so neither part goes negative); from 2.12 cuBLASLt shares the cuBLAS workspace.
ROCm has one hipBLAS workspace.
"""

from __future__ import annotations

from .runtime_workspace import CUBLASLT_WORKSPACE_BYTES

__all__ = ["gemm_workspaces"]


def gemm_workspaces(
    workspace_bytes: int, vendor: str = "nvidia", separate_lt: bool = False
) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of each workspace allocation of one process; ``separate_lt``: torch
    before 2.12.

    Worked numbers: an H100 (``workspace_bytes`` 33,554,432) -> cuBLAS 33,554,432; torch 2.11
    (34,603,008, separate) -> cuBLAS 33,554,432 + cuBLASLt 1,048,576; a calibrated 131,072,
    separate -> cuBLAS 0 + cuBLASLt 131,072; an MI300X (134,217,728, ``amd``) -> hipBLAS
    134,217,728."""
    ws = max(0, workspace_bytes)
    if vendor == "amd":
        return (("hipBLAS workspace", ws),)
    if not separate_lt:
        return (("cuBLAS workspace (shared with cuBLASLt)", ws),)
    lt = min(CUBLASLT_WORKSPACE_BYTES, ws)
    return (("cuBLAS workspace", ws - lt), ("cuBLASLt workspace", lt))
