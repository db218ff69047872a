"""What CUDA's scaled-dot-product attention allocates, under diffusers' and transformers' own
attention code.

Every attention of the pipelines traced here ends in ``torch.nn.functional.
scaled_dot_product_attention``, looked up at call time: diffusers' ``AttnProcessor2_0`` and
``JointAttnProcessor2_0`` (``models/attention_processor.py`` lines 1406, 2064 ...), the native
backend of ``dispatch_attention_fn`` that FLUX's ``FluxAttnProcessor`` calls
(``models/attention_dispatch.py`` line 888) and transformers' ``sdpa_attention_forward``
(CLIP, T5). Within :func:`cuda_sdpa` that function allocates what the CUDA backend PyTorch
would pick allocates, and computes nothing (fake tensors):

* flash (``sdp_utils.cpp`` ``check_head_dim_size_flash``: fp16/bf16, head dim <= 256 and a
  multiple of 8, no mask): the output and an fp32 log-sum-exp per row and head
  (:func:`vrambudget.workloads.kernels.flash_attention`);
* memory-efficient (``check_head_dim_size_mem_efficient``: only the head dim's alignment, 8
  for half and 4 for fp32 on sm80+, and an additive mask allowed): the output and an fp32
  log-sum-exp padded to 32 rows (``attention.cu`` kAlignLSE) -- the VAE's single 512-wide head
  and T5's position-biased attention take this path;
* math otherwise (``_scaled_dot_product_attention_math``: the scores materialized).

The attention slicing of diffusers (``SlicedAttnProcessor``) does not call it: it runs
``baddbmm`` and ``softmax`` per slice, which the trace records as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from .. import kernels

__all__ = ["cuda_sdpa", "emulated_sdpa"]

_HALF = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD = 256
_LSE_ALIGN = kernels.MEM_EFFICIENT_LSE_ALIGN


def _alignment(dtype: torch.dtype) -> int:
    """``minimum_gemm_alignment`` on sm80+: 128 bits / element bits with tensor cores."""
    return 8 if dtype in _HALF else 4


def _mem_efficient(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``_efficient_attention_forward``: the output (b, h, s, d_v) laid out (b, s, h, d_v) and
    the fp32 log-sum-exp (b, h, ceil(s / 32) x 32)."""
    b, h, sq, _ = q.shape
    out = torch.empty(b, sq, h, v.shape[-1], dtype=q.dtype, device=q.device).transpose(1, 2)
    rows = -(-sq // _LSE_ALIGN) * _LSE_ALIGN
    lse = torch.empty(b, h, rows, dtype=torch.float32, device=q.device)
    del lse
    return out


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
        return _mem_efficient(query, value)
    math: Any = torch.ops.aten._scaled_dot_product_attention_math
    result: torch.Tensor = math(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
        enable_gqa=enable_gqa,
    )[0]  # fmt: skip
    return result


@contextlib.contextmanager
def cuda_sdpa() -> Iterator[None]:
    """Within: ``F.scaled_dot_product_attention`` allocates as on CUDA (trace tier only)."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = emulated_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
