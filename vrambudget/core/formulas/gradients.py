"""Gradients of the trainable parameters.

Shown in answers::

    trainable params x bytes(grad) (/ data-parallel size with ZeRO >= 2)
"""

from __future__ import annotations

__all__ = ["FORMULA", "SHARDED_FROM_ZERO_STAGE", "SOURCE", "grad_dtype_bytes"]

FORMULA = "trainable params x bytes(grad) (/ data-parallel size with ZeRO >= 2)"
SOURCE = "Rajbhandari et al. 2020 (ZeRO) §3, §5"
SHARDED_FROM_ZERO_STAGE = 2
"""ZeRO stage 2 partitions gradients over the data-parallel ranks (ZeRO §5.2)."""


def grad_dtype_bytes(full: bool, mixed_precision: str, param_bytes: int) -> int:
    """Bytes of one gradient element: a full fine-tune's gradients are fp32 under autocast (the
    parameters are fp32) and in the parameters' dtype otherwise; adapters' gradients are in the
    adapter dtype (``param_bytes`` is the adapter's then).

    Worked number: a bf16 full fine-tune of Qwen2.5 0.5B (494,032,768 parameters) without
    autocast: 494,032,768 x 2 = 988,065,536 B of gradients."""
    if full and mixed_precision == "autocast":
        return 4
    return param_bytes
