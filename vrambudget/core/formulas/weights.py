"""Weights: the model's parameters as stored on one device.

Shown in answers::

    sum over tensors on the device of rows x cols x bytes(dtype); quantized layers count their
    packed payload
"""

from __future__ import annotations

from ..quantization import tensor_storage
from ..spec import Quantization

__all__ = ["FORMULA", "SOURCE", "stored_bytes"]

FORMULA = (
    "sum over tensors on the device of rows x cols x bytes(dtype); quantized layers count "
    "their packed payload"
)
SOURCE = (
    "tensor inventory of transformers modeling_<family>.py; sharding per Megatron-LM "
    "(Shoeybi et al. 2019 §3) and vLLM"
)


def stored_bytes(
    rows: int, cols: int, plain_bytes: int, quant: Quantization | None
) -> tuple[int, int]:
    """(payload, quantization metadata) bytes of one ``rows x cols`` tensor slice: the plain
    ``rows x cols x bytes(dtype)``, or the quantization scheme's packed payload and metadata
    (:func:`vrambudget.core.quantization.tensor_storage`).

    Worked number: Llama 3.1 8B's ``q_proj`` (4096 x 4096) in bf16 is 4096 x 4096 x 2 =
    33,554,432 B, no metadata; the whole model (8,030,261,248 parameters) is 16,060,522,496 B
    (its safetensors index says ``total_size`` 16,060,522,496)."""
    if quant is None:
        return rows * cols * plain_bytes, 0
    return tensor_storage(quant, rows, cols, 1)
