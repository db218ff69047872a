"""LitGPT's training memory as its released code lays it out (research/stack_behaviours.md
section 2d): Fabric's fp32 logits held by the loop, and the fused q/k/v attention whose views
keep the projection's output or repeat K and V. Each number is counted by hand from the
dimensions; what LitGPT's own code saves is measured by ``research/litgpt_saved.py``."""

from __future__ import annotations

from typing import Any

import msgspec

from vrambudget.core.estimate import estimate
from vrambudget.core.formulas.activations import (
    device_dims,
    lora_trainable,
    training_saved,
)
from vrambudget.core.formulas.logits import training_backward_parts, training_forward_parts
from vrambudget.core.resolve import resolve_model
from vrambudget.core.spec import BudgetRequest, DimensionsModel, Software
from vrambudget.core.stack import resolve_stack

S, B = 512, 2
TOKENS = S * B
V = 32_000
SHAPE: dict[str, Any] = {
    "seq": S,
    "batch": B,
    "e": 2,
    "dropout": False,
    "sequence_parallel": False,
    "drop_scores": False,
}
"""One layer of 2 x 512 bf16 tokens, no model dropout, no sequence parallelism."""


def _arch(kv_heads: int):
    return resolve_model(
        DimensionsModel(
            hidden_size=4096,
            num_layers=2,
            num_attention_heads=32,
            num_key_value_heads=kv_heads,
            intermediate_size=11008,
            vocab_size=V,
            mlp="gated",
            norm="rmsnorm",
        )
    )


def _items(arch: Any, fused_qkv: bool, targets: tuple[str, ...] = ()) -> dict[str, int]:
    layer = arch.layer_runs[0][0]
    kw = {}
    if targets:
        kw["trainable"] = lora_trainable(layer, arch, 1, targets, 8, 2, 2)
    return training_saved(
        layer, arch, device_dims(arch, 1, 1), attention="sdpa", fused_qkv=fused_qkv, **SHAPE, **kw
    )


def test_litgpt_defaults_to_its_own_loss_and_attention() -> None:
    lit = resolve_stack(msgspec.convert({"framework": "litgpt"}, Software))
    hf = resolve_stack(msgspec.convert({"framework": "transformers"}, Software))
    assert (lit.loss, lit.fused_qkv) == ("litgpt_chunked_cross_entropy", True)
    assert (hf.loss, hf.fused_qkv) == ("cross_entropy", False)
    names = {b.name for b in lit.behaviours}
    assert "fused_qkv_attention" in names


def test_fabric_fp32_logits_by_hand() -> None:
    """1,024 rows, vocabulary 32,000, bf16, 8 chunks of 128 positions. Forward: the bf16 LM-head
    output (2 B), Fabric's fp32 copy (4 B), the previous micro-batch's fp32 logits or the fp32
    log-softmax (4 B): 1,024 x 32,000 x 10 = 327,680,000 B. With a full fine-tune's reshaped
    copy: x 12 = 393,216,000 B. Backward: the held fp32 logits and the saved log-softmax (each
    chunk's replaced by its gradient), 1,024 x 32,000 x 8 = 262,144,000 B, and one chunk's two
    fp32 gradients, 2 x 128 x 32,000 x 4 = 32,768,000 B."""
    loss = "litgpt_chunked_cross_entropy"
    fwd = training_forward_parts(TOKENS, V, 2, loss, 8)
    assert [b for _, b in fwd] == [65_536_000, 131_072_000, 131_072_000]
    assert sum(b for _, b in fwd) == 327_680_000
    copy = training_forward_parts(TOKENS, V, 2, loss, 8, shift_copy=True)
    assert sum(b for _, b in copy) == 393_216_000
    bwd = training_backward_parts(TOKENS, V, loss, 8, 2)
    assert [b for _, b in bwd] == [131_072_000, 131_072_000, 16_384_000, 16_384_000]
    assert sum(b for _, b in bwd) == 262_144_000 + 32_768_000


def test_mha_keeps_the_whole_qkv_output() -> None:
    """32 query and 32 K/V heads of 128: V is a view, so the q and k parts of the fused output
    stay, 1,024 x 2 x 4,096 x 2 = 16,777,216 B more per layer; K and V keep their own size."""
    arch = _arch(32)
    plain, lit = _items(arch, False), _items(arch, True)
    key = "q and k parts of the fused qkv output (V's view keeps it)"
    assert lit[key] == TOKENS * 2 * 4096 * 2 == 16_777_216
    assert sum(lit.values()) - sum(plain.values()) == 16_777_216
    assert lit["k"] == plain["k"] == TOKENS * 4096 * 2


