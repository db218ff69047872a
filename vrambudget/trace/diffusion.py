"""The trace tier for image generation: the pipeline's components built by diffusers and
transformers, one call run on fake tensors (:mod:`vrambudget.workloads.diffusion.program`),
every allocation recorded and replayed through the caching-allocator model."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vrambudget.core.diffusion.pipeline import resolve_pipeline
from vrambudget.core.spec.diffusion import ImageGenerationWorkload
from vrambudget.workloads import kernels
from vrambudget.workloads.diffusion.inventory import library
from vrambudget.workloads.diffusion.program import prepare_diffusion

from .recorder import Recorder
from .replay import Replay, replay

__all__ = ["trace_image_generation", "trace_image_generation_code"]


def trace_image_generation(
    w: ImageGenerationWorkload,
    *,
    iterations: int = 2,
    expandable_segments: bool = False,
    workspaces: tuple[tuple[str, int], ...] = (),
    field: str = "workloads[0]",
    flash_hw: bool = True,
) -> Replay:
    """Trace one process of ``w``: ``iterations`` denoising steps between the prompt encoding
    and the VAE decode, then replay; on a device with or without FlashAttention
    (``flash_hw``)."""
    pipeline = resolve_pipeline(w, field)
    recorder = Recorder(gemm_workspaces=workspaces)
    program = prepare_diffusion(w, pipeline, recorder, torch.device("cpu"))  # meta modules
    with FakeTensorMode(), kernels.emulation(flash_hw), recorder.recording():
        program.run(iterations)
        del program
    return replay(recorder.trace, expandable_segments=expandable_segments)


def trace_image_generation_code(
    w: ImageGenerationWorkload,
    *,
    iterations: int = 2,
    expandable_segments: bool = False,
    workspaces: tuple[tuple[str, int], ...] = (),
    field: str = "workloads[0]",
    flash_hw: bool = True,
) -> tuple[Replay, str]:
    """The replay and the words saying which code ran (the trace engine's ``code``)."""
    r = trace_image_generation(
        w,
        iterations=iterations,
        expandable_segments=expandable_segments,
        workspaces=workspaces,
        field=field,
        flash_hw=flash_hw,
    )
    pipeline = resolve_pipeline(w, field)
    return r, f"framework: {library()} {pipeline.class_name}"
