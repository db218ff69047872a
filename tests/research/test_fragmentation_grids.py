"""The analytic fragmentation line's class fractions are the medians of research/
fragmentation_grids.py's replay grids, as research/data/fragmentation_grids.json records them
(rewrite it with ``python -m research.fragmentation_grids {eager,checkpointing} --write``); one
row of each grid is replayed again here and must give the recorded bytes exactly."""

from __future__ import annotations

import pytest

from research.fragmentation_grids import GRIDS, fraction, grid, recorded, row, workload_name
from vrambudget.core.formulas.allocator_overhead import (
    CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION,
    EAGER_INFERENCE_FRAGMENTATION_FRACTION,
)

CONSTANTS = {
    "eager": EAGER_INFERENCE_FRAGMENTATION_FRACTION,
    "checkpointing": CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION,
}


@pytest.mark.parametrize("kind", sorted(GRIDS))
def test_the_constant_is_the_recorded_grids_median(kind: str) -> None:
    rows = recorded(kind)
    assert [r.name for r in rows] == [workload_name(w) for w in grid(kind)]
    assert round(fraction(rows), 2) == CONSTANTS[kind]


@pytest.mark.parametrize("kind", sorted(GRIDS))
def test_a_recorded_row_replays_to_the_same_bytes(kind: str) -> None:
    pytest.importorskip("transformers")
    # GPT-2 at batch 2 x 1,000 tokens: each grid's cheapest workload to trace
    w = next(w for w in grid(kind) if workload_name(w) == "gpt2 2 x 1000")
    got = row(w)
    (want,) = [r for r in recorded(kind) if r.name == got.name]
    assert got == want
