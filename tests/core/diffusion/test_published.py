"""Published peak-memory measurements of diffusers pipelines against the analytic budget's
``max_memory_allocated`` (the replay's peak allocated bytes, without the CUDA context, which
PyTorch does not count).

Sources (the measuring scripts print ``torch.cuda.max_memory_allocated() / 1024**3`` as
"GB"; read here as GiB):

* huggingface/blog ``simple_sdxl_optimizations.md`` (commit
  11e799d7c87eef3c77efedfe2050f91c8351e181), "Exploring simple optimizations for SDXL": an
  A100 40 GB, SDXL base 1.0, 4 images per call at 1024 x 1024, table "Memory (GB)":
  "fp16 + SDPA (default) | 21.72", "default + model CPU offload | 20.21", "default + sequential
  CPU offload | 19.91", "default + VAE slicing | 15.40", "default + VAE slicing + sequential
  CPU offload | 11.47" (diffusers 0.21-era, PyTorch 2.0/2.1).
* huggingface/blog ``quanto-diffusers.md`` (commit 0dd3fc4335ed68054b1c9788653bfca90a07ece8),
  "Memory-efficient Diffusion Transformers with Quanto and Diffusers", an H100, PyTorch 2.4:
  "It takes 18.765 GB of GPU memory to run SD3 inference using FP16 precision."

Tolerance: 15 % for the two default (all-on-GPU) runs, whose software differs from the one
modelled (diffusers 0.42.1, PyTorch 2.13 kernels). The offloaded and sliced SDXL runs are not
reproduced: the published numbers are 5 to 8.5 GB above the analytic ones (and above the trace
tier's, which agrees with the analytic one within 2 %), and they are not consistent with one
another under any additive account (model offload, 20.21 GB, leaves only the VAE on the GPU at
the decode, so its decode alone would need ~19.9 GB, while all four images decoded beside all
weights, 21.72 GB, would leave ~15 GB for it). Their direction is asserted and the gap is
documented (docs/COMPONENTS.md, *Diffusion pipelines*): candidates are cuDNN convolution
workspaces (allocated through the caching allocator, modelled by neither tier), PyTorch 2.0's
fallback to math attention for the VAE's 512-wide head, and peak statistics not reset between
the runs of one notebook.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.diffusion.budget import diffusion_outcome
from vrambudget.core.formulas.gemm_workspaces import gemm_workspaces
from vrambudget.core.overheads import DEFAULT_OVERHEADS
from vrambudget.core.spec.diffusion import ImageGenerationWorkload

GiB = 2**30


def _allocated(preset: str, **kw: Any) -> float:
    w = msgspec.convert(
        {"kind": "image_generation", "pipeline": {"source": "preset", "id": preset}, **kw},
        ImageGenerationWorkload,
    )
    _, o = diffusion_outcome(w, gemm_workspaces(DEFAULT_OVERHEADS.workspace_bytes))
    return o.peak_allocated / GiB


@pytest.mark.parametrize(
    ("preset", "kw", "published"),
    [
        ("sdxl-base-1.0", {"batch_size": 4}, 21.72),
        ("sd3-medium", {}, 18.765),
    ],
    ids=["sdxl-fp16-4-images", "sd3-medium-fp16"],
)
def test_default_runs_within_15_percent(preset: str, kw: dict[str, Any], published: float) -> None:
    analytic = _allocated(preset, **kw)
    assert abs(analytic - published) / published <= 0.15, (analytic, published)


@pytest.mark.parametrize(
    ("kw", "published"),
    [
        ({"cpu_offload": "model"}, 20.21),
        ({"cpu_offload": "sequential"}, 19.91),
        ({"vae_slicing": True}, 15.40),
        ({"vae_slicing": True, "cpu_offload": "sequential"}, 11.47),
    ],
    ids=["model-offload", "sequential-offload", "vae-slicing", "slicing-sequential"],
)
def test_sdxl_memory_options_known_gap(kw: dict[str, Any], published: float) -> None:
    """Not reproduced (see the module docstring): the analytic peak is below the published one
    by 5 to 8.5 GiB; each option lowers the analytic peak, as it lowers the published one."""
    analytic = _allocated("sdxl-base-1.0", batch_size=4, **kw)
    default = _allocated("sdxl-base-1.0", batch_size=4)
    assert analytic < default
    assert 4.5 <= published - analytic <= 8.5, (analytic, published)
