"""The trace tier's budget (vrambudget/trace/engine.py): overheads it reports, calibrated values it
traces with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.workloads import TINY
from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

C = Component


def test_a_trace_budget_says_its_allocator_overhead_is_the_replay() -> None:
    from vrambudget.core.spec import BudgetRequest
    from vrambudget.trace.engine import trace_budget

    tiny = {
        "kind": "inference",
        "model": TINY,
        "batch_size": 1,
        "prompt_tokens": 16,
        "generated_tokens": 2,
    }
    req = msgspec.convert({"method": "trace", "workloads": [tiny]}, BudgetRequest)
    use = trace_budget(req).calibration
    assert use is not None and use.profile is None
    origins = {o.component: o.source for o in use.overheads}
    assert origins[C.ALLOCATOR_OVERHEAD].startswith("trace tier: replay")
    assert origins[C.CUDA_CONTEXT] == estimate(req.workloads).calibration.overheads[0].source


def test_a_trace_budget_fits_by_its_own_total() -> None:
    """``Budget.fit`` of a trace is counted from the traced total, not the analytic one."""
    from vrambudget.trace.engine import trace_budget

    tiny = {
        "kind": "inference",
        "model": {
            "source": "dimensions",
            "hidden_size": 128,
            "num_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 256,
            "vocab_size": 500,
        },
        "prompt_tokens": 16,
        "generated_tokens": 2,
    }
    capacity = 8 << 30
    req = msgspec.convert(
        {
            "method": "trace",
            "workloads": [tiny],
            "device": {"source": "custom", "memory_total_bytes": capacity},
        },
        BudgetRequest,
    )
    budget = trace_budget(req)
    analytic = estimate(req.workloads, req.device)
    assert budget.total_bytes != analytic.total_bytes
    f = budget.fit
    assert f is not None and f.fits and f.capacity_bytes == capacity
    assert f.used_bytes == budget.total_bytes
    assert f.free_bytes == capacity - budget.total_bytes


_H100_PROFILE = (
    '{"id": "h100-small-ws", "gpu_name": "NVIDIA H100 80GB HBM3", '
    '"gpu_id": "h100-sxm5-80gb", "torch_version": null, "cuda_version": null, '
    '"driver_version": null, "workspace_bytes": %d, "probe_ids": ["p1"]}'
)


def test_a_calibrated_workspace_below_the_cublaslt_size_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUBLAS_WORKSPACE_CONFIG=:16:8 (128 KiB) measured into a profile: the trace tier split it
    into cuBLAS = 128 KiB - 1 MiB (negative) and its replay raised (a 500)."""
    pytest.importorskip("torch")
    from vrambudget.trace.engine import trace_budget

    (tmp_path / "p.json").write_text(_H100_PROFILE % (128 << 10))
    monkeypatch.setenv("VRAMBUDGET_PROFILES_DIR", str(tmp_path))
    req = msgspec.convert(
        {
            "method": "trace",
            "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
            "workloads": [
                {
                    "kind": "inference",
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                    "batch_size": 1,
                    "prompt_tokens": 16,
                    "generated_tokens": 2,
                }
            ],
        },
        BudgetRequest,
    )
    budget = trace_budget(req)
    lines = {ln.component.value: ln.bytes for ln in budget.devices[0].lines}
    assert lines["runtime_workspace"] == 128 << 10


