"""PEFT's ``modules_to_save`` (peft 0.21.2 ``utils/other.py`` ``ModulesToSaveWrapper.update``:
``copy.deepcopy(self.original_module)``, the original frozen): each named module adds a
trainable copy in its own dtype, with gradients, optimizer state and masters by that dtype.
Checked against hand computations and, on Qwen2.5 0.5B, against the trace tier running PEFT's
own code (and the built-in builders) on fake tensors."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from tests.support.workloads import budget_of, preset_body, training_statics
from vrambudget.core.budget.training import FIRST_STEP_PART
from vrambudget.core.components import Component
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.spec import BudgetRequest
from vrambudget.service.app import Settings, create_app

# Llama 3.1 8B: vocabulary 128,256 x hidden 4,096, untied; 32 layers; 8 KV heads of 128.
LLAMA_TABLE = 128_256 * 4096  # 525,336,576 parameters, one embedding or LM head
# LoRA r16 on q, k, v, o: 16 x (4,096 + 4,096 + 2 x (4,096 + 1,024) + 4,096 + 4,096) x 32
LLAMA_QKVO_R16 = 16 * 26_624 * 32  # 13,631,488 parameters
# Qwen2.5 0.5B: vocabulary 151,936 x hidden 896, LM head tied to the embedding.
QWEN_TABLE = 151_936 * 896  # 136,134,656


def _body(
    model: str,
    saved: list[str],
    kind: str = "lora",
    targets: list[str] | None = None,
    software: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    method = {
        "kind": kind,
        "rank": 16,
        "target_modules": targets or ["q_proj", "k_proj", "v_proj", "o_proj"],
        "modules_to_save": saved,
    }
    return preset_body(
        "training",
        model,
        "a100-sxm4-80gb",
        software,
        micro_batch_size=1,
        sequence_length=1024,
        method=method,
        **fields,
    )


def test_llama_embedding_and_head_copies_to_the_byte() -> None:
    """bf16 Llama 3.1 8B, master_fp32 (the default): the two copies are 2 x 525,336,576 bf16
    parameters beside the fp32 adapters; their gradients bf16, their masters and AdamW moments
    fp32."""
    st = training_statics(_body("llama-3.1-8b", ["embed_tokens", "lm_head"]))
    copies = 2 * LLAMA_TABLE
    assert st.adapter_bytes == LLAMA_QKVO_R16 * 4 + copies * 2 == 2_155_872_256
    assert st.trainable_params == LLAMA_QKVO_R16 + copies
    assert st.gradient_bytes == LLAMA_QKVO_R16 * 4 + copies * 2
    assert st.optimizer_bytes == 2 * 4 * (LLAMA_QKVO_R16 + copies) == 8_514_437_120
    assert st.master_bytes == copies * 4 == 4_202_692_608
    assert st.saved_parts == (
        ("LoRA adapters", 54_525_952),
        ("embed_tokens (modules_to_save copy)", LLAMA_TABLE * 2),
        ("lm_head (modules_to_save copy)", LLAMA_TABLE * 2),
    )
    # The optimizer step upcasts the last trainable tensor's gradient: the LM head's copy.
    assert st.step_upcast_bytes == LLAMA_TABLE * 2


def test_pure_keeps_the_copies_state_in_their_dtype() -> None:
    """mixed_precision pure (transformers' Trainer on a bf16-loaded model: torch's AdamW state
    is zeros_like the parameter): no masters, bf16 moments for the copies, fp32 for the fp32
    adapters."""
    st = training_statics(_body("llama-3.1-8b", ["embed_tokens"], mixed_precision="pure"))
    assert st.master_bytes == 0
    assert st.optimizer_bytes == 2 * (4 * LLAMA_QKVO_R16 + 2 * LLAMA_TABLE)
    assert st.gradient_bytes == 4 * LLAMA_QKVO_R16 + 2 * LLAMA_TABLE


def test_qlora_copies_are_fp32_as_prepare_model_for_kbit_training_left_them() -> None:
    """QLoRA: prepare_model_for_kbit_training casts the embedding and LM head to fp32 before
    get_peft_model copies them (peft 0.21.2 utils/other.py 203-208): fp32 copies, fp32
    gradients, no masters."""
    plain = training_statics(_body("llama-3.1-8b", [], "qlora"))
    st = training_statics(_body("llama-3.1-8b", ["embed_tokens", "lm_head"], "qlora"))
    assert st.adapter_bytes - plain.adapter_bytes == 2 * LLAMA_TABLE * 4
    assert st.gradient_bytes - plain.gradient_bytes == 2 * LLAMA_TABLE * 4
    assert st.master_bytes == plain.master_bytes == 0
    assert st.weights_bytes == plain.weights_bytes  # the originals stay, frozen


def test_unsloth_trains_an_fp16_copy_in_fp32() -> None:
    """Unsloth promotes an fp16 copy to fp32 (unsloth 2026.10.9 models/llama.py
    _offload_frozen_module_for_training); transformers keeps it fp16."""

    def copy_bytes(framework: str) -> int:
        body = _body(
            "llama-3.1-8b",
            ["lm_head"],
            precision={"weights": "fp16", "compute": "fp16"},
            software={"framework": framework},
        )
        return training_statics(body).saved_parts[1][1]

    assert copy_bytes("unsloth") == LLAMA_TABLE * 4
    assert copy_bytes("transformers") == LLAMA_TABLE * 2


def test_a_tied_head_gets_its_own_copy() -> None:
    """Qwen2.5 0.5B ties lm_head to embed_tokens; PEFT deep-copies the lm_head module (its
    weight the embedding's) into a tensor of its own: naming both makes two copies."""
    one = training_statics(_body("qwen2.5-0.5b", ["lm_head"]))
    both = training_statics(_body("qwen2.5-0.5b", ["embed_tokens", "lm_head"]))
    none = training_statics(_body("qwen2.5-0.5b", []))
    assert one.adapter_bytes - none.adapter_bytes == QWEN_TABLE * 2
    assert both.adapter_bytes - none.adapter_bytes == 2 * QWEN_TABLE * 2
    warnings = budget_of(_body("qwen2.5-0.5b", ["embed_tokens", "lm_head"])).warnings
    assert any("two diverging copies" in w for w in warnings)


def test_a_norm_and_a_projection_are_copied_whole() -> None:
    """PEFT matches the end of each module's name: ``norm`` reaches the final norm (4,096) and
    every layer's input_layernorm and post_attention_layernorm (32 x 2 x 4,096); gate_proj
    every layer's (14,336 x 4,096) x 32: bf16 copies. ``input_layernorm`` alone, one of each
    layer's two norms."""
    none = training_statics(_body("llama-3.1-8b", []))
    st = training_statics(_body("llama-3.1-8b", ["norm", "gate_proj"]))
    assert st.adapter_bytes - none.adapter_bytes == (4096 + 32 * 2 * 4096 + 32 * 14_336 * 4096) * 2
    one = training_statics(_body("llama-3.1-8b", ["input_layernorm"]))
    assert one.adapter_bytes - none.adapter_bytes == 32 * 4096 * 2
    assert one.saved_parts[1] == ("input_layernorm (modules_to_save copy)", 32 * 4096 * 2)


def test_a_dotted_path_is_refused_naming_the_field() -> None:
    """A path to one module (``model.layers.0.mlp``) would copy that module only; the request
    takes module names, which reach every layer's."""
    with pytest.raises(msgspec.ValidationError) as exc:
        msgspec.convert(_body("llama-3.1-8b", ["model.layers.0.mlp.gate_proj"]), BudgetRequest)
    assert "modules_to_save" in str(exc.value)


@pytest.mark.parametrize(
    ("kind", "targets", "saved", "says"),
    [
        ("lora", None, ["q_proj"], "q_proj is also a LoRA target"),
        ("lora", ["all-linear"], ["down_proj"], "down_proj is also a LoRA target"),
        ("qlora", ["q_proj"], ["o_proj"], "o_proj is quantized here"),
    ],
)
def test_what_peft_refuses_is_a_422_naming_the_field(
    kind: str, targets: list[str] | None, saved: list[str], says: str
) -> None:
    body = _body("llama-3.1-8b", saved, kind, targets)
    with pytest.raises(InvalidWorkload) as exc:
        budget_of(body)
    assert exc.value.field == "workloads[0].method.modules_to_save"
    assert says in exc.value.message
    with TestClient(create_app(Settings())) as client:
        r = client.post("/v1/budgets", json=body)
    assert r.status_code == 422, r.text
    assert says in r.text


def test_names_that_match_nothing_are_said() -> None:
    b = budget_of(_body("llama-3.1-8b", ["score"]))
    assert any("modules_to_save score match no module" in w for w in b.warnings)
    lines = {x.component: x.bytes for x in b.devices[0].lines}
    assert lines == {
        x.component: x.bytes for x in budget_of(_body("llama-3.1-8b", [])).devices[0].lines
    }


def test_master_fp32_copies_are_explained() -> None:
    b = budget_of(_body("llama-3.1-8b", ["embed_tokens"]))
    assert any("say mixed_precision 'pure'" in w for w in b.warnings)
    assert not any(
        "say mixed_precision" in w
        for w in budget_of(_body("llama-3.1-8b", ["embed_tokens"], "qlora")).warnings
    )


def test_the_adapters_line_is_itemized() -> None:
    b = budget_of(_body("llama-3.1-8b", ["embed_tokens", "lm_head"]))
    (line,) = [x for x in b.devices[0].lines if x.component == Component.ADAPTERS]
    assert [p.name for p in line.parts] == [
        "LoRA adapters",
        "embed_tokens (modules_to_save copy)",
        "lm_head (modules_to_save copy)",
    ]
    assert sum(p.bytes for p in line.parts) == line.bytes


def test_the_first_step_strands_the_backward_cache() -> None:
    """A copy's AdamW moment (525,336,576 x 4 B) outsizes every block the forward and backward
    freed (the fp32 logits, 1,024 x 128,256 x 4 B): the first step's states take new segments
    and the backward's cached bytes stay reserved beside them."""
    b = budget_of(_body("llama-3.1-8b", ["embed_tokens", "lm_head"]))
    d = b.devices[0]
    assert d.peak_phase == "optimizer_step"
    (line,) = [x for x in d.lines if x.component == Component.ALLOCATOR_OVERHEAD]
    assert FIRST_STEP_PART in [p.name for p in line.parts]
    # A norm's copy is far smaller than the logits: no such part.
    small = budget_of(_body("llama-3.1-8b", ["norm"])).devices[0]
    (line,) = [x for x in small.lines if x.component == Component.ALLOCATOR_OVERHEAD]
    assert FIRST_STEP_PART not in [p.name for p in line.parts]


def test_zero3_shards_the_copies_like_every_parameter() -> None:
    """ZeRO-3 / FSDP FULL_SHARD over 4 ranks: each rank holds a quarter of each bf16 copy (the
    LoRA adapters are counted whole, as before)."""
    par = {"data": 4, "zero_stage": 3}
    st = training_statics(_body("llama-3.1-8b", ["embed_tokens", "lm_head"], parallelism=par))
    assert st.saved_parts[1:] == (
        ("embed_tokens (modules_to_save copy)", LLAMA_TABLE * 2 // 4),
        ("lm_head (modules_to_save copy)", LLAMA_TABLE * 2 // 4),
    )
    assert st.adapter_bytes == 54_525_952 + 2 * LLAMA_TABLE * 2 // 4


@pytest.mark.parametrize("saved", [["embed_tokens", "lm_head"], ["lm_head"], ["embed_tokens"]])
def test_ensure_weight_tying_shares_the_embedding_copy(saved: list[str]) -> None:
    """With PEFT's ensure_weight_tying a name that is exactly embed_tokens or lm_head saves the
    embedding and ties the head to its copy (peft 0.21.2 _add_modules_to_save_to_tie): one
    table, no warning about two copies, the shared gradient counted."""
    body = _body("qwen2.5-0.5b", saved)
    body["workloads"][0]["method"]["ensure_weight_tying"] = True
    none = training_statics(_body("qwen2.5-0.5b", []))
    st = training_statics(body)
    assert st.adapter_bytes - none.adapter_bytes == QWEN_TABLE * 2
    assert st.saved_tied_accumulate_bytes == QWEN_TABLE * 2  # bf16 gradients (master_fp32)
    warnings = budget_of(body).warnings
    assert not any("two diverging copies" in w for w in warnings)
    assert any("shares the embedding's copy" in w for w in warnings)


def test_ensure_weight_tying_needs_peft_s_names_and_a_tied_model() -> None:
    """GPT-2's ``wte`` is not among PEFT's EMBEDDING_LAYER_NAMES: its copy stays untied (PEFT
    warns); Llama 3.1 8B does not tie at all."""
    gpt2 = _body("gpt2", ["wte"], targets=["c_attn"])
    gpt2["workloads"][0]["method"]["ensure_weight_tying"] = True
    assert training_statics(gpt2).saved_tied_accumulate_bytes == 0
    assert any("ties only when" in w for w in budget_of(gpt2).warnings)
    llama = _body("llama-3.1-8b", ["embed_tokens", "lm_head"])
    llama["workloads"][0]["method"]["ensure_weight_tying"] = True
    assert training_statics(llama).adapter_bytes == 2_155_872_256  # two copies, as without it
    assert any("does not tie" in w for w in budget_of(llama).warnings)
