"""Dtypes of weights, compute and KV cache, and the weights' quantization scheme."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from ..dtypes import ComputeDType, KVCacheDType, WeightDType
from . import rules
from .limits import Wire

__all__ = ["AWQ", "FP8", "GPTQ", "BitsAndBytes4bit", "Int8", "Precision", "Quantization"]


class _QuantBase(Wire, frozen=True, kw_only=True):
    quantize_embeddings: Annotated[
        bool, Meta(description="Quantize the token embedding too (most schemes keep it).")
    ] = False
    quantize_lm_head: Annotated[
        bool, Meta(description="Quantize the LM head too (most schemes keep it).")
    ] = False


class Int8(_QuantBase, tag="int8", tag_field="scheme", frozen=True, kw_only=True):
    """8-bit integer weights with one scale per output channel (bitsandbytes LLM.int8 keeps an
    fp32 ``SCB`` per row; w8a16 checkpoints keep fp16/bf16 scales)."""

    scale_dtype: Annotated[
        Literal["fp32", "fp16", "bf16"],
        Meta(description="Dtype of the per-output-channel scales (4 or 2 bytes per row)."),
    ] = "fp32"


class FP8(_QuantBase, tag="fp8", tag_field="scheme", frozen=True, kw_only=True):
    """fp8 (e4m3) weights with fp32 scales per tensor, per output channel, or per 2-D block
    (DeepSeek-V3's 128x128 ``weight_scale_inv``)."""

    granularity: Annotated[
        Literal["tensor", "channel", "block"],
        Meta(
            description="One fp32 scale per tensor, per output channel, or per "
            "block_size x block_size block."
        ),
    ] = "tensor"
    block_size: Annotated[
        int,
        Meta(
            ge=1,
            le=1 << 16,
            description="Side of a square scale block, elements (only with granularity `block`).",
        ),
    ] = 128


class GPTQ(_QuantBase, tag="gptq", tag_field="scheme", frozen=True, kw_only=True):
    """GPTQ packed integers: ``qweight`` int32 (in*bits/32, out), ``qzeros`` int32
    (groups, out*bits/32), ``scales`` fp16 (groups, out), ``g_idx`` int32 (in,)."""

    bits: Annotated[Literal[2, 3, 4, 8], Meta(description="Bits per weight.")] = 4
    group_size: Annotated[
        int, Meta(ge=-1, le=1 << 16, description="Input features per group; -1: one group.")
    ] = 128

    def __post_init__(self) -> None:
        rules.check(self)


class AWQ(_QuantBase, tag="awq", tag_field="scheme", frozen=True, kw_only=True):
    """AWQ GEMM layout: ``qweight`` int32 (in, out*bits/32), ``qzeros`` int32
    (groups, out*bits/32), ``scales`` fp16 (groups, out)."""

    bits: Annotated[Literal[4], Meta(description="Bits per weight (AWQ GEMM: 4 only).")] = 4
    group_size: Annotated[
        int,
        Meta(
            ge=-1,
            le=1 << 16,
            description="Input features per group (one zero and one "
            "scale per group and output feature); -1: one group.",
        ),
    ] = 128

    def __post_init__(self) -> None:
        rules.check(self)


class BitsAndBytes4bit(_QuantBase, tag="bnb_4bit", tag_field="scheme", frozen=True, kw_only=True):
    """bitsandbytes NF4/FP4: two values per byte, an fp32 absmax per block; with double
    quantization the absmax is itself quantized to uint8 with fp32 second-level scales."""

    quant_type: Annotated[
        Literal["nf4", "fp4"],
        Meta(description="4-bit code; both store the same bytes."),
    ] = "nf4"
    block_size: Annotated[
        Literal[32, 64, 128, 256, 512, 1024, 2048, 4096],
        Meta(description="Elements per absmax block."),
    ] = 64
    double_quant: Annotated[
        bool,
        Meta(
            description="Quantize the absmax values to uint8 (nested blocks of 256 with "
            "fp32 scales) instead of keeping them fp32."
        ),
    ] = False


Quantization = Int8 | FP8 | GPTQ | AWQ | BitsAndBytes4bit


class Precision(Wire, frozen=True, kw_only=True):
    weights: Annotated[
        WeightDType,
        Meta(
            description="Storage dtype of unquantized weights. `fp8` stores the linear layers "
            "in fp8 with per-tensor scales (as `quantization: {scheme: fp8}`)."
        ),
    ] = "bf16"
    compute: Annotated[ComputeDType, Meta(description="Activation/compute dtype.")] = "bf16"
    kv_cache: Annotated[KVCacheDType, Meta(description="`auto`: the compute dtype.")] = "auto"
    quantization: Annotated[
        Quantization | None,
        Meta(
            description="Quantization of the linear layers (and expert MLPs); default (null): "
            "none, all weights stored in `weights`."
        ),
    ] = None

    def __post_init__(self) -> None:
        rules.check(self)
