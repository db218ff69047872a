"""LitGPT's loop keeps the last micro-batch's logits and loss -- so its autograd graph -- until
the next forward and loss are computed; with bitsandbytes < 0.43.2 every 4-bit layer's input
of that graph (``ctx.tensors``, which the backward does not free) is live through the next
forward (vrambudget/core/stack.py ``_PREVIOUS_STEP``)."""

from __future__ import annotations

from typing import Any

import msgspec

from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

PART = "previous micro-batch's 4-bit layer inputs (its graph is still referenced)"
QLORA = {
    "kind": "training",
    "model": {"source": "preset", "id": "llama-2-7b"},
    "precision": {"weights": "bf16"},
    "mixed_precision": "pure",
    "micro_batch_size": 2,
    "sequence_length": 512,
    "gradient_accumulation_steps": 4,
    "attention": "sdpa",
    "method": {
        "kind": "qlora",
        "rank": 32,
        "target_modules": ["q_proj", "v_proj"],
        "adapter_dtype": "bf16",
        "dropout": 0.05,
    },
}


def _budget(software: dict[str, Any]):
    req = msgspec.convert(
        {"workloads": [QLORA], "headroom": {"fraction": 0.0}, "software": software}, BudgetRequest
    )
    return estimate(req.workloads, req.device, req.headroom, software=req.software)


def _parts(b) -> dict[str, int]:
    d = b.devices[0]
    line = next(x for x in d.lines if x.component == "activations")
    return {p.name: p.bytes for p in line.parts}


def test_litgpt_keeps_the_previous_graphs_4bit_inputs_through_the_next_forward() -> None:
    """Llama 2 7B, 2 x 512 tokens, bf16: per layer the inputs of q/k/v (4,096), o (4,096),
    gate/up (4,096) and down (11,008), and the 4-bit LM head's input (4,096) once:
    1,024 x 2 x (32 x 23,296 + 4,096) = 1,535,115,264 B, in the forward phase, which becomes
    the peak."""
    b = _budget({"framework": "litgpt", "framework_version": "0.4.5"})
    d = b.devices[0]
    assert d.peak_phase == "forward"
    assert _parts(b)[PART] == 1024 * 2 * (32 * 23_296 + 4_096) == 1_535_115_264
    names = {x.name for x in b.stack.behaviours} if b.stack else set()
    assert "previous_step_graph" in names


def test_no_previous_inputs_where_bitsandbytes_frees_them_or_the_loop_drops_the_graph() -> None:
    fixed = _budget(
        {
            "framework": "litgpt",
            "framework_version": "0.4.5",
            "libraries": {"bitsandbytes": "0.43.2"},
        }
    )
    assert PART not in _parts(fixed)
    assert "previous_step_graph" not in {x.name for x in fixed.stack.behaviours}
    current = _budget({"framework": "litgpt"})  # 0.5.13 pins bitsandbytes 0.44
    assert PART not in _parts(current)
    assert "previous_step_graph" not in {x.name for x in current.stack.behaviours}
    hf = _budget({"framework": "transformers", "libraries": {"bitsandbytes": "0.42.0"}})
    assert PART not in _parts(hf)
    assert "previous_step_graph" not in {x.name for x in hf.stack.behaviours}
