"""Inference activations: the working set of one no-grad forward pass of a layer, and the
largest over a stage's layer kinds."""

from __future__ import annotations

from ...arch import Arch, LayerType
from ...units import ceil_div
from .dims import FP32, DeviceDims

__all__ = ["inference_activations", "inference_working_set"]


def inference_working_set(
    layer: LayerType,
    arch: Arch,
    dd: DeviceDims,
    sequences: int,
    query_tokens: int,
    key_tokens: int,
    e: int,
    attention: str,
) -> int:
    """Peak live bytes of one no-grad layer forward: residual in and out, normalized input and
    sublayer output, plus the larger sublayer (attention: Q, K, V, output, and the s_q x s_kv
    scores and probabilities when eager;
    MLP: gate, up and activation outputs, or fc1 and GELU outputs)."""
    T = sequences * query_tokens
    # The residual stream in and out, the normalized input and the sublayer's output are live
    # around each sublayer (checked against the trace tier's oracle grid).
    resid = 4 * T * dd.h * e
    heads, qk, v = dd.heads, dd.qk_head_dim, dd.v_head_dim
    # Eager attention repeats K/V per query head (transformers repeat_kv), as in training.
    kv_live = heads if attention == "eager" else dd.kv_heads
    attn = T * (heads * (qk + v) + kv_live * (qk + v)) * e
    keys = min(key_tokens, layer.window) if layer.window else key_tokens
    if attention == "eager":
        # Scores, softmax's fp32 copy of them and its fp32 output (transformers eager path).
        live = e + FP32 + (FP32 if e != FP32 else 0)
        attn += sequences * heads * query_tokens * keys * live
    else:
        attn += sequences * heads * query_tokens * FP32
    if layer.moe:
        routed = ceil_div(T * dd.top_k, dd.ep)
        mlp = T * (arch.moe.num_experts if arch.moe else 0) * (e + FP32)
        mlp += routed * (3 * dd.f_expert + 2 * dd.h) * e + 3 * T * dd.f_shared * e
    else:
        mlp = T * (3 if arch.mlp == "gated" else 2) * dd.f * e
    return resid + max(attn, mlp)


def inference_activations(
    layer_kinds: tuple[tuple[LayerType, int], ...],
    arch: Arch,
    dd: DeviceDims,
    sequences: int,
    query: int,
    keys: int,
    e: int,
    attention: str,
) -> int:
    """The largest working set over a stage's layer kinds (layers run one at a time)."""
    peak = 0
    for layer, _ in layer_kinds:
        ws = inference_working_set(layer, arch, dd, sequences, query, keys, e, attention)
        if ws > peak:
            peak = ws
    return peak
