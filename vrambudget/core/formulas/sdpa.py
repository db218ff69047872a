"""Which kernel CUDA's ``F.scaled_dot_product_attention`` runs, and the sizes its choice fixes:
one rule for the analytic walk of image generation (:mod:`vrambudget.core.diffusion.blocks`)
and the trace tier's CUDA emulation (:mod:`vrambudget.workloads.kernels`), which runs it for
the built-in builders and for the frameworks' own attention code alike.

``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` ``select_sdp_backend`` tries flash,
then memory-efficient, then math:

* flash (``check_flash_attention_hardware_support``: NVIDIA compute capability 8.0 and later;
  ``check_tensor_dtype``: fp16/bf16 only; ``check_head_dim_size_flash``: head dim
  <= 256, a multiple of 8 here; ``check_for_attn_mask``: no mask; native GQA): the output and
  an fp32 log-sum-exp per row and head;
* memory-efficient (``check_head_dim_size_mem_efficient``: the q and v head dims aligned to
  ``minimum_gemm_alignment``, 8 elements for fp16/bf16 and 4 for fp32 on sm80+;
  ``less_than_sm80_mem_efficient_dtypes``: fp16 and fp32 only below sm80, so no bf16 there; an
  additive mask allowed; ``check_batch_size_and_num_heads_dense<false>``: no native GQA before
  torch 2.14, whose NVIDIA kernel takes it -- pytorch#191085; 2.14.0's
  ``scaled_dot_product_attention`` docstring: "Memory-efficient attention also supports GQA on
  NVIDIA CUDA"): the output and an fp32 log-sum-exp padded to 32 rows (``attention.cu``
  ``kAlignLSE``) -- fp32 inputs always land here or in math;
* math otherwise (``attention.cpp`` ``_scaled_dot_product_attention_math``): the scores
  materialized, in fp32 for 16-bit inputs (:func:`math_score_bytes`).

So below sm80 (T4, V100) any bf16 call runs the math path, and before torch 2.14 so does a
grouped-query call with ``enable_gqa`` -- transformers' unmasked one,
:func:`transformers_sdpa_backend` -- below sm80 or in fp32.
"""

from __future__ import annotations

from typing import Literal

from ..units import round_up

__all__ = [
    "FLASH_MAX_HEAD",
    "FLASH_MIN_CC",
    "MATH_SOFTMAX_PEAK_BYTES",
    "MEM_EFFICIENT_GQA_TORCH",
    "MEM_EFFICIENT_LSE_ALIGN",
    "SdpaBackend",
    "flash_hardware",
    "flash_hardware_cc",
    "lse_rows",
    "mem_efficient_gqa",
    "sdpa_backend",
    "transformers_sdpa_backend",
]

SdpaBackend = Literal["flash", "mem_efficient", "math"]

FLASH_MAX_HEAD = 256
"""``check_head_dim_size_flash``: FlashAttention-2 takes head dims up to 256."""
FLASH_HEAD_MULTIPLE = 8
MEM_EFFICIENT_LSE_ALIGN = 32
"""Memory-efficient attention pads its fp32 log-sum-exp to a multiple of 32 rows
(``attention.cu`` ``kAlignLSE``)."""


FLASH_MIN_CC = (8, 0)
"""``check_flash_attention_hardware_support`` (``check_sm_version<sm80, ...>``): FlashAttention
runs from compute capability 8.0; below it the memory-efficient kernel takes no bf16 either."""

MEM_EFFICIENT_GQA_TORCH = (2, 14)
"""The first torch release whose NVIDIA memory-efficient kernel takes grouped K/V heads."""

MATH_SOFTMAX_PEAK_BYTES = 9
"""Bytes per score element live inside the math path's ``_safe_softmax`` (one
CompositeExplicitAutograd kernel for every device): its fp32 input (the scores, the causal mask
added in place), the fp32 softmax output and the ``isneginf`` bool mask, 4 + 4 + 1; the
masked rows are then zeroed in place (torch 2.13.0's profiler: ``softmax``, ``isneginf``,
``all``, then ``where`` allocating nothing)."""


def flash_hardware(compute_capability: str | None, vendor: str) -> bool:
    """Whether a device runs SDPA's FlashAttention kernel (and the memory-efficient kernel in
    bf16), from its compute capability as the catalog writes it (``"7.5"``):
    :func:`flash_hardware_cc`. Worked cases: T4 (7.5) and V100 (7.0) no; A10 (8.6) yes."""
    if not compute_capability:
        return flash_hardware_cc(None, vendor)
    major, _, minor = compute_capability.partition(".")
    try:
        return flash_hardware_cc((int(major), int(minor or 0)), vendor)
    except ValueError:
        return flash_hardware_cc(None, vendor)


