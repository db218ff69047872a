"""The analytic fragmentation line's class fractions (core/formulas/allocator_overhead.py;
medians of research/fragmentation_grids.py's replay grids): inference 0.34, 0.51 under eager
attention (0.558 measured on the H100 campaign's eager run); training 0.21, 0.26 with full
checkpointing (0.334-0.343 measured); with expandable segments 0.16, 0.24, 0.10 and 0.20. Each
number is recomputed here from the budget's own lines and its largest transient bytes."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.overheads import DEFAULT_OVERHEADS
from vrambudget.core.spec import Headroom, InferenceWorkload, TrainingWorkload

ROUNDING = "512-byte rounding of weight tensors"


def _workload(model: str, attention: str) -> InferenceWorkload:
    return msgspec.convert(
        {
            "kind": "inference",
            "model": {"source": "preset", "id": model},
            "batch_size": 4,
            "prompt_tokens": 2048,
            "generated_tokens": 16,
            "attention": attention,
        },
        InferenceWorkload,
    )


@pytest.mark.parametrize(
    ("model", "attention", "percent"),
    [
        ("qwen2.5-0.5b", "eager", 51),
        ("qwen2.5-0.5b", "sdpa", 34),
        # Gemma 2's soft-capped logits run eager attention whatever was asked for.
        ("gemma-2-2b", "sdpa", 51),
    ],
)
def test_fragmentation_line_uses_the_attention_that_runs(
    model: str, attention: str, percent: int
) -> None:
    budget = estimate((_workload(model, attention),), None, Headroom(fraction=0.0))
    (device,) = budget.devices
    lines = {line.component: line for line in device.lines}
    transient = lines[Component.ACTIVATIONS].bytes + lines[Component.LOGITS].bytes
    parts = {p.name: p.bytes for p in lines[Component.ALLOCATOR_OVERHEAD].parts}
    expected = -(-transient * percent // 100)
    assert parts["fragmentation of transient memory"] == expected
    assert lines[Component.ALLOCATOR_OVERHEAD].bytes == parts[ROUNDING] + expected
    assert device.inputs["fragmentation_fraction"] == percent / 100


def test_a_measured_inference_fraction_above_the_eager_one_raises_it() -> None:
    assert DEFAULT_OVERHEADS.inference_fragmentation("eager") == 510_000
    assert DEFAULT_OVERHEADS.inference_fragmentation("sdpa") == 340_000
    measured = dataclasses.replace(DEFAULT_OVERHEADS, inference_fragmentation_ppm=600_000)
    assert measured.inference_fragmentation("eager") == 600_000
    low = dataclasses.replace(DEFAULT_OVERHEADS, inference_fragmentation_ppm=100_000)
    assert low.inference_fragmentation("eager") == 510_000
    assert low.inference_fragmentation("flash_attention_2") == 100_000


@pytest.mark.parametrize(
    ("checkpointing", "percent"), [("full", 26), ("none", 21), ("selective", 21)]
)
def test_training_fragmentation_follows_full_checkpointing(
    checkpointing: str, percent: int
) -> None:
    w = msgspec.convert(
        {
            "kind": "training",
            "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "micro_batch_size": 2,
            "sequence_length": 2048,
            "checkpointing": checkpointing,
        },
        TrainingWorkload,
    )
    (device,) = estimate((w,), None, Headroom(fraction=0.0)).devices
    transient = device.inputs["largest_transient_bytes"]
    assert isinstance(transient, int) and transient > 0
    line = next(x for x in device.lines if x.component is Component.ALLOCATOR_OVERHEAD)
    parts = {p.name: p.bytes for p in line.parts}
    assert parts["fragmentation of transient memory"] == -(-transient * percent // 100)
    assert line.bytes == parts[ROUNDING] + parts["fragmentation of transient memory"]
    assert device.inputs["fragmentation_fraction"] == percent / 100
    measured = dataclasses.replace(DEFAULT_OVERHEADS, training_fragmentation_ppm=400_000)
    assert measured.training_fragmentation(checkpointing) == 400_000


@pytest.mark.parametrize(
    ("kind", "extra", "percent"),
    [
        ("inference", {"attention": "sdpa"}, 16),
        ("inference", {"attention": "eager"}, 24),
        ("training", {"checkpointing": "none"}, 10),
        ("training", {"checkpointing": "full"}, 20),
    ],
)
def test_expandable_segments_replace_every_class_fraction_and_a_profiles(
    kind: str, extra: dict[str, str], percent: int
) -> None:
    """With expandable segments each class takes its expandable fraction (0.16, 0.24, 0.10,
    0.20), also over a calibration profile's measured (fixed-segment) fraction."""
    from vrambudget.core.overheads import with_software
    from vrambudget.core.spec import Software

    shape = (
        {"batch_size": 4, "prompt_tokens": 2048, "generated_tokens": 16}
        if kind == "inference"
        else {"micro_batch_size": 2, "sequence_length": 2048}
    )
    w = msgspec.convert(
        {"kind": kind, "model": {"source": "preset", "id": "qwen2.5-0.5b"}, **shape, **extra},
        InferenceWorkload if kind == "inference" else TrainingWorkload,
    )
    on = Software(expandable_segments=True)
    (device,) = estimate((w,), None, Headroom(fraction=0.0), software=on).devices
    transient = device.inputs["largest_transient_bytes"]
    assert isinstance(transient, int) and transient > 0
    line = next(x for x in device.lines if x.component is Component.ALLOCATOR_OVERHEAD)
    parts = {p.name: p.bytes for p in line.parts}
    assert parts["fragmentation of transient memory"] == -(-transient * percent // 100)
    assert device.inputs["fragmentation_fraction"] == percent / 100
    assert "expandable_segments:True" in line.source
    profiled = dataclasses.replace(
        DEFAULT_OVERHEADS, training_fragmentation_ppm=400_000, inference_fragmentation_ppm=600_000
    )
    ov = with_software(profiled, on)
    got = (
        ov.inference_fragmentation(extra["attention"])
        if kind == "inference"
        else ov.training_fragmentation(extra["checkpointing"])
    )
    assert got == percent * 10_000
