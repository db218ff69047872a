"""The kernels whose memory differs between CPU and CUDA, in two modes.

CPU kernels (what fake tensors on ``cpu`` dispatch to) allocate differently from their CUDA
counterparts: CPU SDPA saves other buffers than FlashAttention-2, and a norm may save fp32
copies that the fused CUDA kernel does not. In **emulation** (the trace tier) each function
here allocates exactly what the CUDA kernel allocates -- outputs, saved tensors, scratch, with
the source named -- and computes no values (fake tensors have none). In **native** mode (real
runs: the probe agent on a GPU, the CPU validation) the real torch ops run; the probe's measured
peak then checks the emulation of each kernel.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

from vrambudget.core.formulas.sdpa import lse_rows, sdpa_backend
from vrambudget.core.units import round_up

__all__ = [
    "FLASH_HEAD_ROUND",
    "FLASH_SEQ_ROUND",
    "HALF_DTYPES",
    "dequantized_linear",
    "emulated_sdpa",
    "emulation",
    "flash_attention",
    "flash_attention_2",
    "fused_norm",
    "packed_linear",
]

HALF_DTYPES = (torch.float16, torch.bfloat16)
"""The 16-bit float dtypes (FlashAttention's, and the 8-element GEMM alignment's)."""

_EMULATE: ContextVar[bool] = ContextVar("vrambudget_emulate_cuda_kernels", default=False)
_FLASH_HW: ContextVar[bool] = ContextVar("vrambudget_emulated_flash_hardware", default=True)
_MEM_EFFICIENT_GQA: ContextVar[bool] = ContextVar("vrambudget_mem_efficient_gqa", default=False)


@contextmanager
def emulation(flash_hw: bool = True, mem_efficient_gqa: bool = False) -> Iterator[None]:
    """Within: kernels allocate what their CUDA versions allocate and compute nothing, on a
    device with or without FlashAttention (``flash_hw``:
    :func:`vrambudget.core.formulas.sdpa.flash_hardware`; below sm80 SDPA picks other
    backends), under a torch whose memory-efficient kernel takes grouped K/V heads or not
    (``mem_efficient_gqa``: 2.14 on, NVIDIA)."""
    token = _EMULATE.set(True)
    hw = _FLASH_HW.set(flash_hw)
    gqa = _MEM_EFFICIENT_GQA.set(mem_efficient_gqa)
    try:
        yield
    finally:
        _MEM_EFFICIENT_GQA.reset(gqa)
        _FLASH_HW.reset(hw)
        _EMULATE.reset(token)


# aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp (mha_bwd): seqlen_q_rounded =
# round_multiple(seqlen_q, 128); head_size_rounded = round_multiple(head_size, 32 if <= 128
# else 64); dq_accum fp32 (b, s_q_rounded, h, d_rounded); softmax_d fp32 (b, h, s_q_rounded);
# with GQA/MQA dk_expanded and dv_expanded (b, s_k, h, d) in the input dtype.
FLASH_SEQ_ROUND = 128
FLASH_HEAD_ROUND_SMALL, FLASH_HEAD_ROUND = 32, 64
# attention.cu preprocess_mask -> pad_bias: the additive bias's last dim padded to 16 elements.
MEM_EFFICIENT_BIAS_ALIGN = 16
# mha_fwd returns an rng_state of two uint64 and an unused uint64 scalar (both on the device).
_RNG_STATE_ELEMS = 2


def _apply(function: type[torch.autograd.Function], *args: object) -> torch.Tensor:
    """``function.apply(*args)`` for a Function whose forward returns one tensor (torch leaves
    ``Function.apply`` unannotated)."""
    result: torch.Tensor = function.apply(*args)
    return result


class _FlashAttention(torch.autograd.Function):
    """FlashAttention-2 as PyTorch's SDPA flash backend runs it (native GQA, O(s) memory),
    on (b, s, h, d) inputs of a 16-bit dtype."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, sq, h, _ = q.shape
        out = torch.empty(b, sq, h, v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.empty(b, h, lse_rows("flash", sq), dtype=torch.float32, device=q.device)
        rng = torch.empty(_RNG_STATE_ELEMS, dtype=torch.int64, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse, rng)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, _out, _lse, _rng = ctx.saved_tensors
        b, sq, h, d = q.shape
        sk, hk = k.shape[1], k.shape[2]
        d_round = round_up(d, FLASH_HEAD_ROUND_SMALL if d <= 128 else FLASH_HEAD_ROUND)
        sq_round = round_up(sq, FLASH_SEQ_ROUND)
        dq = torch.empty_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        softmax_d = torch.empty(b, h, sq_round, dtype=torch.float32, device=q.device)
        dq_accum = torch.empty(b, sq_round, h, d_round, dtype=torch.float32, device=q.device)
        if hk != h:
            dk_expanded = torch.empty(b, sk, h, d, dtype=k.dtype, device=k.device)
            dv_expanded = torch.empty(b, sk, h, v.shape[-1], dtype=v.dtype, device=v.device)
        else:
            dk_expanded, dv_expanded = dk, dv
        del softmax_d, dq_accum, dk_expanded, dv_expanded
        return dq, dk, dv


class _MemEfficientAttention(torch.autograd.Function):
    """``_efficient_attention_forward`` / ``_efficient_attention_backward`` on (b, h, s, d)
    inputs: the output and an fp32 log-sum-exp padded to 32 rows; the backward the three
    input gradients and an fp32 ``delta`` per row (``attention_backward.cu``). With grouped
    K/V heads (torch 2.14+) the backward's K/V gradients are taken per query head, then
    reduced by a follow-up kernel (pytorch#191085: "no atomics and launch a follow up kernel
    to reduce for gqa bwd"): counted here as FlashAttention-2's ``dk_expanded`` and
    ``dv_expanded`` are, in the input dtype."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        b, h, sq, _ = q.shape
        out = torch.empty(b, sq, h, v.shape[-1], dtype=q.dtype, device=q.device).transpose(1, 2)
        rows = lse_rows("mem_efficient", sq)
        lse = torch.empty(b, h, rows, dtype=torch.float32, device=q.device)
        # the additive mask is saved for backward (ScaledDotProductEfficientAttentionBackward0)
        ctx.save_for_backward(q, k, v, out, lse, *((bias,) if bias is not None else ()))
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, _out, _lse, *_bias = ctx.saved_tensors
        b, h, sq, _ = q.shape
        delta = torch.empty(b, h, sq, dtype=torch.float32, device=q.device)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if k.shape[1] != h:
            sk = k.shape[2]
            dk_expanded = torch.empty(b, h, sk, k.shape[-1], dtype=k.dtype, device=k.device)
            dv_expanded = torch.empty(b, h, sk, v.shape[-1], dtype=v.dtype, device=v.device)
            del dk_expanded, dv_expanded
        del delta
        return dq, dk, dv, None


def emulated_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on (b, h, s, d) as CUDA allocates it: the backend
    :func:`vrambudget.core.formulas.sdpa.sdpa_backend` picks (``sdp_utils.cpp``), run as its
    emulation (flash, memory-efficient) or as the math path itself. Emulation only: nothing
    is computed."""
    backend = sdpa_backend(
        half=query.dtype in HALF_DTYPES,
        bf16=query.dtype == torch.bfloat16,
        head_dim=query.shape[-1],
        v_head_dim=value.shape[-1],
        mask=attn_mask is not None,
        gqa=key.shape[1] != query.shape[1],
        flash_hw=_FLASH_HW.get(),
        mem_efficient_gqa=_MEM_EFFICIENT_GQA.get(),
    )
    if backend == "flash":
        out = _apply(
            _FlashAttention, query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        )
        return out.transpose(1, 2)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # scaled_dot_product_attention converts a bool mask to the query's dtype for every
        # backend (convert_boolean_attn_mask), before the backend runs
        zero = torch.zeros((), dtype=query.dtype, device=query.device)
        attn_mask = torch.where(attn_mask, zero, torch.full_like(zero, -math.inf))
    if backend == "mem_efficient":
        return _apply(_MemEfficientAttention, query, key, value, _efficient_bias(attn_mask, query))
    return _math_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _efficient_bias(mask: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor | None:
    """The memory-efficient kernel's additive bias: the (float) mask with its last dim padded
    to a multiple of 16 (``preprocess_mask`` / ``pad_bias``; the expansion to every head is a
    view)."""
    if mask is None:
        return None
    kv = mask.shape[-1]
    if kv % MEM_EFFICIENT_BIAS_ALIGN:
        padded = torch.empty(
            *mask.shape[:-1], round_up(kv, MEM_EFFICIENT_BIAS_ALIGN), dtype=mask.dtype,
            device=mask.device,
        )  # fmt: skip
        mask = padded[..., :kv]
    return mask


def _math_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """torch 2.13.0's ``_scaled_dot_product_attention_math`` (``attention.cpp``) op by op, so
    that the recorder sees what ``_safe_softmax`` allocates inside its one kernel (fake tensors
    show only its output): 16-bit inputs copied to fp32, q and the transposed k scaled by
    sqrt(scale), the causal mask as a float matrix (``convert_boolean_attn_mask``), K/V
    expanded to every query head under ``enable_gqa`` (``repeat_interleave``), the fp32 scores
    with the mask added in place, ``_safe_softmax`` (the softmax output, an ``isneginf`` bool
    mask and its all-masked-rows flags; the zeroing of such rows writes in place), the product
    with V, and the casts back (the probabilities' cast is the kernel's second output, dropped
    by ``F.scaled_dot_product_attention``). Autograd saves what the C++ composite saves: each
    matmul's inputs and the softmax's output."""
    origin = query.dtype
    upcast = origin in HALF_DTYPES
    q_acc = query.to(torch.float32) if upcast else query
    k_acc = key.to(torch.float32) if upcast else key
    v_acc = value.to(torch.float32) if upcast else value
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    q = q_acc * factor
    mask = attn_mask
    if is_causal:
        ones = torch.ones(q.shape[-2], k_acc.shape[-2], dtype=torch.bool, device=q.device)
        mask = ones.tril()
        del ones
    if mask is not None and mask.dtype == torch.bool:
        # q is fp32 here (copied, or given so): python scalars give an fp32 matrix
        mask = torch.where(mask, 0.0, -math.inf)
    k_exp, v_exp = k_acc, v_acc  # the copies stay alive beside the expanded heads
    if enable_gqa and k_acc.shape[-3] != q.shape[-3]:
        k_exp = k_acc.repeat_interleave(q.shape[-3] // k_acc.shape[-3], dim=-3)
        v_exp = v_acc.repeat_interleave(q.shape[-3] // v_acc.shape[-3], dim=-3)
    attn = torch.matmul(q, k_exp.transpose(-2, -1) * factor)
    if mask is not None:
        attn.add_(mask)
    probs = torch.softmax(attn, -1)
    masked = torch.isneginf(attn)
    rows = masked.all(-1, keepdim=True)
    del masked, rows, attn
    if dropout_p > 0.0:
        # CUDA's native_dropout: the output and a bool mask (the CPU's dropout draws fp32 noise)
        probs, _keep = torch.ops.aten.native_dropout(probs, dropout_p, True)
    out = torch.matmul(probs, v_exp)
    result = out.to(origin)
    second = probs.to(origin)
    del second, out
    return result


def _sdpa_bshd(
    sdpa: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> torch.Tensor:
    """``sdpa`` (``F.scaled_dot_product_attention`` or :func:`emulated_sdpa`) on (b, s, h, d)
    inputs: causal only over a square prefill, native GQA when there are fewer kv heads."""
    sq, sk = q.shape[1], k.shape[1]
    out: torch.Tensor = sdpa(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        is_causal=causal and sq == sk and sq > 1,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    return out.transpose(1, 2)


def flash_attention_2(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True
) -> torch.Tensor:
    """The ``flash_attn`` package's FlashAttention-2 on (b, s, h, d) inputs of a 16-bit dtype
    (``flash_attn_func``, native GQA): the same buffers as SDPA's flash backend. Native mode
    runs SDPA."""
    if _EMULATE.get():
        return _apply(_FlashAttention, q, k, v)
    return _sdpa_bshd(F.scaled_dot_product_attention, q, k, v, causal)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    window: int | None = None,
) -> torch.Tensor:
    """The built-in builders' attention: (b, s_q, h, d) x (b, s_k, h_kv, d) -> (b, s_q, h,
    d_v); the queries are the last s_q positions (prefill: all of them; decode: one).
    Emulated, 16-bit inputs run FlashAttention-2 (the builders' fused kernel, native GQA; also
    the stand-in of vLLM's latent-attention decode kernel, whose 576-wide heads are outside
    SDPA's flash rule); fp32 inputs, which no flash kernel takes, get the backend the
    frameworks' SDPA gets for them (:func:`emulated_sdpa`: the memory-efficient kernel, or
    math with GQA). Native mode runs SDPA. The sliding window is not applied to the values (it
    changes no allocation of the kernels)."""
    if not _EMULATE.get():
        return _sdpa_bshd(F.scaled_dot_product_attention, q, k, v, causal)
    if q.dtype in HALF_DTYPES:
        return _apply(_FlashAttention, q, k, v)
    return _sdpa_bshd(emulated_sdpa, q, k, v, causal)


class _FusedNorm(torch.autograd.Function):
    """A fused RMSNorm / LayerNorm CUDA kernel (``F.layer_norm``; ``F.rms_norm``'s fused kernel;
    Apex, Liger, TE alike): the output, and saved for backward the input and the fp32 inverse
    standard deviation per row (plus the mean for LayerNorm); no fp32 copy of the activations.
    Its backward allocates the input gradient and, for a trainable weight, an fp32 partial
    reduction before the weight gradient."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rms: bool
    ) -> torch.Tensor:
        out = torch.empty_like(x)
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        if rms:
            ctx.save_for_backward(x, weight, rstd)
        else:
            mean = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
            ctx.save_for_backward(x, weight, rstd, mean)
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, *_ = ctx.saved_tensors
        dx = torch.empty_like(x)
        dweight = dbias = None
        if weight.requires_grad:
            dweight = torch.empty_like(weight)
            dbias = torch.empty_like(weight) if ctx.has_bias else None
        return dx, dweight, dbias, None


def fused_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    eps: float,
    rms: bool,
    offset: float = 0.0,
) -> torch.Tensor:
    """RMSNorm (``offset`` 1 for Gemma's ``1 + weight``) or LayerNorm over the last dim."""
    if _EMULATE.get():
        return _apply(_FusedNorm, x, weight, bias, rms)
    w = weight + offset if offset else weight
    if rms:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return F.layer_norm(x, (x.shape[-1],), w, bias, eps)


def upcast_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    offset: float = 0.0,
    fp32_normed: bool = False,
) -> torch.Tensor:
    """RMSNorm as the frameworks write it, in plain ops (the same on CUDA and emulated):
    transformers' ``LlamaRMSNorm.forward`` (``hidden_states.to(torch.float32)`` ... ``self.weight
    * hidden_states.to(input_dtype)``): autograd keeps the fp32 input and, for a trained
    weight, the normalized tensor in the input's dtype; ``fp32_normed``: LitGPT >= 0.4.6's
    ``(x_normed * weight.float()).to(dtype)``, which keeps the normalized tensor in fp32."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    w = weight + offset if offset else weight
    if fp32_normed:
        return (normed * w.float()).to(x.dtype)
    return w * normed.to(x.dtype)


class _DequantizedLinear(torch.autograd.Function):  # the same in both modes
    """bitsandbytes ``MatMul4Bit``: dequantize the 4-bit weight into a compute-dtype scratch
    (``dequantize_4bit``), multiply, free the scratch; the backward dequantizes again for the
    input gradient. Saves only the input. The frozen packed weight gets no gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        packed: torch.Tensor,
        out_features: int,
        in_features: int,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        weight = torch.empty(out_features, in_features, dtype=x.dtype, device=x.device)
        y = F.linear(x, weight, bias)
        del weight
        ctx.save_for_backward(x, packed)
        ctx.shape = (out_features, in_features)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        _x, _packed = ctx.saved_tensors
        weight = torch.empty(*ctx.shape, dtype=dy.dtype, device=dy.device)
        dx = dy @ weight
        del weight
        return dx, None, None, None, None


def dequantized_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    out_features: int,
    in_features: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    return _apply(_DequantizedLinear, x, packed, out_features, in_features, bias)


def packed_linear(
    x: torch.Tensor, out_features: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """A fused quantized GEMM (GPTQ/AWQ/Marlin, int8, fp8 scaled_mm): reads the packed weight
    in place and writes only the output (no full-precision copy of the weight). Inference only.
    Values are zeros: the packed payload is synthetic."""
    out = x.new_zeros(*x.shape[:-1], out_features)
    if bias is not None:
        out += bias
    return out
