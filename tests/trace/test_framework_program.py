"""The framework program in the trace tier: what it runs and what it does when the framework's
code cannot run on fake tensors."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
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


def _training(model: str, method: dict[str, Any], **fields: Any) -> BudgetRequest:
    workload = {
        "kind": "training",
        "model": {"source": "preset", "id": model},
        "micro_batch_size": 1,
        "sequence_length": 32,
        "method": method,
    }
    return msgspec.convert({"method": "trace", "workloads": [workload], **fields}, BudgetRequest)


def _adapters(req: BudgetRequest) -> tuple[int, int, str]:
    """(the trace's adapter bytes, the analytic tier's, the code the trace ran)."""
    traced = trace_budget(req)
    analytic = estimate(req.workloads, req.device, req.headroom, software=req.software)
    assert traced.trace is not None

    def adapters(b: Any) -> int:
        return next(x.bytes for x in b.devices[0].lines if x.component == Component.ADAPTERS)

    return adapters(traced), adapters(analytic), traced.trace.code


def test_all_linear_runs_peft_shorthand_and_matches_the_analytic_adapters() -> None:
    """``["all-linear"]`` reaches PEFT as its string shorthand (a list would name a module
    'all-linear'); the adapters PEFT builds on Qwen2.5 0.5B are the analytic tier's, to the
    byte: every projection of the 24 layers, rank 8, fp32 (r x (in + out) per projection:
    q 896 + 896, k and v 896 + 128, o 896 + 896, gate and up 896 + 4,864, down 4,864 + 896)."""
    req = _training("qwen2.5-0.5b", {"kind": "lora", "rank": 8, "target_modules": ["all-linear"]})
    traced, analytic, code = _adapters(req)
    assert "PeftModel" in code
    per_layer = 2 * 896 + 2 * (896 + 128) + 2 * 896 + 3 * (896 + 4864)
    assert traced == analytic == 8 * per_layer * 24 * 4


@pytest.mark.parametrize(("transformers", "experts"), [(None, False), ("4.46.0", True)])
def test_builtin_builders_adapt_experts_as_the_stack_builds_them(
    transformers: str | None, experts: bool
) -> None:
    """The built-in builders (what the trace falls back to where an MoE's routing reads tensor
    values) give routed experts adapters only under transformers < 5, as the analytic tier
    does (:attr:`vrambudget.core.stack.Stack.lora_reaches_experts`)."""
    software = {"framework": "transformers", "framework_version": transformers}
    req = _training(
        "qwen1.5-moe-a2.7b",
        {"kind": "lora", "rank": 8, "target_modules": ["q_proj", "up_proj"]},
        trace={"code": "builtin"},
        **({"software": software} if transformers else {}),
    )
    traced, analytic, code = _adapters(req)
    assert code == "built-in builders"
    # Qwen1.5-MoE-A2.7B: hidden 2,048, 24 layers; q 2,048 -> 2,048; the shared expert's up
    # 2,048 -> 5,632; 60 routed experts' up 2,048 -> 1,408 each
    dense = 8 * ((2048 + 2048) + (2048 + 5632))
    routed = 60 * 8 * (2048 + 1408)
    assert traced == analytic == (dense + experts * routed) * 24 * 4


def test_builtin_builders_quantize_experts_as_the_stack_does() -> None:
    """QLoRA on an MoE: bitsandbytes 4-bit reaches the routed experts only where the stack
    builds them as modules (transformers < 5); the built-in builders' weights are the analytic
    tier's under either stack, and the two differ (Stack.bnb_quantizes_experts)."""
    out = []
    for transformers in (None, "4.46.0"):
        software = {"framework": "transformers", "framework_version": transformers}
        req = _training(
            "qwen1.5-moe-a2.7b",
            {"kind": "qlora", "rank": 8},
            trace={"code": "builtin"},
            **({"software": software} if transformers else {}),
        )
        traced = trace_budget(req)
        analytic = estimate(req.workloads, req.device, req.headroom, software=req.software)

        def weights(b: Any) -> int:
            return next(x.bytes for x in b.devices[0].lines if x.component == Component.WEIGHTS)

        assert weights(traced) == weights(analytic)
        out.append(weights(traced))
    assert out[0] > 4 * out[1]  # fp32 experts against 4-bit ones