def test_grouped_queries_save_k_and_v_at_every_query_head() -> None:
    """8 K/V heads for 32 query heads: repeated before SDPA, K and V are saved at 32 heads:
    2 x 1,024 x (4,096 - 1,024) x 2 = 12,582,912 B more per layer, and no qkv output kept."""
    arch = _arch(8)
    plain, lit = _items(arch, False), _items(arch, True)
    assert plain["k"] == TOKENS * 1024 * 2
    assert lit["k"] == lit["v"] == TOKENS * 4096 * 2
    assert sum(lit.values()) - sum(plain.values()) == 12_582_912
    assert not any("fused qkv output" in k for k in lit)


def test_lora_on_part_of_qkv_keeps_the_padded_lora_b_output() -> None:
    """LoRA on q and v of 8 K/V heads: zero_pad's index_copy_ keeps lora_B's (1,024 tokens,
    4,096 + 1,024) bf16 output, 10,485,760 B per layer; on q, k and v it returns its input
    and keeps nothing."""
    arch = _arch(8)
    part = _items(arch, True, ("q_proj", "v_proj"))
    key = "zero-padded lora_B outputs of the fused qkv (index_copy_ source)"
    assert part[key] == TOKENS * (4096 + 1024) * 2 == 10_485_760
    every = _items(arch, True, ("q_proj", "k_proj", "v_proj"))
    assert key not in every
    assert key not in _items(arch, False, ("q_proj", "v_proj"))


def test_a_litgpt_answer_itemizes_both() -> None:
    """Through the whole estimate: Llama 2 7B LoRA on q and v under LitGPT names both items and
    the loss's parts; under transformers neither."""

    def budget(framework: str) -> Any:
        body = {
            "workloads": [
                {
                    "kind": "training",
                    "model": {"source": "preset", "id": "llama-2-7b"},
                    "precision": {"weights": "bf16"},
                    "micro_batch_size": B,
                    "sequence_length": S,
                    "method": {
                        "kind": "lora",
                        "rank": 8,
                        "target_modules": ["q_proj", "v_proj"],
                        "adapter_dtype": "bf16",  # LitGPT's bf16-true
                    },
                }
            ],
            "software": {"framework": framework},
        }
        req = msgspec.convert(body, BudgetRequest)
        return estimate(req.workloads, req.device, req.headroom, software=req.software)

    def parts(b: Any, component: str) -> dict[str, int]:
        line = next(ln for ln in b.devices[0].lines if ln.component == component)
        return {p.name: p.bytes for p in line.parts}

    lit, hf = budget("litgpt"), budget("transformers")
    acts = parts(lit, "activations")
    # 32 layers x 1,024 tokens x 2 x 4,096 x 2 B; lora_B outputs of q and v: x (4,096 + 4,096)
    assert acts["q and k parts of the fused qkv output (V's view keeps it)"] == 536_870_912
    assert acts["zero-padded lora_B outputs of the fused qkv (index_copy_ source)"] == 536_870_912
    assert not any("fused qkv" in k for k in parts(hf, "activations"))
    # the peak phase's logits: backward 1,024 x 32,000 x 8 + 2 x 256 x 32,000 x 4, which is
    # also the forward's 1,024 x 32,000 x 10
    assert sum(parts(lit, "logits").values()) == 327_680_000
    assert sum(parts(hf, "logits").values()) == 1_024 * 32_000 * 12


def test_lit_gpt_before_pr_667_saves_the_probabilities_of_one_kv_head() -> None:
    """lit-gpt before 2023-10-24 left one K/V head unrepeated, so SDPA ran its math path: per
    layer the probabilities, 2 x 32 heads x 512^2 x 2 B = 33,554,432 B, replace the log-sum-exp;
    q and the K/V that matmul broadcasts to every head are saved at 32 heads."""
    arch = _arch(1)
    layer = arch.layer_runs[0][0]
    kw: dict[str, Any] = {**SHAPE, "attention": "sdpa", "fused_qkv": True}
    new = training_saved(layer, arch, device_dims(arch, 1, 1), **kw)
    old = training_saved(layer, arch, device_dims(arch, 1, 1), math_mqa=True, **kw)
    key = "attention probabilities (math SDPA: one K/V head takes no fused kernel)"
    assert old[key] == B * 32 * S * S * 2 == 33_554_432
    assert "log-sum-exp" in new and "log-sum-exp" not in old
    assert old["k"] == old["v"] == new["k"] == TOKENS * 4096 * 2
    lit = resolve_stack(
        msgspec.convert({"framework": "litgpt", "framework_version": "0.1"}, Software)
    )
    assert lit.math_mqa and "mqa_math_attention" in {b.name for b in lit.behaviours}
    assert not resolve_stack(msgspec.convert({"framework": "litgpt"}, Software)).math_mqa


