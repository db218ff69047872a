"""Accuracy of the vLLM model against published vLLM runs (research/vllm_runs.py): calibrate and
held-out splits reported separately, each with its measured tolerance."""

from __future__ import annotations

from statistics import median

import pytest

from research.vllm_runs import compare, load_runs, run_request, summary

H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}


# ------------------------------------------------------------------------------ accuracy --


def _comparisons():
    out = []
    for run in load_runs():
        out += compare(run)
    return out


COMPARISONS = _comparisons()

H100_RUNS = [
    c for c in COMPARISONS if "H100" in next(r["gpu"] for r in load_runs() if r["id"] == c.run_id)
]


def test_every_run_is_compared_or_left_out_with_a_reason():
    for run in load_runs():
        req = run_request(run)
        assert (isinstance(req, str) and req) or compare(run), run["id"]


@pytest.mark.parametrize("split", ["calibrate", "held_out"])
@pytest.mark.parametrize("quantity", ["kv_cache_tokens", "max_concurrency"])
def test_kv_tokens_and_concurrency_median_within_3_percent(split, quantity):
    s = summary(H100_RUNS, quantity, split)
    assert s["n"] >= 15
    assert s["median"] <= 0.03  # the target; measured: 0.05-0.17% (docs/ACCURACY.md)
    assert s["max"] <= 0.01  # measured tolerance of the worst run (0.93%)


def test_weights_per_gpu_within_half_a_percent():
    # The target, on every run (measured: max 0.13%, median 0.01%; docs/ACCURACY.md).
    weights = [c for c in H100_RUNS if c.quantity == "weights_gib"]
    assert len(weights) >= 40
    for c in weights:
        assert abs(c.error) <= 0.005, (c.run_id, c.predicted, c.measured)
    assert median(abs(c.error) for c in weights) < 0.001


@pytest.mark.parametrize("split", ["calibrate", "held_out"])
def test_activation_peak_median_within_3_percent(split):
    s = summary(H100_RUNS, "activation_peak_gib", split)
    assert s["n"] >= 10 and s["median"] <= 0.03
    assert s["max"] <= 0.12  # float32 Llama (one run), 11.8% under
