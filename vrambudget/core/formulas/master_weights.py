"""Master weights: the fp32 copy of low-precision trainable parameters.

Shown in answers::

    trainable params x 4 when parameters are low precision (/ data-parallel size with ZeRO >= 1)
"""

from __future__ import annotations

__all__ = ["FORMULA", "SHARDED_FROM_ZERO_STAGE", "SOURCE", "master_bytes_per_param"]

FORMULA = (
    "trainable params x 4 when parameters are low precision (/ data-parallel size with ZeRO >= 1)"
)
SOURCE = "Micikevicius et al. 2018 §3.1; ZeRO §3"
SHARDED_FROM_ZERO_STAGE = 1
"""ZeRO stage 1 partitions the optimizer states, fp32 masters included (ZeRO §5.1)."""


def master_bytes_per_param(mixed_precision: str, param_bytes: int) -> int:
    """4 bytes per trainable parameter with ``master_fp32`` when the parameters (or adapters)
    are not already fp32; 0 otherwise.

    Worked number: bf16 Llama 3.1 8B with fp32 masters: 8,030,261,248 x 4 = 32,121,044,992 B."""
    return 4 if mixed_precision == "master_fp32" and param_bytes != 4 else 0
