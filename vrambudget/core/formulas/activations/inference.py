"""Inference activations: the working set of one no-grad forward pass of a layer, and the
largest over a stage's layer kinds."""

from __future__ import annotations

from ...arch import Arch, LayerType
from ...units import ceil_div
from ..sdpa import MATH_SOFTMAX_PEAK_BYTES
from .dims import FP32, DeviceDims

__all__ = ["inference_activations", "inference_working_set", "layer_keys", "math_path_bytes"]


def inference_working_set(
    layer: LayerType,
    arch: Arch,
    dd: DeviceDims,
    sequences: int,
    query_tokens: int,
    key_tokens: int,
    e: int,
    attention: str,
    masked_math: bool = False,
    causal: bool = True,
    moe_rows: int | None = None,
) -> int:
    """Peak live bytes of one no-grad layer forward: residual in and out, normalized input and
    sublayer output, plus the larger sublayer (attention: Q, K, V, output, and the s_q x s_kv
    scores and probabilities when eager, or what SDPA's math path holds
    (:func:`math_path_bytes`);
    MLP: gate, up and activation outputs, or fc1 and GELU outputs).

    A sliding-window layer attends to the keys transformers' sliding cache holds
    (``DynamicSlidingWindowLayer.get_mask_sizes``: the window less one past token, plus the
    queries; a prefill's whole prompt), and once they reach its window its SDPA call gets a
    mask: K/V repeated to every head in a prefill (``repeat_kv``; one query reshapes the query
    heads instead, ``pack_gqa``), the bool mask and its copy in the input dtype
    (``convert_boolean_attn_mask``), and a fused kernel -- unless none takes the dtype
    (``masked_math``: bf16 below sm80), when the math path runs (``attention`` ``math`` is the
    unmasked calls' path). Eager attention scores every key it holds and masks them.
    ``causal`` false: an encoder's bidirectional attention (no causal mask). ``moe_rows``: the
    rows a MoE sublayer is handed where they differ from the layer's tokens (a serving engine's
    data-parallel replicas gather theirs), its routed rows then not divided by the expert ranks
    (``dd.ep``)."""
    T = sequences * query_tokens
    # The residual stream in and out, the normalized input and the sublayer's output are live
    # around each sublayer (checked against the trace tier's oracle grid).
    resid = 4 * T * dd.h * e
    heads, qk, v = dd.heads, dd.qk_head_dim, dd.v_head_dim
    keys, masked = layer_keys(layer, query_tokens, key_tokens)
    if attention == "math" and masked and not masked_math:
        attention = "sdpa"
    sdpa_masked = masked and attention in ("sdpa", "math")
    # Eager attention repeats K/V per query head (transformers repeat_kv), as in training, and
    # so does a masked SDPA call with several queries.
    repeated = attention == "eager" or (sdpa_masked and query_tokens > 1)
    kv_live = heads if repeated else dd.kv_heads
    attn = T * (heads * (qk + v) + kv_live * (qk + v)) * e
    if attention == "math":  # its output is among what it allocates
        attn -= T * heads * v * e
    if attention == "eager":
        # Scores, softmax's fp32 copy of them and its fp32 output (transformers eager path).
        live = e + FP32 + (FP32 if e != FP32 else 0)
        attn += sequences * heads * query_tokens * keys * live
    elif attention == "math":
        attn += math_path_bytes(dd, sequences, query_tokens, keys, e, sdpa_masked, causal)
    else:
        attn += sequences * heads * query_tokens * FP32
        if sdpa_masked:  # the bool mask and its copy in the input dtype
            attn += sequences * query_tokens * keys * (1 + e)
    if layer.moe:
        rows = T if moe_rows is None else moe_rows
        routed = ceil_div(rows * dd.top_k, dd.ep if moe_rows is None else 1)
        mlp = rows * (arch.moe.num_experts if arch.moe else 0) * (e + FP32)
        mlp += routed * (3 * dd.f_expert + 2 * dd.h) * e + 3 * rows * dd.f_shared * e
    else:
        mlp = T * (3 if arch.mlp == "gated" else 2) * dd.f * e
    return resid + max(attn, mlp)


