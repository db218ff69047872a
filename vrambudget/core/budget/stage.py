"""One pipeline stage's numbers at its peak phase: the integers both the explained budget and
the fit solver use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..components import Component

__all__ = [
    "COUNTED",
    "Parts",
    "StageNumbers",
    "counted_bytes",
    "finish",
    "peak",
    "times",
    "top_stage",
]

Parts = tuple[tuple[str, int], ...]

COUNTED = (Component.WEIGHTS, Component.QUANTIZATION_METADATA, Component.ADAPTERS)
"""The components counted from the model's tensors (as the modelled stack lays them out)
rather than fitted from measurements: a device holds at least these bytes, so an error band's
low end never falls below them."""


def counted_bytes(values: dict[Component, int]) -> int:
    """The bytes of ``values`` counted from the model's tensors (:data:`COUNTED`)."""
    return sum([values.get(c, 0) for c in COUNTED])


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 4x (one per budget)
class StageNumbers:
    """Component bytes of one stage's device at its peak phase, and every phase's total
    (treated as immutable)."""

    stage: int | None
    num_devices: int
    peak_phase: str
    values: dict[Component, int]
    parts: dict[Component, tuple[tuple[str, int], ...]]
    phases: tuple[tuple[str, int], ...]
    transient_bytes: int = 0
    """The largest transient bytes, which the fragmentation fraction multiplies."""
    counted: int = 0
    """Bytes of the components counted from the model's tensors (:data:`COUNTED`) in the phase
    holding most of them where every phase is broken down (training, generic), else at the
    peak phase (inference): a floor under the real peak, whatever the band says (a ZeRO-3 rank
    holding the whole quantized model at init holds it, however low the training phase's band
    reaches)."""


def times(parts: Any, k: int) -> tuple[tuple[str, int], ...]:
    """Parts of ``k`` identical instances (lines are per device, all instances included)."""
    return tuple(parts) if k == 1 else tuple((name, b * k) for name, b in parts)


def finish(
    stage: int | None,
    num_devices: int,
    phases: list[tuple[str, dict[Component, int]]],
    parts: dict[Component, tuple[tuple[str, int], ...]],
    transient: int = 0,
) -> StageNumbers:
    """The peak phase is the one with the largest device total (the first on a tie)."""
    totals = tuple([(n, sum(v.values())) for n, v in phases])
    best = peak(totals)
    counted = max([counted_bytes(v) for _, v in phases])
    return StageNumbers(
        stage, num_devices, phases[best][0], phases[best][1], parts, totals, transient, counted
    )


def peak(totals: tuple[tuple[str, int], ...]) -> int:
    """Index of the largest phase total, the first on a tie."""
    best = 0
    for i in range(1, len(totals)):
        if totals[i][1] > totals[best][1]:
            best = i
    return best


def top_stage(stages: list[StageNumbers] | tuple[StageNumbers, ...]) -> StageNumbers:
    """The most loaded stage (its peak phase's total the largest; the first on a tie)."""
    return max(stages, key=lambda s: sum(s.values.values()))
