"""Storage of one (per-device) weight tensor under each quantization scheme, exact to the byte.

Each function returns ``(payload_bytes, metadata_bytes)`` for ``count`` tensors of shape
``(rows, cols)`` = (output features, input features), following the tensors the scheme's loader
keeps on the device (persistent parameters and buffers; kernel scratch such as Marlin's
``workspace`` or FBGEMM's ``input_scale_ub`` is not a stored tensor). Stacked experts are
``count`` copies. The payload is the packed weight, the metadata everything beside it (scales,
zero points, group indices, codes, shapes). Sources per scheme are in the docstrings (the
released library files and lines read); ``docs/COMPONENTS.md`` has worked numbers.

A checkpoint can hold a few bytes that loading drops: bitsandbytes' JSON quant-state tensor
(:func:`bnb_serialized_state_bytes`) and LLM.int8's one-byte ``weight_format``
(``torch.tensor(0, dtype=torch.uint8)`` saved beside ``SCB``, bitsandbytes ``nn/modules.py``
1109-1117; :mod:`vrambudget.core.stored` leaves both out).
"""

from __future__ import annotations

import json

from .arch import Role
from .dtypes import bytes_of
from .spec import (
    AWQ,
    FP8,
    GPTQ,
    MXFP4,
    NVFP4,
    BitsAndBytes4bit,
    CompressedTensors,
    Int8,
    Quantization,
)
from .units import ceil_div, round_up

__all__ = [
    "BNB_DYNAMIC_MAP_BYTES",
    "BNB_NESTED_BLOCKSIZE",
    "BNB_NF4_CODE_BYTES",
    "MXFP4_BLOCK",
    "NVFP4_GROUP",
    "bnb_serialized_state_bytes",
    "quantized_roles",
    "stored_as_buffers",
    "tensor_storage",
]

# bitsandbytes 0.50.2 functional.py 938-940: with compress_statistics the fp32 absmax is
# quantized blockwise again with blocksize 256 (uint8 + one fp32 absmax per 256 blocks), less an
# fp32 offset (absmax.mean()).
BNB_NESTED_BLOCKSIZE = 256
# The NF4/FP4 code: 16 fp32 values, one tensor per QuantState (functional.py 936,
# ``get_4bit_type(quant_type, device=A.device)``); serialized as ``quant_map``.
BNB_NF4_CODE_BYTES = 16 * 4
# The 8-bit dynamic map of the nested state: ``create_dynamic_map()`` pads to 256 fp32 values
# (functional.py 296-346); serialized as ``nested_quant_map`` (as_dict 563).
BNB_DYNAMIC_MAP_BYTES = 256 * 4
BNB_OFFSET_BYTES = 4

MXFP4_BLOCK = 32
"""Elements per MX block (one e8m0 scale; 16 bytes of packed fp4)."""
NVFP4_GROUP = 16
"""Elements per NVFP4 fp8 scale."""

_FP16 = 2
_FP32 = 4
_INT16 = 2
_INT32 = 4
_INT64 = 8


def stored_as_buffers(q: object) -> bool:
    """Whether the scheme's loader keeps a quantized projection's packed weight and its
    metadata as module buffers, not parameters. ZeRO-3 and FSDP shard, gather and offload
    parameters only, so every data-parallel rank then holds all of them on its GPU.

    - GPTQ: auto_gptq 0.7.1 ``nn_modules/qlinear/qlinear_cuda.py`` lines 51-77 (also
      ``qlinear_exllama.py`` 72-99 and ``qlinear_exllamav2.py`` 138-165) register ``qweight``,
      ``qzeros``, ``scales``, ``g_idx`` and ``bias`` with ``register_buffer``.
    - AWQ: AutoAWQ 0.2.9 ``awq/modules/linear/gemm.py`` lines 135-167 register ``qweight``,
      ``qzeros``, ``scales`` and ``bias`` the same way.
    - The sharders: DeepSpeed 0.16.4 ``runtime/zero/parameter_offload.py`` 200-205 converts
      ``module.parameters()`` to ZeRO parameters, and ``engine.py`` 1236-1237 moves the module
      (its buffers too) whole to each device; torch 2.13 FSDP1 ``fsdp/_init_utils.py`` 312-313
      (buffers "are implicitly ignored for most functionality since they are not sharded");
      FSDP2 ``fully_shard`` builds its parameter groups from the parameters alone
      (``_fully_shard.py`` 266-280).

    bitsandbytes' 4-bit weight is a parameter (``Params4bit``); its quant_state is neither
    (:attr:`vrambudget.core.stack.Stack.quantized_state_sharded`)."""
    return isinstance(q, (GPTQ, AWQ))


