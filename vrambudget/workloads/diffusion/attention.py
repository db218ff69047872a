"""The diffusion pipelines' attention on fake tensors: the CUDA SDPA stand-in shared with the
transformers programs (:mod:`vrambudget.workloads.sdpa`). Diffusers' attention slicing
(``SlicedAttnProcessor``) does not call SDPA: it runs ``baddbmm`` and ``softmax`` per slice,
which the trace records as they are."""

from __future__ import annotations

from ..sdpa import cuda_sdpa, emulated_sdpa

__all__ = ["cuda_sdpa", "emulated_sdpa"]
