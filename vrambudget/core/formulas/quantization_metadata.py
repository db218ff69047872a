"""Quantization metadata: scales, zero points, group indices and codes that a quantized
checkpoint keeps beside its packed weights.

Shown in answers::

    sum over quantized tensors of scales + zero points + group indices + codes

Per scheme (:mod:`vrambudget.core.quantization`, one function per scheme): GPTQ 4-bit, group
128, on a 4096 x 4096 projection packs 4096 x 4096 / 8 int32 = 8,388,608 B of payload and keeps
fp16 scales (32 groups x 4096 = 262,144 B), packed zeros (32 x 4096 / 8 x 4 = 65,536 B) and
``g_idx`` (4096 x 4 = 16,384 B): 344,064 B of metadata (AutoGPTQ ``QuantLinear``).
"""

from __future__ import annotations

from ..quantization import tensor_storage
from ..spec import Quantization

__all__ = ["FORMULA", "SOURCE", "metadata_bytes"]

FORMULA = "sum over quantized tensors of scales + zero points + group indices + codes"
SOURCE = (
    "AutoGPTQ QuantLinear, AutoAWQ WQLinear_GEMM, bitsandbytes functional.quantize_4bit / "
    "Int8Params, compressed-tensors fp8"
)


def metadata_bytes(quant: Quantization, rows: int, cols: int) -> int:
    """Metadata bytes of one quantized ``rows x cols`` tensor (the payload is a weight)."""
    return tensor_storage(quant, rows, cols, 1)[1]
