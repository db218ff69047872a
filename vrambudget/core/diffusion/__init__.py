"""Diffusion pipelines (``diffusers``): a UNet or a DiT/MMDiT denoiser, a VAE and text encoders.

``presets`` (the pipeline catalog, ``data/pipelines.json``), ``configs`` (a component's
``config.json`` read with the library's defaults), ``inventory`` and ``counts`` (each
component's modules and parameters in closed form), ``pipeline`` (a workload resolved: its
components, dtype and the pipeline's call defaults), ``activations`` (the working set of text
encoding, one denoising step and the VAE decode), ``budget`` (the answer).

The package imports nothing at module level here, so that ``spec`` may read the preset ids.
"""
