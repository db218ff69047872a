"""Storage of one (per-device) weight tensor under each quantization scheme, exact to the byte.

Each function returns ``(payload_bytes, metadata_bytes)`` for ``count`` tensors of shape
``(rows, cols)`` = (output features, input features), following the tensors the scheme's loader
creates. Sources per scheme are in the docstrings; ``docs/COMPONENTS.md`` has worked numbers.
"""

from __future__ import annotations

from .arch import Role
from .spec import AWQ, FP8, GPTQ, BitsAndBytes4bit, Int8, Quantization
from .units import ceil_div

__all__ = [
    "BNB_NESTED_BLOCKSIZE",
    "BNB_NF4_CODE_BYTES",
    "quantized_roles",
    "tensor_storage",
]

# bitsandbytes functional.quantize_4bit: with compress_statistics the fp32 absmax is quantized
# blockwise again with blocksize 256 (uint8 + one fp32 absmax2 per 256 blocks) and an fp32 offset.
BNB_NESTED_BLOCKSIZE = 256
# The NF4/FP4 code (16 fp32 values) that each QuantState keeps on the device.
BNB_NF4_CODE_BYTES = 16 * 4
BNB_OFFSET_BYTES = 4

_SCALE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
_FP16 = 2
_INT32 = 4


def quantized_roles(q: Quantization) -> frozenset[Role]:
    """Which tensors a scheme replaces: the layers' linear projections and routed experts, plus
    embeddings / LM head only when asked. Norms, biases, routers and vision towers stay in the
    unquantized dtype under every scheme here."""
    roles = {Role.LINEAR, Role.EXPERT}
    if q.quantize_embeddings:
        roles.add(Role.EMBEDDING)
    if q.quantize_lm_head:
        roles.add(Role.LM_HEAD)
    return frozenset(roles)


def _int8(q: Int8, rows: int, cols: int) -> tuple[int, int]:
    # int8 payload; one scale per output row (bitsandbytes Int8Params.SCB is fp32, shape (rows,)).
    return rows * cols, rows * _SCALE_BYTES[q.scale_dtype]


def _fp8(q: FP8, rows: int, cols: int) -> tuple[int, int]:
    payload = rows * cols
    if q.granularity == "tensor":
        return payload, 4  # one fp32 weight_scale (compressed-tensors / FBGEMM per-tensor)
    if q.granularity == "channel":
        return payload, rows * 4
    blocks = ceil_div(rows, q.block_size) * ceil_div(cols, q.block_size)
    return payload, blocks * 4  # DeepSeek-V3 weight_scale_inv: fp32 per 128x128 block


def _groups(group_size: int, cols: int) -> int:
    return 1 if group_size == -1 else ceil_div(cols, group_size)


def _gptq(q: GPTQ, rows: int, cols: int) -> tuple[int, int]:
    # AutoGPTQ QuantLinear: qweight int32 (in // 32 * bits, out); qzeros int32
    # (groups, out // 32 * bits); scales fp16 (groups, out); g_idx int32 (in,).
    groups = _groups(q.group_size, cols)
    qweight = ceil_div(cols * q.bits, 32) * rows * _INT32
    qzeros = groups * ceil_div(rows * q.bits, 32) * _INT32
    scales = groups * rows * _FP16
    g_idx = cols * _INT32
    return qweight, qzeros + scales + g_idx


def _awq(q: AWQ, rows: int, cols: int) -> tuple[int, int]:
    # AutoAWQ WQLinear_GEMM: qweight int32 (in, out // 8); qzeros int32 (groups, out // 8);
    # scales fp16 (groups, out).
    groups = _groups(q.group_size, cols)
    qweight = cols * ceil_div(rows * q.bits, 32) * _INT32
    qzeros = groups * ceil_div(rows * q.bits, 32) * _INT32
    scales = groups * rows * _FP16
    return qweight, qzeros + scales


def _bnb4(q: BitsAndBytes4bit, rows: int, cols: int) -> tuple[int, int]:
    # bitsandbytes Params4bit: the flattened tensor packed two values per uint8; QuantState holds
    # absmax per block (fp32, or uint8 + nested state with double quantization) and the code.
    numel = rows * cols
    payload = ceil_div(numel, 2)
    blocks = ceil_div(numel, q.block_size)
    if q.double_quant:
        nested_blocks = ceil_div(blocks, BNB_NESTED_BLOCKSIZE)
        absmax = blocks + nested_blocks * 4 + BNB_OFFSET_BYTES
    else:
        absmax = blocks * 4
    return payload, absmax + BNB_NF4_CODE_BYTES


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
    return payload * count, meta * count