def test_expert_only_lora_under_transformers_4_is_traced() -> None:
    """Mixtral has no shared experts: LoRA on the expert modules alone (transformers < 5's
    ``w1``, ``w3``, ``w2``) has something to train under transformers < 5, and the trace's
    layout check reads the request's stack, not the default one (whose fused experts it cannot
    reach)."""
    software = {"framework": "transformers", "framework_version": "4.46.0"}
    method = {"kind": "lora", "rank": 8, "target_modules": ["w1", "w3", "w2"]}
    req = _training("mixtral-8x7b", method, trace={"code": "builtin"}, software=software)
    traced, analytic, _ = _adapters(req)
    # 8 experts x (gate and up 4,096 + 14,336, down 14,336 + 4,096) x rank 8 x 32 layers x 4 B
    assert traced == analytic == 8 * 3 * (4096 + 14336) * 8 * 32 * 4


@pytest.mark.parametrize("code", ["framework", "builtin"])
def test_modules_to_save_copies_match_peft_to_the_byte(code: str) -> None:
    """PEFT's ModulesToSaveWrapper on Qwen2.5 0.5B (tied: the lm_head module's copy is a tensor
    of its own) builds, and its step trains, exactly the analytic copies: adapters, gradients,
    AdamW moments and fp32 masters, component by component; the built-in builders the same.
    The peak, the trace tier's replay of the caching allocator included, is within 5% of the
    analytic one (the first step's stranded cache modelled: ``_stranded_by_first_step``)."""
    method = {
        "kind": "lora",
        "rank": 8,
        "target_modules": ["q_proj", "v_proj"],
        "modules_to_save": ["embed_tokens", "lm_head"],
    }
    req = _training("qwen2.5-0.5b", method, trace={"code": code})
    traced = trace_budget(req)
    analytic = estimate(req.workloads, req.device, req.headroom, software=req.software)
    assert traced.trace is not None
    assert ("PeftModel" in traced.trace.code) == (code == "framework")

    def lines(b: Any) -> dict[Component, int]:
        return {x.component: x.bytes for x in b.devices[0].lines}

    t, a = lines(traced), lines(analytic)
    table = 151_936 * 896
    # r x (in + out) of q (896 + 896) and v (896 + 128) x 24 layers, fp32; two bf16 tables
    adapters = 8 * (1792 + 1024) * 24 * 4
    assert t[Component.ADAPTERS] == a[Component.ADAPTERS] == adapters + 2 * table * 2
    for c in (Component.GRADIENTS, Component.OPTIMIZER_STATE, Component.MASTER_WEIGHTS):
        assert t[c] == a[c], c
    assert a[Component.MASTER_WEIGHTS] == 2 * table * 4
    ratio = analytic.devices[0].total_bytes / traced.devices[0].total_bytes
    assert 0.95 <= ratio <= 1.05, ratio


@pytest.mark.parametrize("code", ["framework", "builtin"])
def test_modules_to_save_norm_reaches_every_layernorm_as_peft_does(code: str) -> None:
    """PEFT's ``key.endswith("norm")`` reaches the final norm and both norms of each of Qwen2.5
    0.5B's 24 layers; with gate_proj (4,864 x 896 per layer), bf16 copies: (896 + 24 x 2 x 896 +
    24 x 4,864 x 896) x 2 B beside the adapters, in PEFT's own code, the built-in builders and
    the analytic tier alike."""
    method = {
        "kind": "lora",
        "rank": 8,
        "target_modules": ["q_proj", "v_proj"],
        "modules_to_save": ["norm", "gate_proj"],
    }
    traced, analytic, _ = _adapters(_training("qwen2.5-0.5b", method, trace={"code": code}))
    adapters = 8 * (1792 + 1024) * 24 * 4
    copies = (896 + 24 * 2 * 896 + 24 * 4864 * 896) * 2
    assert traced == analytic == adapters + copies


@pytest.mark.parametrize("saved", [["embed_tokens", "lm_head"], ["lm_head"]])
@pytest.mark.parametrize("code", ["framework", "builtin"])
def test_ensure_weight_tying_shares_one_copy(code: str, saved: list[str]) -> None:
    """PEFT's ensure_weight_tying on tied Qwen2.5 0.5B: the lm_head's wrapper takes the
    embedding copy's weight (peft 0.21.2 ModulesToSaveWrapper.update with tied_module), so
    embed_tokens and lm_head saved make one 151,936 x 896 bf16 copy, not two; lm_head alone
    saves the embedding too (_add_modules_to_save_to_tie)."""
    method = {
        "kind": "lora",
        "rank": 8,
        "target_modules": ["q_proj", "v_proj"],
        "modules_to_save": saved,
        "ensure_weight_tying": True,
    }
    traced, analytic, _ = _adapters(_training("qwen2.5-0.5b", method, trace={"code": code}))
    assert traced == analytic == 8 * (1792 + 1024) * 24 * 4 + 151_936 * 896 * 2
