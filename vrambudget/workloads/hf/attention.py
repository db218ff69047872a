"""What a CUDA attention kernel allocates, under the framework's own attention code.

transformers runs its real attention code (``integrations/sdpa_attention.py``: the GQA choice,
``repeat_kv`` when a mask is given, the causal flag; ``eager_attention_forward``: plain ops). On
fake CPU tensors only the final kernel differs from CUDA, so only that is replaced:

* ``torch.nn.functional.scaled_dot_product_attention`` -- within :func:`cuda_sdpa` -- picks the
  backend CUDA would (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``
  ``select_sdp_backend``: flash first, then memory-efficient, then math) and allocates what it
  allocates (:mod:`vrambudget.workloads.kernels`);
* ``flash_attention_2`` (the ``flash_attn`` package, absent here) is registered as an attention
  function that prepares inputs as ``integrations/flash_attention.py`` does and runs the
  FlashAttention-2 emulation.

In native mode (real runs) nothing is replaced: the real kernels run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from .. import kernels

__all__ = ["FLASH_ATTENTION_2", "attn_implementation", "cuda_sdpa", "register"]

FLASH_ATTENTION_2 = "vrambudget_fa2"
_MEM_EFFICIENT_ALIGN = kernels.MEM_EFFICIENT_LSE_ALIGN
_HALF = (torch.float16, torch.bfloat16)
_FLASH_MAX_HEAD = 256  # sdp_utils.cpp check_head_dim_size_flash: head_dim <= 256


class _MemEfficientAttention(torch.autograd.Function):
    """PyTorch's memory-efficient attention (``_efficient_attention_forward``, xFormers'
    cutlass kernel): the output and an fp32 log-sum-exp padded to 32 rows
    (``attention.cu`` kAlignLSE); backward: the three input gradients and an fp32 ``delta``
    per row (``attention_backward.cu`` ``_efficient_attention_backward``)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, sq, _ = q.shape
        out = torch.empty(b, sq, h, v.shape[-1], dtype=q.dtype, device=q.device).transpose(1, 2)
        rows = -(-sq // _MEM_EFFICIENT_ALIGN) * _MEM_EFFICIENT_ALIGN
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


def _emulated_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (b, h, s, d) as the CUDA backends allocate it."""
    d = query.shape[-1]
    if attn_mask is None and query.dtype in _HALF and d <= _FLASH_MAX_HEAD and d % 8 == 0:
        # Flash: (b, s, h, d) memory, returned as a (b, h, s, d) view; native GQA.
        out: torch.Tensor = kernels.flash_attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=is_causal
        )
        return out.transpose(1, 2)
    # Memory-efficient: any head dim (sdp_utils.cpp check_head_dim_size_mem_efficient checks
    # alignment only), no native GQA.
    if not enable_gqa and key.shape[1] == query.shape[1]:
        # torch leaves Function.apply unannotated (called through the base class's type)
        function: type[torch.autograd.Function] = _MemEfficientAttention
        result: torch.Tensor = function.apply(query, key, value)
        return result
    math: Any = torch.ops.aten._scaled_dot_product_attention_math
    return math(  # type: ignore[no-any-return]
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        None,
        scale=scale,
        enable_gqa=enable_gqa,
    )[0]


@contextlib.contextmanager
def cuda_sdpa() -> Iterator[None]:
    """Within: ``F.scaled_dot_product_attention`` allocates as on CUDA (trace tier only)."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _emulated_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _flash_attention_2(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``integrations/flash_attention.py`` ``flash_attention_forward``: (b, h, s, d) inputs
    transposed to flash's (b, s, h, d) views; fp32 inputs cast to the target dtype; the
    FlashAttention-2 kernel (``flash_attn_func``) with native GQA. Returns (b, s, h, d)."""
    target = query.dtype if query.dtype in _HALF else torch.bfloat16
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if query.dtype not in _HALF:
        q, k, v = q.to(target), k.to(target), v.to(target)
    out: torch.Tensor = kernels.flash_attention(q, k, v, causal=query.shape[2] > 1)
    return out, None


_REGISTERED: list[bool] = []


def register() -> None:
    """Register the FlashAttention-2 stand-in with transformers (once per process)."""
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(FLASH_ATTENTION_2, _flash_attention_2)
    ALL_MASK_ATTENTION_FUNCTIONS.register(
        FLASH_ATTENTION_2, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"]
    )
    _REGISTERED.append(True)


def attn_implementation(attention: str, emulate: bool) -> str:
    """The ``attn_implementation`` a workload's ``attention`` runs with: ``eager`` and ``sdpa``
    as named (``sdpa``'s kernel emulated in the trace); ``flash``: FlashAttention-2 -- the real
    ``flash_attention_2`` on a GPU host, the stand-in in the trace."""
    if attention == "flash":
        if emulate:
            register()
            return FLASH_ATTENTION_2
        return "flash_attention_2"
    return attention
