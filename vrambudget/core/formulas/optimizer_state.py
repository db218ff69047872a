"""Optimizer state: moments and statistics per trainable tensor, and the step's temporaries.

Shown in answers::

    per trainable tensor: Adam 2 x numel x bytes(state); 8-bit Adam 2 x numel + absmax per 256
    (fp32 below 4096 elements); SGD momentum numel; Adafactor rows + cols (/ data-parallel size
    with ZeRO >= 1)
"""

from __future__ import annotations

from ..spec import SGD, Adafactor, AdamW, AdamW8bit
from ..units import ceil_div

__all__ = [
    "BNB_MIN_8BIT_SIZE",
    "BNB_OPTIM_BLOCKSIZE",
    "FORMULA",
    "SHARDED_FROM_ZERO_STAGE",
    "SOURCE",
    "Optimizer",
    "state_bytes",
    "state_dtype_bytes",
    "step_temporaries",
]

FORMULA = (
    "per trainable tensor: Adam 2 x numel x bytes(state); 8-bit Adam 2 x numel + absmax "
    "per 256 (fp32 below 4096 elements); SGD momentum numel; Adafactor rows + cols (/ "
    "data-parallel size with ZeRO >= 1)"
)
SOURCE = (
    "Loshchilov & Hutter 2019; Dettmers et al. 2022 (8-bit optimizers); Shazeer & Stern "
    "2018; ZeRO §5"
)
SHARDED_FROM_ZERO_STAGE = 1

# bitsandbytes optim/optimizer.py: Optimizer8bit keeps 32-bit states for tensors with fewer than
# min_8bit_size = 4096 elements; 8-bit states are blockwise with blocksize 256 (absmax fp32).
BNB_MIN_8BIT_SIZE = 4096
BNB_OPTIM_BLOCKSIZE = 256

Optimizer = AdamW | AdamW8bit | SGD | Adafactor


def state_dtype_bytes(full: bool, mixed_precision: str, param_bytes: int) -> int:
    """Bytes of one state element: fp32 when the step runs on fp32 (masters, autocast; for
    adapters anything but ``pure``), else the parameters' (adapters') dtype."""
    if full:
        return 4 if mixed_precision in ("master_fp32", "autocast") else param_bytes
    return 4 if mixed_precision != "pure" else param_bytes


def state_bytes(opt: Optimizer, shapes: list[tuple[int, int, int]], state: int) -> int:
    """State bytes over trainable tensors given as ``(rows, cols, count)``.

    Worked number: AdamW with fp32 state on one 4096 x 4096 tensor: 2 x 16,777,216 x 4 =
    134,217,728 B; 8-bit AdamW: 2 x 16,777,216 + 2 x 65,536 x 4 = 34,078,720 B."""
    total = 0
    for rows, cols, count in shapes:
        numel = rows * cols
        match opt:
            case AdamW():
                per = 2 * numel * state
            case SGD():
                per = numel * state if opt.momentum > 0 else 0
            case AdamW8bit():
                if numel < BNB_MIN_8BIT_SIZE:
                    per = 2 * numel * 4
                else:
                    per = 2 * numel + 2 * ceil_div(numel, BNB_OPTIM_BLOCKSIZE) * 4
            case Adafactor():
                # transformers Adafactor: exp_avg_sq_row (rows) + exp_avg_sq_col (cols) for
                # matrices, exp_avg_sq for vectors; exp_avg only with beta1.
                per = (rows + cols) * state if rows > 1 and cols > 1 else numel * state
                if opt.beta1 is not None:
                    per += numel * state
        total += per * count
    return total


def step_temporaries(
    opt: Optimizer, trainable: int, largest: int, state: int, intermediates: int = 1
) -> int:
    """The step implementation's temporaries at its peak. torch/optim/adamw.py:
    ``_multi_tensor_adamw`` allocates ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`` for
    every parameter at once; ``_single_tensor_adamw`` ``exp_avg_sq.sqrt()`` and its quotient for
    one tensor at a time; the fused kernel none. SGD (momentum buffers updated in place) and
    bitsandbytes' 8-bit kernels have none; the trace tier checks each. ``intermediates``: the
    state-sized tensor lists foreach holds at once (2 before torch 2.1, whose ``denom =
    torch._foreach_add(exp_avg_sq_sqrt, eps)`` was out of place: pytorch#104898).

    Worked number: foreach AdamW over 494,032,768 fp32-state parameters: 1,976,131,072 B."""
    match opt:
        case AdamW(implementation="foreach"):
            return trainable * state * intermediates
        case AdamW(implementation="for_loop"):
            return 2 * largest * state
        case _:  # Adafactor: not traced (torch.optim.Adafactor reads tensor values)
            return 0
