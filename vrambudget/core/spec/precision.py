"""Dtypes of weights, compute and KV cache, and the weights' quantization scheme.

Each scheme names the tensors its loader creates for one linear layer of ``out x in`` weights
(the byte arithmetic is :func:`vrambudget.core.quantization.tensor_storage`); the sources are the
released libraries cited in each docstring (file and line of the version read)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, UnsetType

from ..dtypes import ComputeDType, KVCacheDType, WeightDType
from . import rules
from .limits import Wire

__all__ = [
    "AWQ",
    "FP8",
    "GPTQ",
    "MXFP4",
    "NVFP4",
    "AWQVersion",
    "BitsAndBytes4bit",
    "CTFormat",
    "CTStrategy",
    "CompressedTensors",
    "GPTQFormat",
    "Int8",
    "Precision",
    "Quantization",
]

_Side = Annotated[int, Meta(ge=1, le=1 << 16)]


GPTQFormat = Literal["gptq", "gptq_v2", "marlin"]
AWQVersion = Literal["gemm", "gemv", "gemv_fast", "marlin", "exllama"]
CTFormat = Literal["pack-quantized", "int-quantized", "float-quantized", "naive-quantized"]
CTStrategy = Literal["tensor", "channel", "group", "block", "tensor_group"]


class _QuantBase(Wire, frozen=True, kw_only=True):
    quantize_embeddings: Annotated[
        bool, Meta(description="Quantize the token embedding too (most schemes keep it).")
    ] = False
    quantize_lm_head: Annotated[
        bool, Meta(description="Quantize the LM head too (most schemes keep it).")
    ] = False


class Int8(_QuantBase, tag="int8", tag_field="scheme", frozen=True, kw_only=True):
    """8-bit integer weights with one scale per output channel: bitsandbytes LLM.int8
    (``Linear8bitLt``) keeps ``weight`` int8 (out, in) and ``SCB`` fp32 (out,) on the device
    (bitsandbytes 0.50.2 ``nn/modules.py`` 743-746 ``Int8Params``: ``CB, SCB, _ =
    int8_vectorwise_quant(B)``); its checkpoint adds a 1-byte ``weight_format`` uint8 scalar
    (``nn/modules.py`` 1109-1117) that loading drops. w8a16 checkpoints keep fp16/bf16 scales."""

    scale_dtype: Annotated[
        Literal["fp32", "fp16", "bf16"],
        Meta(description="Dtype of the per-output-channel scales (4 or 2 bytes per row)."),
    ] = "fp32"


class FP8(_QuantBase, tag="fp8", tag_field="scheme", frozen=True, kw_only=True):
    """fp8 (e4m3) weights ``weight`` (out, in) with fp32 scales: per tensor (transformers
    ``FP8Linear`` ``weight_scale_inv`` 0-d, vLLM ``weight_scale``), per output channel (FBGEMM
    ``weight_scale`` (out, 1): transformers 5.23.0 ``integrations/fbgemm_fp8.py`` 110-111) or per
    2-D block (DeepSeek-V3 ``weight_scale_inv`` (ceil(out/128), ceil(in/128)): transformers 5.23.0
    ``integrations/finegrained_fp8.py`` 408-420). A static activation scheme adds one fp32
    ``input_scale`` / ``activation_scale`` per tensor (``finegrained_fp8.py`` 422-423)."""

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
    input_scale: Annotated[
        bool,
        Meta(
            description="A static activation scale: one more fp32 scalar per tensor "
            "(`activation_scheme: static`)."
        ),
    ] = False


class GPTQ(_QuantBase, tag="gptq", tag_field="scheme", frozen=True, kw_only=True):
    """GPTQ packed integers. Checkpoint format ``gptq`` / ``gptq_v2`` (same tensors; v2 stores
    the zero points without the -1 offset): ``qweight`` int32 (ceil(in*bits/32), out),
    ``qzeros`` int32 (groups, ceil(out*bits/32)), ``scales`` fp16 (groups, out), ``g_idx``
    int32 (in,) whether or not ``desc_act`` (GPTQModel 7.7.0 ``nn_modules/qlinear/__init__.py``
    932-956; AutoGPTQ 0.7.1 ``nn_modules/qlinear/qlinear_cuda_old.py`` 50-74 writes
    ``in // 32 * bits`` rows, the same for ``in`` a multiple of 32, 3-bit included).
    ``marlin`` (AutoGPTQ ``qlinear_marlin.py`` 111-119, 4-bit only): ``B`` int32
    (in/16, out*16*bits/32) and ``s`` fp16 (groups, out), no zeros, no ``g_idx``."""

    bits: Annotated[Literal[2, 3, 4, 8], Meta(description="Bits per weight.")] = 4
    group_size: Annotated[
        int, Meta(ge=-1, le=1 << 16, description="Input features per group; -1: one group.")
    ] = 128
    checkpoint_format: Annotated[
        GPTQFormat,
        Meta(
            description="Serialized layout: `gptq` and `gptq_v2` store qweight, qzeros, scales "
            "and g_idx; `marlin` (AutoGPTQ, 4-bit) stores B and s only."
        ),
    ] = "gptq"
    kernel: Annotated[
        Literal["exllama", "exllamav2"] | None,
        Meta(
            description="AutoGPTQ kernel whose fixed scratch the budget counts as runtime "
            "workspace (AutoGPTQ 0.5-0.7, as transformers' GPTQConfig `exllama_config` "
            "selects it): `exllamav2` allocates 2 x in x out + 65,536 x out + 256 B for its "
            "largest layer (max_input_len 2048 x max_batch_size 8) and keeps 4 B per input "
            "feature of every layer; `exllama` 2 x in x out. Default (null): no kernel scratch."
        ),
    ] = None

    def __post_init__(self) -> None:
        rules.check(self)


class AWQ(_QuantBase, tag="awq", tag_field="scheme", frozen=True, kw_only=True):
    """AWQ 4-bit, per AutoAWQ 0.2.9 ``awq/modules/linear``. ``gemm`` / ``exllama``
    (``gemm.py`` 135-158): ``qweight`` int32 (in, out/8), ``qzeros`` int32 (groups, out/8),
    ``scales`` fp16 (groups, out). ``gemv`` (``gemv.py`` 45-69): ``qweight`` int32 (out, in/8),
    ``qzeros`` int32 (out, w), ``scales`` fp16 (out, 8w) with the padded group width
    w = ceil(ceil(groups/8)/m)*m, m = 1 (group >= 128), 2 (64), 4 (32) (``gemv.py`` 12-24).
    ``gemv_fast`` (``gemv_fast.py`` 86-118): ``qweight`` int16 (out/4, in), ``scales`` and
    ``qzeros`` fp16 (8w, out) each. ``marlin`` (``marlin.py`` 60-75): ``qweight`` int32
    (in/16, out*2), ``scales`` fp16 (groups, out), no zeros."""

    bits: Annotated[Literal[4], Meta(description="Bits per weight (AWQ: 4 only).")] = 4
    group_size: Annotated[
        int,
        Meta(
            ge=-1,
            le=1 << 16,
            description="Input features per group (one zero and one "
            "scale per group and output feature); -1: one group.",
        ),
    ] = 128
    version: Annotated[
        AWQVersion,
        Meta(
            description="Packing layout (`version` / `format` of the config); `exllama` "
            "checkpoints are stored as `gemm`."
        ),
    ] = "gemm"

    def __post_init__(self) -> None:
        rules.check(self)


class BitsAndBytes4bit(_QuantBase, tag="bnb_4bit", tag_field="scheme", frozen=True, kw_only=True):
    """bitsandbytes NF4/FP4 (``Params4bit``), per bitsandbytes 0.50.2 ``functional.py``
    ``quantize_4bit`` 884-969: the flattened weight packed two per byte (uint8 (ceil(n/2), 1)),
    an fp32 ``absmax`` per block and the 16-entry fp32 code (``quant_map``). With double
    quantization (``compress_statistics``, 938-949) ``absmax`` is uint8, quantized again in
    blocks of 256 with fp32 ``nested_absmax``, an fp32 ``offset`` and the 256-entry fp32 dynamic
    map (``nested_quant_map``; ``quantize_blockwise`` 653-656 shares one map while quantizing,
    ``QuantState.from_dict`` gives each tensor of a loaded checkpoint its own copy). A
    checkpoint also stores the ``quant_state.bitsandbytes__<type>`` JSON tensor (``as_dict``
    545-578; see ``quantization.bnb_serialized_state_bytes``), which loading consumes."""

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
    prequantized: Annotated[
        bool,
        Meta(
            description="Loaded from a bitsandbytes checkpoint: with double_quant each tensor "
            "keeps its own 256-entry fp32 nested quant map (1,024 B); quantizing while loading "
            "(QLoRA) shares one."
        ),
    ] = False
    quantize_experts: Annotated[
        bool | None,
        Meta(
            description="Whether a mixture of experts' routed experts are 4-bit. null (the "
            "default): as the stack does it -- transformers < 5 builds each expert as nn.Linear "
            "modules, which bitsandbytes replaces; transformers 5 keeps them as fused 3-D "
            "parameters, which its conversion skips (bitsandbytes-foundation/bitsandbytes#1849), "
            "so they stay in the weights' dtype (fp32 after QLoRA's "
            "prepare_model_for_kbit_training). true: a stack that quantizes fused experts "
            "(recent Unsloth)."
        ),
    ] = None


class MXFP4(_QuantBase, tag="mxfp4", tag_field="scheme", frozen=True, kw_only=True):
    """OCP MX fp4 (e2m1) in blocks of 32 elements along the input dimension, one e8m0 (uint8)
    scale per block, as gpt-oss checkpoints store their experts: ``*_blocks`` uint8
    (..., out, ceil(in/32), 16) and ``*_scales`` uint8 (..., out, ceil(in/32)) (transformers
    5.23.0 ``integrations/mxfp4.py`` 199, 245-249; vLLM 0.34.0 ``mxfp4.py`` 211-263:
    ``w13_weight_scale`` uint8 (experts, out, in // 32)). compressed-tensors
    ``mxfp4-pack-quantized`` stores the same bytes as ``weight_packed`` uint8 (out, in/2) and
    ``weight_scale`` uint8 (out, in/32) (compressed-tensors 0.20.1 ``compressors/mxfp4/base.py``
    35-50). Only routed experts are quantized: transformers replaces ``GptOssMLP`` experts alone
    (``mxfp4.py`` 525) and vLLM keeps linear layers unquantized (``mxfp4.py`` 95-106)."""


class NVFP4(_QuantBase, tag="nvfp4", tag_field="scheme", frozen=True, kw_only=True):
    """NVIDIA fp4 (e2m1) two per byte, one fp8 e4m3 scale per 16 input elements and a per-tensor
    fp32 global scale. ModelOpt (``quant_algo: NVFP4``): ``weight`` uint8 (out, in/2),
    ``weight_scale`` fp8 (out, in/16), ``weight_scale_2`` fp32 and, for W4A4, ``input_scale``
    fp32 (vLLM 0.34.0 ``model_executor/layers/quantization/modelopt.py`` 2139-2182, 2221-2231).
    compressed-tensors ``nvfp4-pack-quantized``: ``weight_packed`` uint8 (out, in/2),
    ``weight_scale`` fp8 (out, ceil(in/16)), ``weight_global_scale`` fp32 (1,) and
    ``input_global_scale`` fp32 (1,) when activations are quantized (compressed-tensors 0.20.1
    ``compressors/nvfp4/base.py`` 37-54, ``quantization/lifecycle/initialize.py`` 201-207)."""

    input_scale: Annotated[
        bool,
        Meta(
            description="W4A4: one fp32 input (global) scale per tensor is stored; false for "
            "weight-only checkpoints (`W4A16_NVFP4`, NVFP4A16)."
        ),
    ] = True


class CompressedTensors(
    _QuantBase, tag="compressed_tensors", tag_field="scheme", frozen=True, kw_only=True
):
    """A ``compressed-tensors`` checkpoint (compressed-tensors 0.20.1). ``pack-quantized``
    (``compressors/pack_quantized/base.py`` 45-58, 84-106; ``helpers.py`` 63):
    ``weight_packed`` int32 (out, ceil(in*bits/32)), ``weight_shape`` int64 (2,), and when
    asymmetric with strategy group/channel ``weight_zero_point`` int32 packed along the output
    dimension (ceil(out*bits/32), groups). ``int-quantized`` / ``float-quantized`` /
    ``naive-quantized`` (``compressors/naive_quantized/base.py`` 35-43, 75-93): ``weight`` int8 or
    fp8 e4m3 (out, in) and an unpacked ``weight_zero_point`` (scale's shape, int8 / fp8) when
    asymmetric. ``weight_scale`` (``quantization/lifecycle/initialize.py`` 213-274): (1,) per
    tensor, (out, 1) per channel, (out, ceil(in/group)) per group, (ceil(out/r), ceil(in/c)) per
    block, in the model's dtype (bf16/fp16/fp32) unless the config names a ``scale_dtype``;
    ``tensor_group`` adds ``weight_global_scale`` fp32 (1,) (201-207). Checkpoints written
    before ``actorder: group`` was removed also store ``weight_g_idx`` int32 (in,)
    (compressed-tensors 0.9.4 ``quantization/lifecycle/initialize.py`` 193-201)."""

    format: Annotated[
        CTFormat,
        Meta(description="The compressor that wrote the weights."),
    ] = "pack-quantized"
    num_bits: Annotated[int, Meta(ge=1, le=8, description="Bits per weight (1 .. 8).")] = 4
    type: Annotated[
        Literal["int", "float"], Meta(description="Integer or floating-point (fp8) weights.")
    ] = "int"
    strategy: Annotated[
        CTStrategy,
        Meta(description="What one scale covers."),
    ] = "group"
    group_size: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 16)] | None,
        Meta(description="Input features per scale (strategies group and tensor_group)."),
    ] = 128
    block_structure: Annotated[
        tuple[_Side, _Side] | None,
        Meta(description="[rows, cols] of one scale block (strategy block)."),
    ] = None
    symmetric: Annotated[
        bool, Meta(description="False: a zero point is stored beside each scale.")
    ] = True
    scale_dtype: Annotated[
        Literal["bf16", "fp16", "fp32", "fp8_e4m3", "uint8"],
        Meta(description="Dtype of `weight_scale` (the model's dtype unless the config says)."),
    ] = "bf16"
    g_idx: Annotated[
        bool,
        Meta(description="The checkpoint stores `weight_g_idx` int32 (in,) (actorder group)."),
    ] = False
    input_scale: Annotated[
        bool,
        Meta(description="Static input activations: one `input_scale` (scale_dtype) per tensor."),
    ] = False

    def __post_init__(self) -> None:
        rules.check(self)


Quantization = Int8 | FP8 | GPTQ | AWQ | BitsAndBytes4bit | MXFP4 | NVFP4 | CompressedTensors


class Precision(Wire, frozen=True, kw_only=True):
    """What the model runs in. Left at their defaults, the dtypes and the quantization are
    the deployed checkpoint's (its ``config.json``: ``torch_dtype`` / ``dtype`` and
    ``quantization_config``), as ``from_pretrained`` and vLLM load it; a value given here wins,
    and a conflict with the checkpoint is a warning in the answer."""

    weights: Annotated[
        WeightDType | Literal["auto"],
        Meta(
            description="Storage dtype of unquantized weights. `auto` (default): the "
            "checkpoint's `torch_dtype` (transformers loads fp32 checkpoints in fp32), bf16 "
            "when the model names none. `fp8` stores the linear layers in fp8 with per-tensor "
            "scales (as `quantization: {scheme: fp8}`)."
        ),
    ] = "auto"
    compute: Annotated[
        ComputeDType | Literal["auto"],
        Meta(
            description="Activation/compute dtype. `auto` (default): the unquantized weights' "
            "dtype (fp32, fp16 or bf16; fp8 and quantized checkpoints compute in the "
            "checkpoint's `torch_dtype`, else bf16)."
        ),
    ] = "auto"
    kv_cache: Annotated[KVCacheDType, Meta(description="`auto`: the compute dtype.")] = "auto"
    quantization: Annotated[
        Quantization | None | UnsetType,
        Meta(
            description="Quantization of the linear layers (and expert MLPs). Absent "
            "(default): the checkpoint's `quantization_config` (none when it has none); "
            "null: no quantization, all weights stored in `weights`."
        ),
    ] = UNSET

    def __post_init__(self) -> None:
        rules.check(self)
