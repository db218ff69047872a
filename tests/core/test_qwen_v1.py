"""Qwen (v1), model_type ``qwen`` (trust_remote_code ``modeling_qwen.py``, which transformers
cannot build): its tensor inventory, its module names, and its own loss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.workloads import budget_of
from vrambudget.core.arch import lora_targeted, saved_by
from vrambudget.core.families import arch_from_hf_config
from vrambudget.core.hf_config import typed_config

CONFIGS = Path(__file__).parents[2] / "research" / "data" / "configs"


def _config(name: str) -> dict[str, Any]:
    return dict(json.loads((CONFIGS / f"Qwen--{name}.json").read_text())["config"])


def test_qwen_1_8b_parameters_by_hand() -> None:
    """Hidden 2,048, 24 layers, MLP halves of 11,008 // 2 = 5,504, vocabulary 151,936, untied.
    Per layer: c_attn 6,144 x 2,048 + its bias 6,144, attention c_proj 2,048 x 2,048, w1 and w2
    5,504 x 2,048 each, MLP c_proj 2,048 x 5,504, two RMSNorm weights of 2,048."""
    layer = 6144 * 2048 + 6144 + 2048 * 2048 + 2 * 5504 * 2048 + 2048 * 5504 + 2 * 2048
    total = 24 * layer + 2 * 151_936 * 2048 + 2048
    arch = arch_from_hf_config(typed_config(_config("Qwen-1_8B")))
    assert arch.num_params == total == 1_836_828_672


def test_qwen_72b_matches_its_published_checkpoint_size() -> None:
    """Qwen-72B's model.safetensors.index.json total_size, 144,575,840,256 B of bf16 (HF
    Qwen/Qwen-72B at 4c539df), is twice the closed form's parameter count."""
    config = {
        "model_type": "qwen",
        "hidden_size": 8192,
        "intermediate_size": 49152,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "kv_channels": 128,
        "vocab_size": 152064,
        "no_bias": True,
        "tie_word_embeddings": False,
    }
    assert arch_from_hf_config(typed_config(config)).num_params * 2 == 144_575_840_256


def test_module_names_are_qwens() -> None:
    """LoRA's c_proj reaches the attention's and the MLP's output projections (PEFT matches the
    last name component); modules_to_save's wte and lm_head are the embedding and the head."""
    arch = arch_from_hf_config(typed_config(_config("Qwen-7B")))
    (layer, _), *_ = arch.layer_runs
    targets = ("c_attn", "c_proj", "w1", "w2")
    adapted = sorted(g.name for g in layer.tensors if lora_targeted(g, targets))
    assert adapted == ["down_proj", "gate_proj", "o_proj", "qkv_proj", "up_proj"]
    assert saved_by(arch.embeddings[0], ("wte",))
    assert [g.name for g in arch.head if saved_by(g, ("lm_head",))] == ["lm_head"]


def _logits(loss: str | None) -> int:
    body: dict[str, Any] = {
        "workloads": [
            {
                "kind": "training",
                "model": {
                    "source": "hf_config",
                    "name": "qwen-1.8b",
                    "config": _config("Qwen-1_8B"),
                },
                "micro_batch_size": 1,
                "sequence_length": 1024,
                "checkpointing": "full",
                "method": {"kind": "lora", "rank": 8, "target_modules": ["c_attn"]},
            }
        ],
        "software": {"framework": "transformers", "framework_version": "4.32.0"},
    }
    if loss:
        body["software"]["loss"] = loss
    b = budget_of(body)
    (line,) = [x for x in b.devices[0].lines if x.component.value == "logits"]
    return int(line.bytes)


def test_its_own_loss_shifts_a_compute_dtype_copy() -> None:
    """QWenLMHeadModel.forward takes CrossEntropyLoss of lm_logits[..., :-1, :].contiguous():
    a bf16 copy, which the Trainer's autocast upcasts to fp32 for log-softmax; forward
    1,024 x 151,936 x (2 + 2 + 4 + 4) B (not transformers' own fp32 shifted copy, 14 B); without
    the upcast, x (2 + 2 + 2)."""
    v = 1024 * 151_936
    assert _logits(None) == v * 12 == 1_866_989_568
    assert _logits("cross_entropy_no_upcast") == v * 6
