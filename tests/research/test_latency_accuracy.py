"""The roofline estimate against published measurements (research/data/latency_measurements.json,
compared by research/latency_accuracy.py with the default MFU 0.5 / MBU 0.7; nothing fitted).

Tolerances, stated where docs/LATENCY.md states them:
- single-GPU decode (llama.cpp, RTX 4090): within 20% of the measured tokens/s;
- single-GPU request latency (NeMo / TensorRT-LLM, A100 and H100, batch 1-8): estimate at most
  measured and within 30% of it (the roofline leaves out per-step overheads: it is optimistic);
- tensor-parallel request latency (TP 2-8): estimate below the measured (a lower bound only:
  all-reduce latency and per-step overheads are not modelled, and dominate a 7B model split over
  many GPUs);
- prefill (llama.cpp F16 on an RTX 4090, FP16 accumulation): within a factor of 2;
- the median |error| over all records is the one docs/LATENCY.md reports (44.0%).
"""

from __future__ import annotations

import statistics

import pytest

from research.latency_accuracy import compared, records
from vrambudget.core.catalog import gpus
from vrambudget.core.gpu_perf import gpu_perf

ROWS = {c.id: c for c in compared()}
RECORDS = {r["id"]: r for r in records()}


def test_every_record_is_sourced_and_on_a_catalog_gpu_with_rates():
    assert len(RECORDS) == 23
    for r in RECORDS.values():
        assert r["source"]["url"].startswith("https://") and r["source"]["quote"]
        assert r["gpu"] in gpus() and r["gpu"] in gpu_perf()
        assert r["measured"] > 0


@pytest.mark.parametrize(
    "rid", [i for i in RECORDS if RECORDS[i]["metric"] != "request_latency_ms"]
)
def test_llamacpp_single_gpu_points(rid):
    c = ROWS[rid]
    if c.metric == "decode_tokens_per_s":
        assert abs(c.error) <= 0.20, (rid, c.error)
    else:
        assert 0.5 <= c.estimated / c.measured <= 2.0, (rid, c.error)


@pytest.mark.parametrize(
    "rid", [i for i in RECORDS if RECORDS[i]["metric"] == "request_latency_ms"]
)
def test_request_latency_is_optimistic_and_bounded_on_one_gpu(rid):
    c, tensor = ROWS[rid], RECORDS[rid]["tensor"]
    assert c.estimated < c.measured, (rid, c.error)
    if tensor == 1:
        assert abs(c.error) <= 0.30, (rid, c.error)


def test_median_error_is_the_documented_one():
    median = statistics.median(abs(c.error) for c in ROWS.values())
    assert median == pytest.approx(0.440, abs=0.0005)
    tp1 = [abs(c.error) for c in ROWS.values() if RECORDS[c.id]["tensor"] == 1]
    assert statistics.median(tp1) == pytest.approx(0.186, abs=0.0005)
