"""The analytic fragmentation line's class fractions are the medians of research/
fragmentation_grids.py's replay grids, as research/data/fragmentation_grids.json records them
(rewrite it with ``python -m research.fragmentation_grids {eager,checkpointing,sdpa,training,lora}
--write``), with fixed segments and with expandable_segments:True; one
row of each grid is replayed again here and must give the recorded bytes exactly."""

from __future__ import annotations

import statistics

import pytest

from research.fragmentation_grids import (
    GRIDS,
    campaign_fractions,
    expandable_fraction,
    fraction,
    grid,
    recorded,
    row,
    workload_name,
)
from vrambudget.core.formulas.allocator_overhead import (
    CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION,
    EAGER_INFERENCE_FRAGMENTATION_FRACTION,
    EXPANDABLE_FRACTIONS,
    EXPANDABLE_MEASURED_RATIO,
    EXPANDABLE_REPLAY_MEDIANS,
    TRAINING_FRAGMENTATION_FRACTION,
)

CONSTANTS = {
    "eager": EAGER_INFERENCE_FRAGMENTATION_FRACTION,
    "checkpointing": CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION,
}


@pytest.mark.parametrize("kind", sorted(CONSTANTS))
def test_the_constant_is_the_recorded_grids_median(kind: str) -> None:
    rows = recorded(kind)
    assert [r.name for r in rows] == [workload_name(w) for w in grid(kind)]
    assert round(fraction(rows), 2) == CONSTANTS[kind]


@pytest.mark.parametrize("kind", sorted(EXPANDABLE_REPLAY_MEDIANS))
def test_the_expandable_replay_constant_is_the_recorded_grids_expandable_median(kind: str) -> None:
    """Every class's replayed fraction under expandable_segments:True is its grid's median
    replayed with it, below the same grid's median with fixed segments."""
    rows = recorded(kind)
    assert [r.name for r in rows] == [workload_name(w) for w in grid(kind)]
    assert round(expandable_fraction(rows), 2) == EXPANDABLE_REPLAY_MEDIANS[kind]
    assert expandable_fraction(rows) < fraction(rows)


def test_the_expandable_fractions_never_fall_below_the_measured_ratio() -> None:
    """The fraction used is the larger of the replay's median and 0.48 x the fixed-segment
    fraction. 0.48 is the median R (the gap reserved beyond allocated with expandable segments
    over the gap without) of the seven published training A/Bs in
    research/overhead_measurements.md: cosmos-rl 35.80 / 66.04 GB = 0.542; TorchRec 6.72 /
    13.95 GB = 0.48; Qwen1.5-0.5B's length sweep 0.47 (median); its checkpointed batches 0.48
    and 0.40 (0.44); Llama-3-8B ZeRO-3 0.64, ZeRO-2 with offload 0.26, checkpointed 0.79. So:
    inference 0.34 x 0.48 = 0.163 > 0.14; eager 0.51 x 0.48 = 0.245 > 0.09; training 0.21 x
    0.48 = 0.101 > 0.05; full checkpointing 0.26 x 0.48 = 0.125 < 0.20."""
    assert round(35.80 / 66.04, 3) == 0.542 and round(6.72 / 13.95, 2) == 0.48
    assert statistics.median([0.542, 0.48, 0.47, (0.48 + 0.40) / 2, 0.64, 0.26, 0.79]) == 0.48
    assert EXPANDABLE_MEASURED_RATIO == 0.48
    assert EXPANDABLE_FRACTIONS == {
        "sdpa": 0.16,
        "eager": 0.24,
        "training": 0.10,
        "checkpointing": 0.20,
    }
    assert set(EXPANDABLE_FRACTIONS) == set(GRIDS) - {"lora"}


def test_lora_keeps_the_training_fraction() -> None:
    """LoRA's own grid (r 16 on the attention projections) replays a median of 0.069, below the
    training fraction (0.21), and an H100's three LoRA steps of Qwen2.5 0.5B measured 0.088-0.120
    (that model's replayed rows: 0.107-0.123). But the fraction grows with the vocabulary (the
    loss's fp32 tensors are most of a LoRA step's transient bytes): Gemma 2 2B's LoRA step in
    the oracle grid (256k vocabulary) replays 0.21 of its transient. One LoRA constant below
    0.21 would under-state those, so LoRA keeps the training fraction (the safe side: the
    campaign's LoRA steps read 7-10% over on reserved and NVML)."""
    rows = recorded("lora")
    assert [r.name for r in rows] == [workload_name(w) for w in grid("lora")]
    assert round(fraction(rows), 3) == 0.069
    qwen = sorted(round(r.fraction, 3) for r in rows if r.name.startswith("qwen2.5-0.5b"))
    assert qwen == [0.107, 0.107, 0.107, 0.123]
    measured = sorted(round(f, 3) for _, _, f in campaign_fractions("lora"))
    assert measured == [0.088, 0.117, 0.12]
    assert TRAINING_FRAGMENTATION_FRACTION == 0.21
    assert "lora" not in EXPANDABLE_FRACTIONS


@pytest.mark.parametrize("kind", sorted(GRIDS))
def test_a_recorded_row_replays_to_the_same_bytes(kind: str) -> None:
    pytest.importorskip("transformers")
    # GPT-2 at batch 2 x 1,000 tokens: each grid's cheapest workload to trace
    w = next(w for w in grid(kind) if workload_name(w) == "gpt2 2 x 1000")
    got = row(w)
    (want,) = [r for r in recorded(kind) if r.name == got.name]
    assert got == want
