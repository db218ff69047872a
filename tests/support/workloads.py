"""Workloads as the API decodes them, and the tiny probe workloads the agent tests run."""

from __future__ import annotations

import msgspec

from vrambudget.agent.examples import TINY_MODEL
from vrambudget.core.estimate import estimate
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest, Workload


def workload(**fields: object) -> Workload:
    """Decode a workload exactly as the API would (defaults, tags and checks included)."""
    return msgspec.convert(fields, Workload)


def serving_budget(gpu_id: str, model: str = "llama-3.1-8b", **fields: object) -> Budget:
    """The service's budget of an ``llm_serving`` workload of a preset on a catalog GPU, the
    request decoded as the API decodes it."""
    req = msgspec.convert(
        {
            "workloads": [
                {"kind": "llm_serving", "model": {"source": "preset", "id": model}, **fields}
            ],
            "device": {"source": "catalog", "id": gpu_id},
        },
        BudgetRequest,
    )
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
