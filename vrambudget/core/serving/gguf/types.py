"""ggml tensor types: elements per block and bytes per block.

Source: ggml/src/ggml.c ``type_traits`` (``blck_size``, ``type_size``), as the ``gguf`` package
publishes them in ``gguf/constants.py`` ``GGML_QUANT_SIZES`` (gguf 0.19.0; the test suite checks
this table against the installed package). ``QK_K`` = 256.

A row of ``n`` elements takes ``n / block x bytes`` (``ggml_row_size``); llama.cpp refuses a
quantized type for a tensor whose rows are not a whole number of blocks and uses a fallback
type instead (``recipe``).
"""

from __future__ import annotations

__all__ = ["BLOCKS", "KV_CACHE_TYPES", "row_bytes", "tensor_bytes"]

_QK_K = 256

BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "F64": (1, 8),
    "I8": (1, 1),
    "I16": (1, 2),
    "I32": (1, 4),
    "I64": (1, 8),
    "Q4_0": (32, 2 + 16),
    "Q4_1": (32, 2 + 2 + 16),
    "Q5_0": (32, 2 + 4 + 16),
    "Q5_1": (32, 2 + 2 + 4 + 16),
    "Q8_0": (32, 2 + 32),
    "Q8_1": (32, 2 + 2 + 32),  # ggml-common.h block_q8_1 (gguf 0.19.0 says 40; never stored)
    "Q2_K": (_QK_K, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    "Q3_K": (_QK_K, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    "Q4_K": (_QK_K, 2 + 2 + _QK_K // 2 + 12),
    "Q5_K": (_QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    "Q6_K": (_QK_K, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    "Q8_K": (_QK_K, 4 + _QK_K + _QK_K // 8),
    "IQ2_XXS": (_QK_K, 2 + _QK_K // 4),
    "IQ2_XS": (_QK_K, 2 + _QK_K // 4 + _QK_K // 32),
    "IQ3_XXS": (_QK_K, 2 + _QK_K // 4 + _QK_K // 8),
    "IQ1_S": (_QK_K, 2 + _QK_K // 8 + _QK_K // 16),
    "IQ4_NL": (32, 2 + 16),
    "IQ3_S": (_QK_K, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    "IQ2_S": (_QK_K, 2 + _QK_K // 4 + _QK_K // 16),
    "IQ4_XS": (_QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    "IQ1_M": (_QK_K, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    "TQ1_0": (_QK_K, 2 + 4 * 13),
    "TQ2_0": (_QK_K, 2 + 64),
    "MXFP4": (32, 1 + 16),
}

KV_CACHE_TYPES: tuple[str, ...] = (
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q4_0",
    "q4_1",
    "iq4_nl",
    "q5_0",
    "q5_1",
)
"""llama.cpp ``--cache-type-k/-v`` values (common/arg.cpp ``kv_cache_types``)."""


def row_bytes(type_name: str, n: int) -> int:
    """Bytes of one row of ``n`` elements (ggml_row_size); ``n`` must be whole blocks."""
    block, size = BLOCKS[type_name.upper()]
    if n % block:
        raise ValueError(f"{n} elements are not whole {type_name} blocks of {block}")
    return n // block * size


def tensor_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor whose first dimension (ggml ne[0], the input features) is
    ``shape[0]`` (ggml_nbytes of a contiguous tensor)."""
    rows = 1
    for d in shape[1:]:
        rows *= d
    return row_bytes(type_name, shape[0]) * rows
