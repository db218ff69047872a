"""Activation memory of one transformer layer on one device, itemized tensor by tensor.

Training counts the tensors autograd saves for backward (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", §4.1): with a GPT layer, 2-byte
activations, 1-byte dropout masks and unfused attention this itemization sums to exactly
``s*b*h*(34 + 5*a*s/h)`` bytes, and with tensor parallelism to
``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` (Table 2) -- a test checks both. The same items generalize to
gated MLPs (4 saved tensors of the intermediate width), GQA, QK-norm, sandwich norms, MoE and
flash attention (which saves Q, K, V, the output and an fp32 log-sum-exp per row instead of the
s^2 score matrix; Dao et al. 2022 §3.1).

Inference counts the transient working set of one no-grad forward pass: the residual stream and
its normalized copy plus the larger of the attention or MLP sublayer's live intermediates.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arch import Arch, LayerType
from .layout import kv_heads_per_device
from .units import ceil_div

__all__ = ["DeviceDims", "device_dims", "inference_working_set", "training_saved"]

FP32 = 4
MASK = 1  # dropout masks are kept as bytes (torch bool / uint8)


@dataclass(frozen=True, slots=True)
class DeviceDims:
    """Per-device widths under tensor parallelism t and expert parallelism ep."""

    h: int
    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    f: int
    vocab: int
    vocab_full: int
    experts: int
    top_k: int
    f_expert: int
    f_shared: int
    ep: int
    t: int


def device_dims(arch: Arch, t: int, ep: int) -> DeviceDims:
    moe = arch.moe
    v_head = arch.mla.v_head_dim if arch.mla else arch.head_dim
    return DeviceDims(
        h=arch.hidden_size,
        heads=arch.num_heads // t,
        kv_heads=arch.num_heads // t if arch.mla else kv_heads_per_device(arch, t),
        qk_head_dim=arch.head_dim,
        v_head_dim=v_head,
        f=ceil_div(arch.intermediate_size, t),
        vocab=ceil_div(arch.vocab_size, t),
        vocab_full=arch.vocab_size,
        experts=(moe.num_experts // ep) if moe else 0,
        top_k=moe.experts_per_token if moe else 0,
        f_expert=(moe.expert_intermediate_size if ep > 1 else
                  ceil_div(moe.expert_intermediate_size, t)) if moe else 0,
        f_shared=ceil_div(moe.shared_intermediate_size, t) if moe else 0,
        ep=ep,
        t=t,
    )


def _mlp_saved(layer: LayerType, arch: Arch, dd: DeviceDims, tokens: int, e: int) -> int:
    """Split (per-device) MLP tensors saved for backward."""
    if not layer.moe:
        per_token = (4 if arch.mlp == "gated" else 2) * dd.f
        return tokens * per_token * e
    routed = ceil_div(tokens * dd.top_k, dd.ep)
    saved = routed * 4 * dd.f_expert * e  # gate, up, act, product of each routed copy
    saved += routed * 2 * dd.h * e  # gathered expert inputs, expert outputs (for routing grads)
    saved += tokens * 4 * dd.f_shared * e
    return saved


def training_saved(layer: LayerType, arch: Arch, dd: DeviceDims, *, seq: int, batch: int,
                   e: int, attention: str, dropout: bool, sequence_parallel: bool,
                   drop_scores: bool) -> dict[str, int]:
    """Bytes saved for backward by one layer for one micro-batch, by item.

    ``drop_scores`` is selective recomputation: the s^2 attention-core tensors are recomputed
    instead of stored (Korthikanti §5).
    """
    s, b, h = seq, batch, dd.h
    tokens = s * b
    rep_div = dd.t if sequence_parallel else 1
    hidden = ceil_div(tokens * h * e, rep_div)  # one hidden-sized tensor, replicated unless SP
    mask = ceil_div(tokens * h * MASK, rep_div) if dropout else 0
    heads = dd.heads
    eager = attention == "eager"
    kv_saved = heads if (eager or arch.mla) else dd.kv_heads  # HF eager repeats K/V per q head
    window = layer.window
    keys = min(s, window) if window else s
    items = {
        "norm inputs": hidden * (4 if arch.sandwich_norms else 2),
        "qkv input": hidden,
        "q": tokens * heads * dd.qk_head_dim * e,
        "k": tokens * kv_saved * dd.qk_head_dim * e,
        "v": tokens * kv_saved * dd.v_head_dim * e,
        "attention output": tokens * heads * dd.v_head_dim * e,
        "attention dropout mask": mask,
        "mlp input": hidden,
        "mlp intermediates": _mlp_saved(layer, arch, dd, tokens, e),
        "mlp dropout mask": mask,
    }
    if arch.qk_norm:
        items["qk-norm inputs"] = tokens * (heads + dd.kv_heads) * dd.qk_head_dim * e
    if layer.moe:
        items["router logits"] = tokens * (arch.moe.num_experts if arch.moe else 0) * e
    if eager:
        scores = b * heads * s * keys
        items["softmax output"] = 0 if drop_scores else scores * e
        if dropout and not drop_scores:
            items["score dropout mask"] = scores * MASK
            items["score dropout output"] = scores * e
    else:
        items["log-sum-exp"] = b * heads * s * FP32
    return items


def inference_working_set(layer: LayerType, arch: Arch, dd: DeviceDims, sequences: int,
                          query_tokens: int, key_tokens: int, e: int, attention: str) -> int:
    """Peak live bytes of one no-grad layer forward: residual + normalized input, plus the larger
    sublayer (attention: Q, K, V, output, and the s_q x s_kv scores and probabilities when eager;
    MLP: gate, up and activation outputs, or fc1 and GELU outputs)."""
    T = sequences * query_tokens
    resid = 2 * T * dd.h * e
    heads, qk, v = dd.heads, dd.qk_head_dim, dd.v_head_dim
    # Eager attention repeats K/V per query head (transformers repeat_kv), as in training.
    kv_live = heads if attention == "eager" else dd.kv_heads
    attn = T * (heads * (qk + v) + kv_live * (qk + v)) * e
    keys = min(key_tokens, layer.window) if layer.window else key_tokens
    if attention == "eager":
        attn += 2 * sequences * heads * query_tokens * keys * e
    else:
        attn += sequences * heads * query_tokens * FP32
    if layer.moe:
        routed = ceil_div(T * dd.top_k, dd.ep)
        mlp = T * (arch.moe.num_experts if arch.moe else 0) * (e + FP32)
        mlp += routed * (3 * dd.f_expert + 2 * dd.h) * e + 3 * T * dd.f_shared * e
    else:
        mlp = T * (3 if arch.mlp == "gated" else 2) * dd.f * e
    return resid + max(attn, mlp)