def test_a_full_fine_tune_joins_the_chunks_gradients() -> None:
    """full.py's chunks are split views of one fp32 tensor: the backward joins their gradients
    into a full-size one on top of the held logits and the chunks' own, 1,024 x 32,000 x 12 =
    393,216,000 B; in fp32 compute the LM head's output is the fp32 logits themselves (no
    copy): forward 1,024 x 32,000 x 8 = 262,144,000 B."""
    loss = "litgpt_chunked_cross_entropy"
    bwd = training_backward_parts(TOKENS, V, loss, 8, 2, joined=True)
    assert sum(b for _, b in bwd) == TOKENS * V * 12 == 393_216_000
    fp32 = training_forward_parts(TOKENS, V, 4, loss, 8)
    assert sum(b for _, b in fp32) == TOKENS * V * 8 == 262_144_000


def test_padded_lora_b_is_in_the_compute_dtype_and_dropout_is_taken_once() -> None:
    """fp32 adapters on a bf16 model: zero_pad's source is the bf16 lora_B output (autocast or
    bf16-true), 1,024 x (4,096 + 1,024) x 2 = 10,485,760 B per layer. With lora_dropout the
    fused layer drops its input out once: v's dropped-out copy and mask are not counted again,
    1,024 x 4,096 x (4 + 1) = 20,971,520 B less per layer than one copy per projection."""
    arch = _arch(8)
    layer = arch.layer_runs[0][0]
    kw: dict[str, Any] = {**SHAPE, "attention": "sdpa"}
    dd = device_dims(arch, 1, 1)
    fp32 = lora_trainable(layer, arch, 1, ("q_proj", "v_proj"), 8, 4, 2)
    assert fp32.qkv_subset_bytes_per_token == (4096 + 1024) * 2
    drop = lora_trainable(layer, arch, 1, ("q_proj", "v_proj"), 8, 4, 2, True)
    key = "LoRA inputs in the adapter dtype, lora_A outputs"
    peft = training_saved(layer, arch, dd, trainable=drop, **kw)[key]
    lit = training_saved(layer, arch, dd, trainable=drop, fused_qkv=True, **kw)[key]
    assert peft - lit == TOKENS * 4096 * (4 + 1) == 20_971_520


def test_gemma_2_soft_capped_attention_runs_eager() -> None:
    """Gemma 2 2B (8 heads, sliding window 4,096): its soft-capped logits cannot go through
    SDPA, so an `sdpa` request is budgeted as eager, with the tanh output saved too: per layer
    2 x 8 x 512 x 512 x 2 B = 8,388,608 B of it; `flash` caps inside its kernel and keeps the
    log-sum-exp."""
    from vrambudget.core.arch import attention_run
    from vrambudget.core.spec import PresetModel

    arch = resolve_model(PresetModel(id="gemma-2-2b"))
    assert arch.attention_softcap and attention_run("sdpa", arch) == "eager"
    assert attention_run("flash", arch) == "flash"
    assert not resolve_model(PresetModel(id="llama-3.1-8b")).attention_softcap
    layer = arch.layer_runs[0][0]
    kw: dict[str, Any] = {**SHAPE}
    eager = training_saved(layer, arch, device_dims(arch, 1, 1), attention="eager", **kw)
    assert eager["soft-capped scores (tanh output)"] == B * 8 * S * S * 2 == 8_388_608
    flash = training_saved(layer, arch, device_dims(arch, 1, 1), attention="flash", **kw)
    assert "soft-capped scores (tanh output)" not in flash and "log-sum-exp" in flash


def test_the_answer_says_sdpa_runs_eager_for_gemma_2() -> None:
    body = {
        "workloads": [
            {
                "kind": "inference",
                "model": {"source": "preset", "id": "gemma-2-2b"},
                "batch_size": 1,
                "prompt_tokens": 1024,
            }
        ]
    }
    req = msgspec.convert(body, BudgetRequest)
    warnings = estimate(req.workloads).warnings
    assert any("soft-caps its attention logits" in w for w in warnings)
    flash = msgspec.convert(
        {"workloads": [{**body["workloads"][0], "attention": "flash"}]}, BudgetRequest
    )
    assert not any("soft-caps" in w for w in estimate(flash.workloads).warnings)
