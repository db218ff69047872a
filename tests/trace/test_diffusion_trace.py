"""The diffusion tiers against each other: the closed-form inventories against the module trees
diffusers and transformers build on the meta device, and the analytic walk against the trace of
the libraries' own code on fake tensors (the same answer per component).

Tolerances (analytic vs trace), and why they are not zero:

* weights: exact (both place the same tensors; sequential offload: the analytic tier counts the
  running component's largest module for its whole forward, the trace each module in turn, so
  the analytic value is an upper bound of at most that module);
* activations at the allocated peak: within 1 % or 1 MiB (the walk leaves out tensors below
  1 MiB other than weights: time embeddings, norm statistics, token ids; SD3 with model offload
  peaks while encoding, where the activations are 11 MB); FLUX with true CFG 7 %;
* peak reserved: within 2 % (the allocator model replays both streams; the weights' order of
  allocation differs: module order in the trace, inventory-group order in the walk, so unsplit
  remainders of blocks land differently); sequential offload 8 %.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import msgspec
import pytest

from vrambudget.core.diffusion.budget import diffusion_outcome
from vrambudget.core.diffusion.configs import read_config
from vrambudget.core.diffusion.counts import component_inventory
from vrambudget.core.diffusion.pipeline import CLASSES
from vrambudget.core.diffusion.presets import presets
from vrambudget.core.formulas.gemm_workspaces import gemm_workspaces
from vrambudget.core.overheads import DEFAULT_OVERHEADS
from vrambudget.core.spec import BudgetRequest
from vrambudget.core.spec.diffusion import ImageGenerationWorkload
from vrambudget.trace.diffusion import trace_image_generation
from vrambudget.trace.engine import trace_budget
from vrambudget.workloads.diffusion.inventory import framework_inventory

COMPONENTS = [
    (p.id, role, dict(CLASSES[p.class_name])[role])
    for p in presets().values()
    for role in p.components
]


def _key(inv: Any) -> collections.Counter[tuple[str, tuple[int, ...], bool]]:
    c: collections.Counter[tuple[str, tuple[int, ...], bool]] = collections.Counter()
    for g in inv.groups:
        c[(g.module, g.tensors, g.keep_fp32)] += g.count
    return c


@pytest.mark.parametrize(
    ("preset", "role", "cls"), COMPONENTS, ids=[f"{p}:{r}" for p, r, _ in COMPONENTS]
)
def test_closed_form_equals_the_framework_module_tree(preset: str, role: str, cls: str) -> None:
    """Every module with parameters: its class, the elements of each tensor, whether the loader
    keeps it in fp32 at fp16 -- counted the same; buffers the same size, dtype and persistence."""
    config = presets()[preset].components[role].config
    closed = component_inventory(cls, read_config(cls, config, role), role)
    built = framework_inventory(cls, config, role)
    assert _key(closed) == _key(built)
    assert sorted((b.numel, b.dtype, b.persistent) for b in closed.buffers) == sorted(
        (b.numel, b.dtype, b.persistent) for b in built.buffers
    )


def _workload(preset: str, px: int, b: int, **kw: Any) -> ImageGenerationWorkload:
    return msgspec.convert(
        {
            "kind": "image_generation",
            "pipeline": {"source": "preset", "id": preset},
            "height": px,
            "width": px,
            "batch_size": b,
            **kw,
        },
        ImageGenerationWorkload,
    )


def _compare(w: ImageGenerationWorkload, act_tol: float, reserved_tol: float) -> dict[str, Any]:
    spaces = gemm_workspaces(DEFAULT_OVERHEADS.workspace_bytes)
    _, a = diffusion_outcome(w, spaces)
    t0 = time.perf_counter()
    t = trace_image_generation(w, workspaces=spaces)
    seconds = time.perf_counter() - t0
    weights_a, weights_t = a.components.get("weights", 0), t.components.get("weights", 0)
    if w.cpu_offload == "sequential":
        assert 0 <= weights_a - weights_t <= 200 * 2**20
    else:
        assert weights_a == weights_t
    act_a, act_t = a.components.get("activations", 0), t.components.get("activations", 0)
    assert abs(act_a - act_t) <= max(act_tol * act_t, 2**20), (act_a, act_t)
    assert a.components.get("runtime_workspace") == t.components.get("runtime_workspace")
    assert abs(a.peak_reserved - t.peak_reserved_bytes) <= reserved_tol * t.peak_reserved_bytes
    assert a.peak_phase == t.peak_phase
    return {"analytic": a, "trace": t, "seconds": seconds}


def test_sd15_small_matches_the_trace() -> None:
    """SD 1.5 at 256 x 256 (a second): the fast tier's end-to-end check."""
    _compare(_workload("sd-1.5", 256, 1), 0.01, 0.02)