def quantized_roles(q: Quantization) -> frozenset[Role]:
    """Which tensors a scheme replaces: the layers' linear projections and routed experts, plus
    embeddings / LM head only when asked. MXFP4 replaces routed experts only (transformers
    5.23.0 ``integrations/mxfp4.py`` 525 converts ``GptOssMLP`` experts; vLLM 0.34.0
    ``quantization/mxfp4.py`` 95-106 keeps every linear layer unquantized). Norms, biases,
    routers and vision towers stay in the unquantized dtype under every scheme here."""
    roles = {Role.EXPERT} if isinstance(q, MXFP4) else {Role.LINEAR, Role.EXPERT}
    if isinstance(q, BitsAndBytes4bit) and q.quantize_experts is False:
        roles.discard(Role.EXPERT)  # fused 3-D experts: bitsandbytes replaces nn.Linear only
    if q.quantize_embeddings:
        roles.add(Role.EMBEDDING)
    if q.quantize_lm_head:
        roles.add(Role.LM_HEAD)
    return frozenset(roles)


def _int8(q: Int8, rows: int, cols: int) -> tuple[int, int]:
    """int8 ``weight`` rows x cols + one scale per row (bitsandbytes 0.50.2 ``nn/modules.py``
    743-746: ``SCB`` fp32 (rows,)). 4096 x 4096: 16,777,216 + 4096 x 4 = 16,384 B."""
    return rows * cols, rows * bytes_of(q.scale_dtype)


def _fp8(q: FP8, rows: int, cols: int) -> tuple[int, int]:
    """fp8 ``weight`` rows x cols + fp32 scales: 1 per tensor, rows per channel, or
    ceil(rows/b) x ceil(cols/b) per block (transformers 5.23.0 ``finegrained_fp8.py`` 410-420),
    + 4 for a static input scale (``finegrained_fp8.py`` 422-423). 4096 x 4096, block 128:
    16,777,216 + 32 x 32 x 4 = 4,096 B."""
    payload = rows * cols
    if q.granularity == "tensor":
        scales = 1
    elif q.granularity == "channel":
        scales = rows
    else:
        scales = ceil_div(rows, q.block_size) * ceil_div(cols, q.block_size)
    return payload, (scales + (1 if q.input_scale else 0)) * _FP32


def _marlin_payload(bits: int, rows: int, cols: int) -> int:
    """A Marlin-packed weight, AutoGPTQ's and AutoAWQ's alike: ``B`` / ``qweight``
    ceil(cols/16) x ceil(rows*16*bits/32) int32 (tiles of 16 x 16)."""
    return ceil_div(cols, 16) * ceil_div(rows * 16 * bits, 32) * _INT32


def _groups(group_size: int, cols: int) -> int:
    return 1 if group_size == -1 else ceil_div(cols, group_size)


def _gptq(q: GPTQ, rows: int, cols: int) -> tuple[int, int]:
    """``gptq`` / ``gptq_v2`` (GPTQModel 7.7.0 ``nn_modules/qlinear/__init__.py`` 932-956):
    qweight ceil(cols*bits/32) x rows int32; qzeros groups x ceil(rows*bits/32) int32; scales
    groups x rows fp16; g_idx cols int32. 4096 x 4096, 4-bit g128: 512 x 4096 x 4 = 8,388,608 +
    (32 x 512 x 4 + 32 x 4096 x 2 + 4096 x 4 = 344,064). 3-bit g128: 384 x 4096 x 4 = 6,291,456
    + (32 x 384 x 4 + 262,144 + 16,384 = 327,680). ``marlin`` (AutoGPTQ 0.7.1
    ``qlinear_marlin.py`` 111-119): B ceil(cols/16) x ceil(rows*16*bits/32) int32, s groups x
    rows fp16."""
    groups = _groups(q.group_size, cols)
    scales = groups * rows * _FP16
    if q.checkpoint_format == "marlin":
        return _marlin_payload(q.bits, rows, cols), scales
    qweight = ceil_div(cols * q.bits, 32) * rows * _INT32
    qzeros = groups * ceil_div(rows * q.bits, 32) * _INT32
    g_idx = cols * _INT32
    return qweight, qzeros + scales + g_idx


