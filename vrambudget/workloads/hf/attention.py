"""What a CUDA attention kernel allocates, under transformers' own attention code.

transformers runs its real attention code (``integrations/sdpa_attention.py``,
``eager_attention_forward``: plain ops). On fake CPU tensors only the final kernel differs from
CUDA, so only that is replaced: ``torch.nn.functional.scaled_dot_product_attention`` by
:func:`vrambudget.workloads.sdpa.cuda_sdpa` (shared with the diffusion pipelines), and
``flash_attention_2`` (the ``flash_attn`` package, absent here) registered as an attention
function that prepares inputs as ``integrations/flash_attention.py`` does and runs the
FlashAttention-2 emulation.

In native mode (real runs) nothing is replaced: the real kernels run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .. import kernels
from ..sdpa import cuda_sdpa

__all__ = ["FLASH_ATTENTION_2", "attn_implementation", "cuda_sdpa", "register", "unpadded_batches"]

FLASH_ATTENTION_2 = "vrambudget_fa2"


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
    half = query.dtype in kernels.HALF_DTYPES
    target = query.dtype if half else torch.bfloat16
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if not half:
        q, k, v = q.to(target), k.to(target), v.to(target)
    out = kernels.flash_attention_2(q, k, v, causal=query.shape[2] > 1)
    return out, None


def _unpadded_mask(*args: Any, **kwargs: Any) -> None:
    """FlashAttention-2's mask for the trace's batches, which have no padding:
    ``masking_utils.py`` ``flash_attention_mask`` returns None when the 2-D mask is all ones
    (line 673) -- a test of tensor values, which fake tensors do not have."""
    return None


@contextlib.contextmanager
def unpadded_batches() -> Iterator[None]:
    """Within: transformers' mask code decides as it does on a GPU for the trace's batches,
    which have no padding and are not packed -- two tests of tensor values that fake tensors
    cannot answer (``masking_utils.is_tracing`` is true for them). ``_ignore_causal_mask_sdpa``
    sees no padding mask, so SDPA gets ``is_causal`` and no mask (and grouped K/V heads as
    they are: ``use_gqa_in_sdpa``); ``find_packed_sequence_indices`` finds no packed
    sequences (on fake tensors it reported every training batch as packed, and a 4-D mask
    made SDPA's call repeat K/V to every head). In native mode nothing is replaced."""
    from transformers import masking_utils

    ignore = masking_utils._ignore_causal_mask_sdpa
    packed = masking_utils.find_packed_sequence_indices

    def unpadded(padding_mask: Any, *args: Any, **kwargs: Any) -> bool:
        return bool(ignore(None, *args, **kwargs))

    def not_packed(position_ids: torch.Tensor) -> None:
        return None

    masking_utils._ignore_causal_mask_sdpa = unpadded
    masking_utils.find_packed_sequence_indices = not_packed
    try:
        yield
    finally:
        masking_utils._ignore_causal_mask_sdpa = ignore
        masking_utils.find_packed_sequence_indices = packed


_REGISTERED: list[bool] = []


def register() -> None:
    """Register the FlashAttention-2 stand-in with transformers (once per process)."""
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(FLASH_ATTENTION_2, _flash_attention_2)
    ALL_MASK_ATTENTION_FUNCTIONS.register(FLASH_ATTENTION_2, _unpadded_mask)
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
