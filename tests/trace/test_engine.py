"""The trace tier's budget (vrambudget/trace/engine.py): overheads it reports, calibrated values it
traces with."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

C = Component


def test_a_trace_budget_says_its_allocator_overhead_is_the_replay() -> None:
    from vrambudget.core.spec import BudgetRequest
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
