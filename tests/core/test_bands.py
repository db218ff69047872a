"""Error bands: the band of a subtotal, the headroom it sets by default, and the fit verdict
against it; numbers by hand from the rule's ratios."""

from __future__ import annotations

import math

import msgspec
import pytest

from vrambudget.core.bands import BandRule, band_of, band_rule, resolve_headroom, workload_class
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import fit
from vrambudget.core.spec import BudgetRequest, FitRequest, Headroom, Software
from vrambudget.core.stack import resolve_stack

RULE = BandRule("inference", 0.9, 1.25, 0.9, 40, "test")


def test_band_of_a_subtotal() -> None:
    b = band_of(RULE, 1_000_000_001)
    assert (b.low_bytes, b.high_bytes) == (900_000_000, 1_250_000_002)  # floor, ceil
    assert (b.coverage, b.workload_class, b.measurements) == (0.9, "inference", 40)


def test_default_headroom_reaches_the_band_high_end() -> None:
    assert resolve_headroom(Headroom(), RULE) == Headroom(fraction=0.25)
    assert resolve_headroom(Headroom(min_bytes=7), RULE) == Headroom(fraction=0.25, min_bytes=7)
    # A caller's fraction is kept; a band wholly below the estimate sets none.
    assert resolve_headroom(Headroom(fraction=0.05), RULE).fraction == 0.05
    below = BandRule("x", 0.7, 0.95, 0.9, 10, "test")
    assert resolve_headroom(Headroom(), below).fraction == 0.0


INFER = {
    "kind": "inference",
    "model": {"source": "preset", "id": "qwen2.5-7b"},
    "batch_size": 1,
    "prompt_tokens": 1024,
    "generated_tokens": 128,
}


def test_every_device_budget_carries_its_band_and_default_headroom() -> None:
    r = msgspec.convert({"workloads": [INFER]}, BudgetRequest)
    b = estimate(r.workloads, r.device, r.headroom)
    d = b.devices[0]
    rule = band_rule(("inference",), resolve_stack(None))
    sub = d.inputs["subtotal_bytes"]
    assert isinstance(sub, int)
    assert d.band is not None
    assert d.band.low_bytes == math.floor(sub * rule.low)
    assert d.band.high_bytes == math.ceil(sub * rule.high)
    assert d.inputs["headroom_fraction"] == round(rule.headroom_fraction, 6)
    assert d.band.workload_class == "inference"


def test_an_unmeasured_framework_widens_the_band() -> None:
    plain = band_rule(("inference",), resolve_stack(None))
    other = band_rule(("inference",), resolve_stack(Software(framework="sglang")))
    if plain.measurements:  # the corpus has inference measurements on transformers
        assert other.high > plain.high and other.low < plain.low
        assert "none on sglang" in other.basis


@pytest.mark.parametrize(
    ("capacity_of", "verdict"),
    [
        (lambda sub, r: math.ceil(sub * r.high) + 10**9, "fits"),
        (lambda sub, r: (math.floor(sub * r.low) + math.ceil(sub * r.high)) // 2, "fits_if_low"),
        (lambda sub, r: math.floor(sub * r.low) - 1, "does_not_fit"),
    ],
)
def test_fit_verdict_against_the_band(capacity_of, verdict) -> None:
    r = msgspec.convert({"workloads": [INFER], "headroom": {"fraction": 0.0}}, BudgetRequest)
    sub = estimate(r.workloads, None, r.headroom).devices[0].total_bytes
    rule = band_rule((workload_class(r.workloads[0]),), resolve_stack(None))
    if rule.high == rule.low:
        pytest.skip("no band calibrated")
    capacity = capacity_of(sub, rule)
    req = msgspec.convert(
        {
            "workloads": [INFER],
            "devices": [{"source": "custom", "name": "x", "memory_total_bytes": capacity}],
            "headroom": {"fraction": 0.0},
            "solve": [],
        },
        FitRequest,
    )
    layout = fit(req).gpus[0].layouts[0]
    assert layout.verdict == verdict
    assert layout.fits == (sub <= capacity)