def _awq_zeros_width(cols: int, group_size: int) -> int:
    """AutoAWQ 0.2.9 ``gemv.py`` 12-24 ``calculate_zeros_width``: the group count padded to a
    multiple of 8 (pack_num), then of 1 / 2 / 4 for groups of >= 128 / 64 / 32 (the library
    refuses other sizes; smaller ones are taken as 32 here)."""
    size_multiplier = 1 if group_size >= 128 else 2 if group_size >= 64 else 4
    base = ceil_div(cols // group_size, 8)
    return round_up(base, size_multiplier)


def _awq(q: AWQ, rows: int, cols: int) -> tuple[int, int]:
    """AutoAWQ 0.2.9 ``awq/modules/linear``. gemm / exllama (``gemm.py`` 135-158): qweight
    cols x ceil(rows*bits/32) int32, qzeros groups x ceil(rows*bits/32) int32, scales groups x
    rows fp16; 4096 x 4096 g128: 4096 x 512 x 4 = 8,388,608 + (32 x 512 x 4 + 32 x 4096 x 2 =
    327,680). gemv (``gemv.py`` 45-69): qweight rows x ceil(cols*bits/32) int32, qzeros rows x w
    int32, scales rows x 8w fp16. gemv_fast (``gemv_fast.py`` 86-118): qweight int16
    (rows/4, cols/4 x 4), scales and qzeros fp16 8w x rows each. marlin (``marlin.py`` 60-75):
    qweight ceil(cols/16) x rows*2 int32, scales groups x rows fp16."""
    group_size = cols if q.group_size == -1 else q.group_size
    groups = _groups(q.group_size, cols)
    packed_rows = ceil_div(rows * q.bits, 32)
    if q.version in ("gemm", "exllama"):
        qweight = cols * packed_rows * _INT32
        return qweight, groups * packed_rows * _INT32 + groups * rows * _FP16
    if q.version == "marlin":
        return _marlin_payload(q.bits, rows, cols), groups * rows * _FP16
    width = _awq_zeros_width(cols, group_size)
    if q.version == "gemv":
        qweight = rows * ceil_div(cols * q.bits, 32) * _INT32
        return qweight, rows * width * _INT32 + rows * width * 8 * _FP16
    # gemv_fast: interleave 4 output rows; int16 words of 16 // bits values.
    qweight = ceil_div(rows, 4) * ceil_div(cols * q.bits, 16) * 4 * _INT16
    return qweight, 2 * width * 8 * rows * _FP16


def _bnb4(q: BitsAndBytes4bit, rows: int, cols: int) -> tuple[int, int]:
    """bitsandbytes 0.50.2 ``quantize_4bit`` (functional.py 884-969): packed uint8 ceil(n/2);
    absmax fp32 per block + the 16-entry fp32 code; with double quantization a uint8 absmax per
    block, fp32 nested absmax per 256 blocks, an fp32 offset, and (a loaded checkpoint's own)
    256-entry fp32 nested map. 4096 x 4096, block 64: 8,388,608 + (262,144 x 4 + 64 =
    1,048,640); double quant: 262,144 + 1,024 x 4 + 4 + 64 = 266,308 (+ 1,024 prequantized)."""
    numel = rows * cols
    payload = ceil_div(numel, 2)
    blocks = ceil_div(numel, q.block_size)
    if q.double_quant:
        nested_blocks = ceil_div(blocks, BNB_NESTED_BLOCKSIZE)
        absmax = blocks + nested_blocks * _FP32 + BNB_OFFSET_BYTES
        if q.prequantized:
            absmax += BNB_DYNAMIC_MAP_BYTES
    else:
        absmax = blocks * _FP32
    return payload, absmax + BNB_NF4_CODE_BYTES


def _mxfp4(rows: int, cols: int) -> tuple[int, int]:
    """gpt-oss ``*_blocks`` uint8 (rows, ceil(cols/32), 16) + ``*_scales`` uint8
    (rows, ceil(cols/32)) (transformers 5.23.0 ``integrations/mxfp4.py`` 245-249). gpt-oss-20b
    ``gate_up_proj`` (5760 x 2880): 5760 x 90 x 16 = 8,294,400 + 5760 x 90 = 518,400 per
    expert."""
    blocks = ceil_div(cols, MXFP4_BLOCK)
    return rows * blocks * (MXFP4_BLOCK // 2), rows * blocks


def _nvfp4(q: NVFP4, rows: int, cols: int) -> tuple[int, int]:
    """uint8 rows x ceil(cols/2) + fp8 scales rows x ceil(cols/16) + fp32 global scale (+ fp32
    input scale for W4A4) (vLLM 0.34.0 ``modelopt.py`` 2139-2182, 2221-2231; compressed-tensors
    0.20.1 ``compressors/nvfp4/base.py`` 37-54). 4096 x 4096: 8,388,608 + 4096 x 256 + 4 + 4 =
    1,048,584."""
    payload = rows * ceil_div(cols, 2)
    scales = rows * ceil_div(cols, NVFP4_GROUP)
    return payload, scales + _FP32 + (_FP32 if q.input_scale else 0)


def _ct_scale_count(q: CompressedTensors, rows: int, cols: int) -> tuple[int, int]:
    """(scale rows, scale columns) of ``weight_scale`` (compressed-tensors 0.20.1
    ``quantization/lifecycle/initialize.py`` 214-247)."""
    if q.strategy == "tensor":
        return 1, 1
    if q.strategy == "channel":
        return rows, 1
    if q.strategy == "block":
        block_rows, block_cols = q.block_structure or (rows, cols)
        return ceil_div(rows, block_rows), ceil_div(cols, block_cols)
    return rows, ceil_div(cols, q.group_size or cols)


def _compressed_tensors(q: CompressedTensors, rows: int, cols: int) -> tuple[int, int]:
    """compressed-tensors 0.20.1. pack-quantized (``compressors/pack_quantized/base.py``
    84-106, ``helpers.py`` 63): weight_packed rows x ceil(cols*bits/32) int32 + weight_shape
    int64 (2,) + packed zero points ceil(rows*bits/32) x groups int32 (asymmetric, group or
    channel). Other formats (``compressors/naive_quantized/base.py`` 75-93): weight rows x cols
    one byte each (int8 / fp8) + unpacked 1-byte zero points. Scales (``initialize.py``
    214-274) in ``scale_dtype``; tensor_group adds an fp32 global scale (201-207); g_idx cols
    int32; a static input scale one more scale. Worked, w4a16 g128 bf16 on 4096 x 4096:
    4096 x 512 x 4 = 8,388,608 + (4096 x 32 x 2 = 262,144 + 16 = 262,160); asymmetric adds
    512 x 32 x 4 = 65,536."""
    scale_rows, scale_cols = _ct_scale_count(q, rows, cols)
    scale_bytes = bytes_of(q.scale_dtype)
    meta = scale_rows * scale_cols * scale_bytes
    if q.format == "pack-quantized":
        payload = rows * ceil_div(cols * q.num_bits, 32) * _INT32
        meta += 2 * _INT64  # weight_shape
        if not q.symmetric:
            if q.strategy in ("group", "channel"):
                meta += ceil_div(rows * q.num_bits, 32) * scale_cols * _INT32
            else:
                meta += scale_rows * scale_cols  # int8 zero points, unpacked
    else:
        payload = rows * cols
        if not q.symmetric:
            meta += scale_rows * scale_cols  # int8 / fp8 zero points
    if q.strategy == "tensor_group":
        meta += _FP32  # weight_global_scale
    if q.g_idx:
        meta += cols * _INT32
    if q.input_scale:
        meta += scale_bytes
    return payload, meta


def tensor_storage(q: Quantization, rows: int, cols: int, count: int) -> tuple[int, int]:
    """(payload, metadata) bytes of ``count`` quantized tensors of shape (rows, cols)."""
    match q:
        case Int8():
            payload, meta = _int8(q, rows, cols)
        case FP8():
            payload, meta = _fp8(q, rows, cols)
        case GPTQ():
            payload, meta = _gptq(q, rows, cols)
        case AWQ():
            payload, meta = _awq(q, rows, cols)
        case BitsAndBytes4bit():
            payload, meta = _bnb4(q, rows, cols)
        case MXFP4():
            payload, meta = _mxfp4(rows, cols)
        case NVFP4():
            payload, meta = _nvfp4(q, rows, cols)
        case CompressedTensors():
            payload, meta = _compressed_tensors(q, rows, cols)
    return payload * count, meta * count


def bnb_serialized_state_bytes(
    q: BitsAndBytes4bit, shape: tuple[int, ...], dtype: str, nested_offset: float | None = None
) -> int:
    """Bytes of the ``quant_state.bitsandbytes__<quant_type>`` uint8 tensor a bitsandbytes
    checkpoint stores beside each 4-bit weight: ``json.dumps`` of the quant state's non-tensor
    fields, UTF-8 (bitsandbytes 0.50.2 ``functional.py`` 550-577 ``as_dict(packed=True)``,
    ``utils.py`` 166-180 ``pack_dict_to_tensor``). ``dtype`` is torch's name of the original
    dtype (``bfloat16``); ``nested_offset`` the float the checkpoint records with double
    quantization (its digits decide the length; ``None`` counts ``0.0``). Loading consumes it.
    Worked: nf4, block 64, (256, 192) bfloat16, double quant, offset 2.57177734375 -> 164 B."""
    state: dict[str, object] = {
        "quant_type": q.quant_type,
        "blocksize": q.block_size,
        "dtype": dtype,
        "shape": list(shape),
    }
    if q.double_quant:
        state["nested_blocksize"] = BNB_NESTED_BLOCKSIZE
        state["nested_dtype"] = "float32"
        state["nested_offset"] = 0.0 if nested_offset is None else float(nested_offset)
    return len(json.dumps(state).encode("utf-8"))
