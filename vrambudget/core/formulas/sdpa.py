"""Which kernel CUDA's ``F.scaled_dot_product_attention`` runs, and the sizes its choice fixes:
one rule for the analytic walk of image generation (:mod:`vrambudget.core.diffusion.blocks`)
and the trace tier's CUDA emulation (:mod:`vrambudget.workloads.kernels`), which runs it for
the built-in builders and for the frameworks' own attention code alike.

``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` ``select_sdp_backend`` tries flash,
then memory-efficient, then math:

* flash (``check_tensor_dtype``: fp16/bf16 only; ``check_head_dim_size_flash``: head dim
  <= 256, a multiple of 8 here; ``check_for_attn_mask``: no mask; native GQA): the output and
  an fp32 log-sum-exp per row and head;
* memory-efficient (``check_head_dim_size_mem_efficient``: the q and v head dims aligned to
  ``minimum_gemm_alignment``, 8 elements for fp16/bf16 and 4 for fp32 on sm80+; an additive
  mask allowed; no native GQA): the output and an fp32 log-sum-exp padded to 32 rows
  (``attention.cu`` ``kAlignLSE``) -- fp32 inputs always land here or in math;
* math otherwise (``_scaled_dot_product_attention_math``): the scores materialized.
"""

from __future__ import annotations

from typing import Literal

from ..units import round_up

__all__ = [
    "FLASH_MAX_HEAD",
    "MEM_EFFICIENT_LSE_ALIGN",
    "SdpaBackend",
    "lse_rows",
    "sdpa_backend",
]

SdpaBackend = Literal["flash", "mem_efficient", "math"]

FLASH_MAX_HEAD = 256
"""``check_head_dim_size_flash``: FlashAttention-2 takes head dims up to 256."""
FLASH_HEAD_MULTIPLE = 8
MEM_EFFICIENT_LSE_ALIGN = 32
"""Memory-efficient attention pads its fp32 log-sum-exp to a multiple of 32 rows
(``attention.cu`` ``kAlignLSE``)."""


def _alignment(half: bool) -> int:
    """``minimum_gemm_alignment`` on sm80+: 128 bits / element bits with tensor cores."""
    return 8 if half else 4


def sdpa_backend(
    *, half: bool, head_dim: int, v_head_dim: int, mask: bool, gqa: bool
) -> SdpaBackend:
    """The backend ``select_sdp_backend`` picks for inputs of a 16-bit float dtype (``half``)
    or fp32, the q/k and v head dims, an attention mask, and fewer key/value heads than query
    heads (``gqa``).

    Worked cases: SD 1.5's UNet (fp16, head dim 40, no mask) -> flash; the SD VAE's mid
    attention (one head of 512) -> memory-efficient; T5 (its position bias is a mask) ->
    memory-efficient; fp32 GQA -> math."""
    if half and not mask and head_dim <= FLASH_MAX_HEAD and head_dim % FLASH_HEAD_MULTIPLE == 0:
        return "flash"
    align = _alignment(half)
    if head_dim % align == 0 and v_head_dim % align == 0 and not gqa:
        return "mem_efficient"
    return "math"


def lse_rows(backend: SdpaBackend, sq: int) -> int:
    """Rows of the fp32 log-sum-exp per batch and head: ``sq`` for flash, ``sq`` rounded up to
    32 for the memory-efficient kernel (math keeps none). Worked number: 77 CLIP tokens ->
    96 rows memory-efficient."""
    if backend == "flash":
        return sq
    if backend == "mem_efficient":
        return round_up(sq, MEM_EFFICIENT_LSE_ALIGN)
    return 0
