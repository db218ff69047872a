"""Diffusion pipelines run with diffusers' and transformers' own modules: the components built
on the meta device (``inventory``), CUDA's attention kernels emulated on fake tensors
(``attention``), and one pipeline call (``program``) for the trace tier."""
