"""bitsandbytes 4-bit on a mixture of experts follows the stack's modelling code: transformers
5 keeps routed experts as fused 3-D parameters, which bitsandbytes' conversion (``nn.Linear``
modules only) skips, so they stay in the load dtype, and PEFT's
``prepare_model_for_kbit_training`` casts them to fp32 with every non-4-bit parameter
(bitsandbytes-foundation/bitsandbytes#1849); transformers < 5 builds each expert as
``nn.Linear`` modules, which it quantizes. Mixtral 8x7B by hand: hidden 4,096, 32 layers,
8 experts of 14,336, 8 KV heads of 128, vocabulary 32,000, untied head."""

from __future__ import annotations

from typing import Any

import msgspec

from tests.support.workloads import budget_of, preset_body
from vrambudget.core.components import Component

EXPERTS = 8 * 3 * 4096 * 14336 * 32  # 45,097,156,608 parameters
ATTENTION = (2 * 4096 * 4096 + 2 * 4096 * 1024) * 32  # q, o + k, v: 1,342,177,280
EMBED_HEAD = 2 * 32000 * 4096  # 262,144,000
NORMS = (2 * 32 + 1) * 4096  # 266,240
ROUTER = 8 * 4096 * 32  # 1,048,576
V4 = {"framework": "transformers", "framework_version": "4.46.0"}


def _answer(workload: dict[str, Any], software: dict[str, str] | None = None) -> Any:
    fields = dict(workload)
    return budget_of(preset_body(fields.pop("kind"), "mixtral-8x7b", None, software, **fields))


def _weights(b: Any) -> int:
    return next(x.bytes for x in b.devices[0].lines if x.component == Component.WEIGHTS)


QLORA = {
    "kind": "training",
    "sequence_length": 512,
    "checkpointing": "full",
    "method": {"kind": "qlora", "rank": 16},
}


def test_qlora_under_transformers_5_keeps_the_experts_fp32() -> None:
    """4-bit attention (half a byte each), everything else fp32 (PEFT's upcast), experts
    included: 182,113,550,336 B; and the answer says why."""
    b = _answer(QLORA)
    fp32 = EXPERTS + EMBED_HEAD + NORMS + ROUTER
    assert _weights(b) == ATTENTION // 2 + 4 * fp32 == 182_113_550_336
    (note,) = [w for w in b.warnings if "bitsandbytes 4-bit leaves the routed experts" in w]
    assert "transformers 5.23.0" in note and "fp32" in note


def test_qlora_under_transformers_4_quantizes_every_expert() -> None:
    b = _answer(QLORA, V4)
    assert _weights(b) == (ATTENTION + EXPERTS) // 2 + 4 * (EMBED_HEAD + NORMS + ROUTER)
    assert _weights(b) == 24_273_502_208
    assert not [w for w in b.warnings if "routed experts" in w]


def test_bnb_inference_keeps_the_experts_16_bit_unless_told() -> None:
    """Inference loads in bf16: the experts stay bf16 under transformers 5 (91,392,319,488 B);
    ``quantize_experts: true`` (a loader that reaches fused experts) 4-bits them."""
    q = {"scheme": "bnb_4bit"}
    infer = {"kind": "inference", "precision": {"quantization": q}}
    b = _answer(infer)
    assert _weights(b) == ATTENTION // 2 + 2 * (EXPERTS + EMBED_HEAD + NORMS + ROUTER)
    assert _weights(b) == 91_392_319_488
    assert any("quantize_experts: true" in w for w in b.warnings)
    told = {"kind": "inference", "precision": {"quantization": {**q, "quantize_experts": True}}}
    assert _weights(_answer(told)) == (ATTENTION + EXPERTS) // 2 + 2 * (EMBED_HEAD + NORMS + ROUTER)
    assert _weights(_answer(told)) == _weights(_answer(infer, V4))


def test_lora_on_a_bnb_base_keeps_the_experts_16_bit_and_says_so() -> None:
    """LoRA over a bitsandbytes 4-bit base (not QLoRA: no kbit upcast) under transformers 5:
    the experts stay bf16, and the warning says bf16 (not fp32) and names the override."""
    lora = {
        "kind": "training",
        "sequence_length": 512,
        "checkpointing": "full",
        "precision": {"quantization": {"scheme": "bnb_4bit"}},
        "method": {"kind": "lora", "rank": 16},
    }
    b = _answer(lora)
    (note,) = [w for w in b.warnings if "routed experts unquantized" in w]
    assert "stay in bf16" in note and "quantize_experts: true" in note


def test_an_explicit_no_says_as_requested() -> None:
    q = {"scheme": "bnb_4bit", "quantize_experts": False}
    b = _answer({"kind": "inference", "precision": {"quantization": q}}, V4)
    (note,) = [w for w in b.warnings if "routed experts unquantized" in w]
    assert note.endswith("as requested: bf16")
    assert _weights(b) == ATTENTION // 2 + 2 * (EXPERTS + EMBED_HEAD + NORMS + ROUTER)


def test_a_fit_says_why_too() -> None:
    """A fit answer carries the workload's own warnings once, beside the per-GPU ones: why
    Mixtral's QLoRA fits no single 80 GB GPU under transformers 5."""
    from vrambudget.core.fit import fit
    from vrambudget.core.spec import FitRequest

    body = {
        "workloads": [{"model": {"source": "preset", "id": "mixtral-8x7b"}, **QLORA}],
        "devices": [{"source": "catalog", "id": "a100-sxm4-80gb"}],
    }
    answer = fit(msgspec.convert(body, FitRequest))
    (note,) = [w for w in answer.warnings if "routed experts unquantized" in w]
    assert "fp32" in note
    assert answer.gpus[0].layouts[0].verdict == "does_not_fit"