def test_a_lora_run_with_no_matching_target_is_a_semantic_422_not_a_crash() -> None:
    """Found by schemathesis: BERT's projections are ``attention.self.query`` etc., so LoRA's
    default targets (``q_proj`` ...) adapt nothing; torch refuses an optimizer without
    parameters. The analytic tier budgets it with a warning; the trace tier names the field."""
    from vrambudget.core.errors import InvalidWorkload
    from vrambudget.trace.engine import trace_budget

    request = msgspec.convert(
        {
            "method": "trace",
            "workloads": [
                {
                    "kind": "training",
                    "model": {"source": "preset", "id": "bert-base-uncased"},
                    "method": {"kind": "lora"},
                    "micro_batch_size": 1,
                    "sequence_length": 8,
                }
            ],
        },
        BudgetRequest,
    )
    with pytest.raises(InvalidWorkload) as info:
        trace_budget(request)
    assert info.value.field == "workloads[0].method.target_modules"
    analytic = estimate(request.workloads)
    assert any("no LoRA target module matches" in w for w in analytic.warnings)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        # no device: the larger cuBLAS default 4096 x 8 KiB = 33,554,432, shared with cuBLASLt
        # (torch >= 2.12)
        (None, (("cuBLAS workspace (shared with cuBLASLt)", 33_554_432),)),
        # sm80: ":4096:2:16:8" = 4096 KiB x 2 + 16 KiB x 8 = 8,519,680
        ("a100-sxm4-80gb", (("cuBLAS workspace (shared with cuBLASLt)", 8_519_680),)),
        # gfx942: one hipBLAS workspace of 128 MiB = 134,217,728
        ("mi300x-192gb", (("hipBLAS workspace", 134_217_728),)),
    ],
)
def test_both_tiers_place_the_same_gemm_workspaces(
    device: str | None, expected: tuple[tuple[str, int], ...]
) -> None:
    """One split of the device type's workspace serves the analytic image-generation walk and
    the trace tier's recorder: the diffusion budget's workspace parts are these allocations."""
    from vrambudget.core.device import resolve_device
    from vrambudget.core.formulas.gemm_workspaces import gemm_workspaces
    from vrambudget.core.overheads import DEFAULT_OVERHEADS
    from vrambudget.core.spec import CatalogDevice

    ctx = resolve_device(None if device is None else CatalogDevice(id=device))
    ov = ctx.overheads if ctx else DEFAULT_OVERHEADS
    assert gemm_workspaces(ov.workspace_bytes, ctx.vendor if ctx else "nvidia") == expected
    body: dict[str, Any] = {
        "workloads": [
            {"kind": "image_generation", "pipeline": {"source": "preset", "id": "sd-1.5"},
             "height": 256, "width": 256}
        ]
    }  # fmt: skip
    if device is not None:
        body["device"] = {"source": "catalog", "id": device}
    r = msgspec.convert(body, BudgetRequest)
    b = estimate(r.workloads, r.device, r.headroom)
    line = next(ln for ln in b.devices[0].lines if ln.component is C.RUNTIME_WORKSPACE)
    assert line.bytes == sum(n for _, n in expected)


def test_a_calibrated_workspace_below_the_cublaslt_size_is_all_cublaslt() -> None:
    """128 KiB measured (CUBLAS_WORKSPACE_CONFIG=:16:8) on torch < 2.12: cuBLAS 0 + cuBLASLt
    131,072; neither part negative. From 2.12 the one workspace is shared."""
    from vrambudget.core.formulas.gemm_workspaces import gemm_workspaces

    assert gemm_workspaces(131_072, separate_lt=True) == (
        ("cuBLAS workspace", 0),
        ("cuBLASLt workspace", 131_072),
    )
    assert gemm_workspaces(131_072) == (("cuBLAS workspace (shared with cuBLASLt)", 131_072),)
    assert gemm_workspaces(131_072, "amd") == (("hipBLAS workspace", 131_072),)


@pytest.mark.parametrize("code", ["framework", "builtin"])
def test_the_trace_resolves_the_adapters_dtype_as_the_analytic_tier(code: str) -> None:
    """A LoRA request that leaves ``adapter_dtype`` null under PEFT 0.8 (which casts adapters
    to a bf16 base's dtype): the traced adapters are bf16 in both codes, as the analytic tier
    counts them, not the installed PEFT's fp32."""
    from vrambudget.trace.engine import trace_budget

    request = msgspec.convert(
        {
            "method": "trace",
            "trace": {"code": code, "iterations": 2},
            "workloads": [
                {
                    "kind": "training",
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                    "precision": {"weights": "bf16"},
                    "mixed_precision": "pure",
                    "method": {"kind": "lora", "rank": 8},
                    "micro_batch_size": 1,
                    "sequence_length": 16,
                }
            ],
            "software": {"libraries": {"peft": "0.8.2"}},
        },
        BudgetRequest,
    )
    traced = trace_budget(request)
    analytic = estimate(request.workloads, software=request.software)

    def adapters(b: Any) -> int:
        return next(ln.bytes for ln in b.devices[0].lines if ln.component.value == "adapters")

    # qwen2.5-0.5b, r 8 on q/k/v/o over 24 layers: 8 x (896+896 + 2 x (896+128) + 896+896)
    # = 45,056 per layer, 1,081,344 in all, x 2 B
    assert adapters(analytic) == 1_081_344 * 2
    assert adapters(traced) == adapters(analytic)
