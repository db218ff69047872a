"""What CUDA's scaled-dot-product attention allocates, under the frameworks' own attention code.

Every attention the traced frameworks run that is not eager ends in ``torch.nn.functional.
scaled_dot_product_attention``, looked up at call time: transformers' ``sdpa_attention_forward``
(``integrations/sdpa_attention.py``: the GQA choice, ``repeat_kv`` when a mask is given, the
causal flag), diffusers' ``AttnProcessor2_0`` / ``JointAttnProcessor2_0``
(``models/attention_processor.py``) and the native backend of ``dispatch_attention_fn`` that
FLUX calls (``models/attention_dispatch.py``). Within :func:`cuda_sdpa` that function allocates
what the backend CUDA would pick allocates (``aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp`` ``select_sdp_backend``: flash first, then memory-efficient, then math), and
computes nothing (fake tensors):

* flash (``check_head_dim_size_flash``: fp16/bf16, head dim <= 256 and a multiple of 8, no
  mask; native GQA): the output and an fp32 log-sum-exp per row and head, and in the backward
  FlashAttention-2's buffers (:func:`vrambudget.workloads.kernels.flash_attention`);
* memory-efficient (``check_head_dim_size_mem_efficient``: only the head dim's alignment, 8 for
  half and 4 for fp32 on sm80+; an additive mask allowed; no native GQA): the output and an fp32
  log-sum-exp padded to 32 rows (``attention.cu`` kAlignLSE); its backward the three input
  gradients and an fp32 ``delta`` per row (``attention_backward.cu``);
* math otherwise (``_scaled_dot_product_attention_math``: the scores materialized, as on CUDA).

In native mode (real runs) nothing is replaced: the real kernels run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from . import kernels

__all__ = ["cuda_sdpa", "emulated_sdpa"]

_HALF = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD = 256
_LSE_ALIGN = kernels.MEM_EFFICIENT_LSE_ALIGN


def _alignment(dtype: torch.dtype) -> int:
    """``minimum_gemm_alignment`` on sm80+: 128 bits / element bits with tensor cores."""
    return 8 if dtype in _HALF else 4


class _MemEfficientAttention(torch.autograd.Function):
    """``_efficient_attention_forward`` / ``_efficient_attention_backward``."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, sq, _ = q.shape
        out = torch.empty(b, sq, h, v.shape[-1], dtype=q.dtype, device=q.device).transpose(1, 2)
        rows = -(-sq // _LSE_ALIGN) * _LSE_ALIGN
        lse = torch.empty(b, h, rows, dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, _out, _lse = ctx.saved_tensors
        b, h, sq, _ = q.shape
        delta = torch.empty(b, h, sq, dtype=torch.float32, device=q.device)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        del delta
        return dq, dk, dv


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
    """``F.scaled_dot_product_attention`` on (b, h, s, d) as the CUDA backend allocates."""
    d = query.shape[-1]
    if attn_mask is None and query.dtype in _HALF and d <= _FLASH_MAX_HEAD and d % 8 == 0:
        out: torch.Tensor = kernels.flash_attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=is_causal
        )
        return out.transpose(1, 2)
    align = _alignment(query.dtype)
    if d % align == 0 and value.shape[-1] % align == 0 and key.shape[1] == query.shape[1]:
        function: type[torch.autograd.Function] = _MemEfficientAttention
        result: torch.Tensor = function.apply(query, key, value)
        return result
    math: Any = torch.ops.aten._scaled_dot_product_attention_math
    mathed: torch.Tensor = math(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
        enable_gqa=enable_gqa,
    )[0]  # fmt: skip
    return mathed


@contextlib.contextmanager
def cuda_sdpa() -> Iterator[None]:
    """Within: ``F.scaled_dot_product_attention`` allocates as on CUDA (trace tier only)."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = emulated_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