def flash_hardware_cc(cc: tuple[int, int] | None, vendor: str) -> bool:
    """:func:`flash_hardware` from a parsed compute capability: NVIDIA from 8.0
    (:data:`FLASH_MIN_CC`); a device of unknown capability, and AMD's (AOTriton's flash and
    memory-efficient kernels on the Instinct targets this catalog lists), are taken to."""
    return vendor != "nvidia" or cc is None or cc >= FLASH_MIN_CC


def mem_efficient_gqa(torch_version: tuple[int, ...], vendor: str) -> bool:
    """Whether SDPA's memory-efficient kernel takes grouped K/V heads: NVIDIA, torch
    :data:`MEM_EFFICIENT_GQA_TORCH` on (``torch_version`` parsed)."""
    return vendor == "nvidia" and torch_version >= MEM_EFFICIENT_GQA_TORCH


def _alignment(half: bool) -> int:
    """``minimum_gemm_alignment`` on sm80+: 128 bits / element bits with tensor cores."""
    return 8 if half else 4


def sdpa_backend(
    *,
    half: bool,
    head_dim: int,
    v_head_dim: int,
    mask: bool,
    gqa: bool,
    bf16: bool = False,
    flash_hw: bool = True,
    mem_efficient_gqa: bool = False,
) -> SdpaBackend:
    """The backend ``select_sdp_backend`` picks for inputs of a 16-bit float dtype (``half``;
    ``bf16`` for bfloat16) or fp32, the q/k and v head dims, an attention mask, fewer
    key/value heads than query heads passed as they are (``gqa``: ``enable_gqa``), on a device
    with or without FlashAttention (``flash_hw``: :func:`flash_hardware`), with a
    memory-efficient kernel that takes grouped heads or not (``mem_efficient_gqa``: torch 2.14+
    on NVIDIA, :data:`MEM_EFFICIENT_GQA_TORCH`).

    Worked cases: SD 1.5's UNet (fp16, head dim 40, no mask) -> flash; the SD VAE's mid
    attention (one head of 512) -> memory-efficient; T5 (its position bias is a mask) ->
    memory-efficient; fp32 GQA -> math; fp16 GQA on a T4 -> math; bf16 on a T4 -> math."""
    if (
        flash_hw
        and half
        and not mask
        and head_dim <= FLASH_MAX_HEAD
        and head_dim % FLASH_HEAD_MULTIPLE == 0
    ):
        return "flash"
    align = _alignment(half)
    dtype_ok = flash_hw or not bf16
    aligned = head_dim % align == 0 and v_head_dim % align == 0
    if dtype_ok and aligned and (mem_efficient_gqa or not gqa):
        return "mem_efficient"
    return "math"


def transformers_sdpa_backend(
    *,
    dtype: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    native_gqa: bool,
    flash_hw: bool,
    mem_efficient_gqa: bool = False,
    mask: bool = False,
) -> SdpaBackend:
    """The backend of transformers' ``sdpa_attention_forward`` on an unpadded batch (no mask:
    ``is_causal``; ``mask``: a sliding-window layer whose keys reach its window, which
    ``masking_utils._ignore_causal_mask_sdpa`` gives a mask), with compute ``dtype``
    (``fp32`` / ``fp16`` / ``bf16``). Grouped K/V heads
    go to SDPA as they are (``enable_gqa``) where the release does that (``native_gqa``:
    :attr:`vrambudget.core.stack.Stack.sdpa_native_gqa`) and the head dims are equal and at
    most 256 (5.23.0 ``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa``); otherwise
    ``repeat_kv`` gives every query head its own copy first. Worked cases: Llama 3 8B (32 heads,
    8 K/V heads, 128) in fp16 on a T4 -> math before torch 2.14 (``mem_efficient_gqa``),
    memory-efficient since; on an A10 -> flash; in fp32 on an A100 -> math before torch 2.14;
    in bf16 on a T4 -> math; GPT-2 (12 heads, 12 K/V heads) in fp16 on a T4 ->
    memory-efficient, in bf16 -> math."""
    passed = (
        kv_heads < heads and native_gqa and not mask and head_dim == v_head_dim <= FLASH_MAX_HEAD
    )
    return sdpa_backend(
        half=dtype in ("fp16", "bf16"),
        bf16=dtype == "bf16",
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        mask=mask,
        gqa=passed,
        flash_hw=flash_hw,
        mem_efficient_gqa=mem_efficient_gqa,
    )


def lse_rows(backend: SdpaBackend, sq: int) -> int:
    """Rows of the fp32 log-sum-exp per batch and head: ``sq`` for flash, ``sq`` rounded up to
    32 for the memory-efficient kernel (math keeps none). Worked number: 77 CLIP tokens ->
    96 rows memory-efficient."""
    if backend == "flash":
        return sq
    if backend == "mem_efficient":
        return round_up(sq, MEM_EFFICIENT_LSE_ALIGN)
    return 0
