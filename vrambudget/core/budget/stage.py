"""One pipeline stage's numbers at its peak phase: the integers both the explained budget and
the fit solver use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..components import Component

__all__ = ["Parts", "StageNumbers", "finish", "peak", "times"]

Parts = tuple[tuple[str, int], ...]


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
    return StageNumbers(
        stage, num_devices, phases[best][0], phases[best][1], parts, totals, transient
    )


def peak(totals: tuple[tuple[str, int], ...]) -> int:
    """Index of the largest phase total, the first on a tie."""
    best = 0
    for i in range(1, len(totals)):
        if totals[i][1] > totals[best][1]:
            best = i
    return best
