"""Unsloth's fast LoRA saves less than PEFT's forward (unsloth 2024.8 kernels/fast_lora.py:
LoRA_QKV saves its input once, LoRA_W the o projection's, LoRA_MLP its input and the gate and up
outputs only), checked against hand counts on Llama 2 7B."""

from __future__ import annotations

from tests.support.workloads import LLAMA_PROJECTIONS
from vrambudget.core.catalog import preset_arch
from vrambudget.core.formulas.activations import (
    device_dims,
    lora_trainable,
    training_saved,
    unsloth_patched,
    unsloth_trainable,
)

ALL = LLAMA_PROJECTIONS


def _saved(arch, trainable, swiglu: bool) -> int:
    layer = arch.layer_runs[0][0]
    items = training_saved(
        layer,
        arch,
        device_dims(arch, 1, 1),
        seq=1024,
        batch=1,
        e=2,
        attention="sdpa",
        dropout=False,
        sequence_parallel=False,
        drop_scores=False,
        trainable=trainable,
        norm="fused",
        fused_swiglu=swiglu,
    )
    return sum(items.values())


def test_unsloth_layer_by_hand_on_llama_2_7b():
    """1,024 tokens, bf16, rank 16 on all seven projections, lora_dropout 0. Unsloth keeps: two
    norm inputs (2 x 1024 x 4096 x 2 = 16,777,216), six hidden-wide tensors of 8,388,608 B (the
    QKV input, q, k, v, the attention output, the MLP input: 50,331,648), the gate and up
    outputs (2 x 1024 x 11008 x 2 = 45,088,768) and SDPA's fp32 log-sum-exp (32 x 1024 x 4 =
    131,072): 112,328,704 B. PEFT's forward keeps the activation and the product too (2 x
    22,544,384) and each lora_A output (7 x 16 x 2 B per token = 229,376): 45,318,144 B more."""
    arch = preset_arch("llama-2-7b")
    layer = arch.layer_runs[0][0]
    assert unsloth_patched(layer, arch, ALL) == frozenset({"qkv", "o", "mlp"})
    tr, own_mlp = unsloth_trainable(layer, arch, 1, ALL, 16, 2, 2)
    assert own_mlp and tr.lora_bytes_per_token == 0
    unsloth = _saved(arch, tr, own_mlp)
    assert unsloth == 112_328_704
    peft = _saved(arch, lora_trainable(layer, arch, 1, ALL, 16, 2, 2, False), False)
    assert peft - unsloth == 45_318_144


def test_unsloth_patches_only_whole_unbiased_groups():
    """Qwen2.5's q, k, v carry biases: Unsloth leaves them to PEFT (patch_peft_model checks
    ``base_layer.bias is None``); a group missing one projection stays PEFT's too."""
    qwen = preset_arch("qwen2.5-7b")
    assert unsloth_patched(qwen.layer_runs[0][0], qwen, ALL) == frozenset({"o", "mlp"})
    llama = preset_arch("llama-2-7b")
    layer = llama.layer_runs[0][0]
    assert unsloth_patched(layer, llama, ("q_proj", "v_proj", "gate_proj", "up_proj")) == (
        frozenset()
    )
    # q and v alone run PEFT's forward: its lora_A outputs stay (2 x 16 x 2 B per token), and
    # nothing Unsloth-specific changes
    tr, own_mlp = unsloth_trainable(layer, llama, 1, ("q_proj", "v_proj"), 16, 2, 2)
    assert not own_mlp and tr.lora_bytes_per_token == 64


def test_a_bias_is_found_by_its_projection_however_the_inventory_names_it():
    """The framework's inventory names tensors in full (``self_attn.q_proj.bias``), the presets
    short (``q_proj.bias``): either way Qwen2.5's biased q, k, v stay with PEFT."""
    import dataclasses

    qwen = preset_arch("qwen2.5-7b")
    layer = qwen.layer_runs[0][0]
    prefix = {"q_proj": "self_attn.", "k_proj": "self_attn.", "v_proj": "self_attn."}
    full = dataclasses.replace(
        layer,
        tensors=tuple(
            dataclasses.replace(g, name=prefix.get(g.name.split(".")[0], "") + g.name)
            for g in layer.tensors
        ),
    )
    assert any(g.name == "self_attn.q_proj.bias" for g in full.tensors)
    assert unsloth_patched(full, qwen, ALL) == frozenset({"o", "mlp"})
