"""Adapters: LoRA/QLoRA parameters, and the trainable copies of PEFT's ``modules_to_save``.

Shown in answers::

    r x (in + out) x bytes(adapter) per adapted projection + a copy of each modules_to_save
    module in its dtype
"""

from __future__ import annotations

__all__ = ["FORMULA", "SOURCE", "lora_params"]

FORMULA = (
    "r x (in + out) x bytes(adapter) per adapted projection + a copy of each modules_to_save "
    "module in its dtype"
)
SOURCE = "Hu et al. 2021 (LoRA) §4.1; PEFT LoraLayer, ModulesToSaveWrapper"


def lora_params(rank: int, rows: int, cols: int) -> int:
    """``lora_A`` (r x in) and ``lora_B`` (out x r) of one adapted ``rows x cols`` projection.

    Worked number: rank 16 on a 4096 x 4096 ``q_proj``: 16 x (4096 + 4096) = 131,072
    parameters, 524,288 B in fp32."""
    return rank * (rows + cols)
