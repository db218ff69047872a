"""The framework program in the trace tier: what it runs and what it does when the framework's
code cannot run on fake tensors."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.spec import BudgetRequest, TraceOptions
from vrambudget.trace import engine
from vrambudget.trace.engine import trace_budget


def _request(**workload: Any) -> BudgetRequest:
    body = {
        "method": "trace",
        "workloads": [
            {
                "kind": "inference",
                "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                "batch_size": 2,
                "prompt_tokens": 64,
                "generated_tokens": 8,
                **workload,
            }
        ],
    }
    return msgspec.convert(body, BudgetRequest)


def test_flash_attention_runs_the_framework_code() -> None:
    """FlashAttention-2's mask function tests the mask's values (masking_utils.py
    flash_attention_mask: all ones -> None); the trace's unpadded batches take that branch
    without reading values (the schemathesis run found the data-dependent 500)."""
    budget = trace_budget(_request(attention="flash"))
    assert budget.trace is not None
    assert budget.trace.code == "framework: transformers 5.23.0 Qwen2ForCausalLM"


def test_code_that_reads_tensor_values_falls_back_to_the_builtin_builders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._subclasses.fake_tensor import DataDependentOutputException

    def data_dependent(*args: Any, **kwargs: Any) -> Any:
        import torch

        raise DataDependentOutputException(torch.ops.aten._local_scalar_dense.default)

    monkeypatch.setattr(engine, "prepare_framework", data_dependent)
    budget = trace_budget(_request())
    assert budget.trace is not None
    assert budget.trace.code.startswith("built-in builders (the framework's code depends on")


def test_the_builtin_code_is_asked_for_and_said() -> None:
    budget = trace_budget(msgspec.structs.replace(_request(), trace=TraceOptions(code="builtin")))
    assert budget.trace is not None and budget.trace.code == "built-in builders"
