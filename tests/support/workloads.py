"""Workloads as the API decodes them, and the tiny probe workloads the agent tests run."""

from __future__ import annotations

from typing import Any

import msgspec

from vrambudget.agent.examples import TINY_MODEL
from vrambudget.core.deployed import deploy
from vrambudget.core.estimate import estimate
from vrambudget.core.formulas.activations.dims import DeviceDims
from vrambudget.core.resolve import resolve_model
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest, TrainingWorkload, Workload
from vrambudget.core.stack import resolve_stack
from vrambudget.core.statics import StageStatic, statics_for


def workload(**fields: object) -> Workload:
    """Decode a workload exactly as the API would (defaults, tags and checks included)."""
    return msgspec.convert(fields, Workload)


def preset_body(
    kind: str,
    model: str,
    gpu_id: str | None = None,
    software: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A ``/v1/budgets`` body: one workload of a preset (on a catalog GPU, under a software
    stack, where given)."""
    body: dict[str, Any] = {
        "workloads": [{"kind": kind, "model": {"source": "preset", "id": model}, **fields}]
    }
    if gpu_id is not None:
        body["device"] = {"source": "catalog", "id": gpu_id}
    if software:
        body["software"] = software
    return body


def budget_of(body: dict[str, Any]) -> Budget:
    """The analytic budget of a request body, decoded as the API decodes it."""
    req = msgspec.convert(body, BudgetRequest)
    return estimate(req.workloads, req.device, req.headroom, software=req.software)


def training_statics(body: dict[str, Any]) -> StageStatic:
    """The per-stage statics of a body's one-stage training workload, deployed, under its
    stack."""
    req = msgspec.convert(body, BudgetRequest)
    w = deploy(req.workloads[0])
    assert isinstance(w, TrainingWorkload)
    (st,) = statics_for(w, resolve_model(w.model), resolve_stack(req.software))
    return st


def serving_budget(gpu_id: str, model: str = "llama-3.1-8b", **fields: object) -> Budget:
    """The service's budget of an ``llm_serving`` workload of a preset on a catalog GPU, the
    request decoded as the API decodes it."""
    req = msgspec.convert(preset_body("llm_serving", model, gpu_id, **fields), BudgetRequest)
    return estimate(req.workloads, req.device, None, None, req.software)


# A model small enough that a real CPU probe of it takes about a second.
TINY = TINY_MODEL

LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""LoRA on every projection of a Llama-style layer, named one by one (PEFT's `all-linear`
on a Llama)."""
# The smallest model a probe child builds (one layer): for tests of the probe plumbing.
TINIEST = {
    "source": "dimensions",
    "hidden_size": 64,
    "num_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}
FP32 = {"weights": "fp32", "compute": "fp32"}
INFER = {
    "kind": "inference",
    "model": TINY,
    "batch_size": 2,
    "prompt_tokens": 32,
    "generated_tokens": 4,
    "precision": FP32,
}
QWEN_INFER = {
    "kind": "inference",
    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
    "batch_size": 1,
    "prompt_tokens": 8,
    "generated_tokens": 1,
}
"""A real preset left at its defaults (``precision`` ``auto``): for tests of resolution."""
TRAIN = {
    "kind": "training",
    "model": TINY,
    "sequence_length": 32,
    "precision": FP32,
    "mixed_precision": "pure",
    "optimizer": {"name": "adamw", "implementation": "for_loop"},
}


def attention_dims(heads: int, kv: int, d: int) -> DeviceDims:
    """One device's attention shapes (``heads`` query and ``kv`` K/V heads of width ``d``) and
    nothing else: for the attention formulas' tests."""
    return DeviceDims(
        h=heads * d, heads=heads, kv_heads=kv, qk_head_dim=d, v_head_dim=d, f=1, vocab=1,
        vocab_full=1, experts=0, top_k=0, f_expert=0, f_shared=0, ep=1, t=1,
    )  # fmt: skip


TINY_MISTRAL = {
    "model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024,
    "max_position_embeddings": 8192, "sliding_window": 128, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}  # fmt: skip
"""A Mistral whose every layer slides over 128 tokens, small enough that the scores dominate."""
TINY_BF16 = {
    "model": {"source": "hf_config", "config": TINY_MISTRAL},
    "precision": {"weights": "bf16", "compute": "bf16"},
}