def test_trace_budget_through_the_engine() -> None:
    """``method: trace`` answers image_generation with the traced lines; the analytic answer of
    the same request agrees with it within 2 %."""
    body = {
        "method": "trace",
        "workloads": [
            {"kind": "image_generation", "pipeline": {"source": "preset", "id": "sd-1.5"},
             "height": 256, "width": 256}
        ],
        "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
    }  # fmt: skip
    r = msgspec.convert(body, BudgetRequest)
    traced = trace_budget(r)
    assert traced.method == "trace"
    assert traced.trace is not None and "diffusers" in traced.trace.code
    from vrambudget.core.estimate import estimate

    analytic = estimate(r.workloads, r.device, r.headroom)
    assert abs(traced.total_bytes - analytic.total_bytes) <= 0.02 * traced.total_bytes
    weights = {line.component: line.bytes for line in traced.devices[0].lines}["weights"]
    assert weights == 2_132_471_230


GRID = [
    ("sd-1.5", 512, 1, {}),
    ("sd-1.5", 512, 4, {}),
    ("sd-1.5", 512, 1, {"vae_tiling": True}),  # 64 latents: one tile, not tiled
    ("sd-1.5", 512, 4, {"vae_tiling": True}),
    ("sd-1.5", 1024, 1, {"vae_tiling": True}),  # 128 latents: 3 x 3 tiles
    ("sd-1.5", 512, 1, {"attention_slicing": "auto"}),
    ("sd-1.5", 512, 1, {"cpu_offload": "model"}),
    ("sdxl-base-1.0", 1024, 1, {}),
    ("sdxl-base-1.0", 1024, 4, {}),
    ("sdxl-base-1.0", 1024, 1, {"vae_tiling": True}),
    ("sdxl-base-1.0", 1024, 4, {"vae_tiling": True}),
    ("sdxl-base-1.0", 1024, 2, {"vae_slicing": True}),
    ("sdxl-base-1.0", 1024, 1, {"cpu_offload": "sequential"}),
    ("sd3-medium", 1024, 1, {}),
    ("sd3-medium", 1024, 1, {"cpu_offload": "model"}),
    ("flux.1-schnell", 1024, 1, {}),
    ("flux.1-dev", 1024, 1, {"cpu_offload": "model", "guidance": True}),
]


@pytest.mark.trace_grid
@pytest.mark.parametrize(
    ("preset", "px", "b", "kw"),
    GRID,
    ids=[f"{p}-{px}-b{b}-" + "-".join(f"{k}={v}" for k, v in kw.items()) for p, px, b, kw in GRID],
)
def test_analytic_matches_the_trace(preset: str, px: int, b: int, kw: dict[str, Any]) -> None:
    w = _workload(preset, px, b, **kw)
    act_tol = 0.07 if kw.get("guidance") else 0.01
    reserved_tol = 0.08 if kw.get("cpu_offload") == "sequential" else 0.02
    _compare(w, act_tol, reserved_tol)


def test_bf16_below_sm80_runs_the_math_path_in_both_tiers() -> None:
    """SD 1.5 at 256 x 256 in bf16 on a GPU without FlashAttention (a T4): the memory-efficient
    kernel takes no bf16 below sm80, so every attention runs SDPA's math path. The walk and
    the trace agree within 1% (176.2 MB of activations each on 2026-12-07, against 100.7 MB
    with flash); fp16 takes the memory-efficient kernel there, as much as flash."""
    spaces = gemm_workspaces(DEFAULT_OVERHEADS.workspace_bytes)
    bf16 = _workload("sd-1.5", 256, 1, precision="bf16")
    _, flash = diffusion_outcome(bf16, spaces)
    _, walked = diffusion_outcome(bf16, spaces, flash_hw=False)
    traced = trace_image_generation(bf16, workspaces=spaces, flash_hw=False)
    act_w, act_t = walked.components["activations"], traced.components["activations"]
    assert abs(act_w - act_t) <= 0.01 * act_t
    assert act_w > 1.5 * flash.components["activations"]
    fp16 = _workload("sd-1.5", 256, 1, precision="fp16")
    _, a = diffusion_outcome(fp16, spaces, flash_hw=False)
    _, b = diffusion_outcome(fp16, spaces)
    assert a.components["activations"] == b.components["activations"]