def math_path_bytes(
    dd: DeviceDims,
    sequences: int,
    query_tokens: int,
    keys: int,
    e: int,
    masked: bool = False,
    causal: bool = True,
) -> int:
    """What torch's SDPA math path allocates beyond its q, k and v inputs, at its peak, without
    autograd (``attention.cpp`` ``_scaled_dot_product_attention_math``, torch 2.5 - 2.13). Held
    until it returns: the fp32 copies of 16-bit q, k and v (``allowFP16BF16ReductionMathSDP``
    is off by default), the scaled fp32 query, k and v expanded to every query head
    (``repeat_interleave`` under ``enable_gqa``) and, in a prefill (``is_causal``), the causal
    mask as an fp32 ``s_q x s_kv`` matrix. On top, the largest of three moments:

    * the scores' matmul: the scaled keys (fp32, every query head) and the fp32 scores;
    * ``_safe_softmax``: the scores, its fp32 output and the ``isneginf`` bool mask (9 B per
      score, :data:`MATH_SOFTMAX_PEAK_BYTES`) and its all-masked-rows flags (1 B per row);
    * the return: the fp32 probabilities, their cast to the input dtype, the fp32 output and
      its cast (no casts in fp32).

    torch 2.13.0's CPU build, which runs the same composite kernels, allocates exactly this
    (its profiler's memory events, fp16 / bf16 / fp32, prefill and decode shapes, to 4 bytes).

    ``masked``: transformers' call with a mask (a sliding-window layer whose keys reach its
    window): K/V already repeated to every head (``repeat_kv``; the copies have every head,
    nothing is expanded), and in place of the causal matrix transformers' bool mask
    (``sequences x s_q x s_kv``, one per forward) and its conversion to the input dtype by
    ``scaled_dot_product_attention`` (``convert_boolean_attn_mask``). ``causal`` false (an
    encoder): no mask at all.

    Worked number: Llama 3 8B (32 heads, 8 K/V heads, 128), one 1,024-token fp16 prefill:
    copies 1,024 x (32 + 16) x 128 x 4 = 25,165,824; scaled q 16,777,216; expanded K/V
    33,554,432; mask 4,194,304; the softmax's moment 32 x 1,024^2 x 9 + 32 x 1,024 =
    302,022,656 (the matmul's 150,994,944, the return's 226,492,416): 381,714,432 B."""
    b, q_len, k_len = sequences, query_tokens, keys
    heads, qk, v = dd.heads, dd.qk_head_dim, dd.v_head_dim
    if masked:
        # a prefill's K/V come repeated to every head; one query's heads come reshaped onto
        # the K/V heads (pack_gqa): either way the heads match and nothing is expanded
        kv_in = kv_used = heads if q_len > 1 else dd.kv_heads
    else:
        kv_in, kv_used = dd.kv_heads, heads
    cast = e if e != FP32 else 0  # a .to() of an fp32 tensor to fp32 returns it
    copies = (b * q_len * heads * qk + b * k_len * kv_in * (qk + v)) * FP32 if cast else 0
    scaled_q = b * q_len * heads * qk * FP32
    expanded = b * k_len * heads * (qk + v) * FP32 if kv_in < kv_used else 0
    if masked:
        mask = b * q_len * k_len * (1 + e)
    else:
        mask = q_len * k_len * FP32 if causal and q_len > 1 else 0
    scores = b * heads * q_len * k_len
    matmul = b * k_len * kv_used * qk * FP32 + scores * FP32
    softmax = scores * MATH_SOFTMAX_PEAK_BYTES + b * heads * q_len
    ret = scores * (FP32 + cast) + b * q_len * heads * v * (FP32 + cast)
    return copies + scaled_q + expanded + mask + max(matmul, softmax, ret)


def layer_keys(layer: LayerType, query_tokens: int, key_tokens: int) -> tuple[int, bool]:
    """(keys a layer's attention covers, whether its SDPA call gets a mask) for
    ``query_tokens`` queries after ``key_tokens - query_tokens`` cached tokens: a
    sliding-window layer holds the window less one past token (transformers'
    ``DynamicSlidingWindowLayer.get_mask_sizes``), and from its window on transformers masks it
    (``masking_utils._ignore_causal_mask_sdpa``). Worked: window 4,096, a 8,192-token prefill
    -> (8,192, masked); a decode step at 10,000 -> (4,096, masked); at 1,000 -> (1,000, not)."""
    if layer.window is None:
        return key_tokens, False
    past = max(key_tokens - query_tokens, 0)
    # a chunked prefill's chunk may hold more tokens than one prompt has
    keys = min(past, layer.window - 1) + min(query_tokens, key_tokens)
    return keys, keys >= layer.window


def inference_activations(
    layer_kinds: tuple[tuple[LayerType, int], ...],
    arch: Arch,
    dd: DeviceDims,
    sequences: int,
    query: int,
    keys: int,
    e: int,
    attention: str,
    masked_math: bool = False,
) -> int:
    """The largest working set over a stage's layer kinds (layers run one at a time)."""
    peak = 0
    for layer, _ in layer_kinds:
        ws = inference_working_set(
            layer, arch, dd, sequences, query, keys, e, attention, masked_math
        )
        if ws > peak:
            peak = ws
    return peak
