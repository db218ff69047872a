"""Adapters: LoRA/QLoRA parameters.

Shown in answers::

    r x (in + out) x bytes(adapter) per adapted projection
"""

from __future__ import annotations

__all__ = ["FORMULA", "SOURCE", "lora_params"]

FORMULA = "r x (in + out) x bytes(adapter) per adapted projection"
SOURCE = "Hu et al. 2021 (LoRA) §4.1; PEFT LoraLayer"


def lora_params(rank: int, rows: int, cols: int) -> int:
    """``lora_A`` (r x in) and ``lora_B`` (out x r) of one adapted ``rows x cols`` projection.

    Worked number: rank 16 on a 4096 x 4096 ``q_proj``: 16 x (4096 + 4096) = 131,072
    parameters, 524,288 B in fp32."""
    return rank * (rows + cols)
