"""Diffusion pipelines run with diffusers' and transformers' own modules: the components built
on the meta device (``inventory``) and one pipeline call (``program``) for the trace tier, with
CUDA's attention kernels emulated on fake tensors (:mod:`vrambudget.workloads.sdpa`)."""
