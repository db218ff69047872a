"""The GPU peak rates (data/gpu_perf.json) that the latency estimate reads: every entry is a
catalog GPU, every number has an openable, quoted source, dense rates are ordered as the
tensor-core formats are, and bandwidths agree with gpus.json where it has one."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from tests.support.sources import openable, wording_hits
from vrambudget.core.catalog import gpus
from vrambudget.core.gpu_perf import GPUPerf, gpu_perf, perf_of

PERF = list(gpu_perf().values())
T = 10**12


def test_entries_are_catalog_gpus():
    assert {p.id for p in PERF} <= set(gpus())
    assert len(PERF) == 11
    assert perf_of(None) is None and perf_of("v100-sxm2-32gb") is None  # unknown: no guess


@pytest.mark.parametrize("p", PERF, ids=[p.id for p in PERF])
def test_rates_are_sourced_and_plausible(p: GPUPerf):
    for source in (p.memory_bandwidth_source, p.flops_source):
        assert openable(source) and source.quote and source.quote.strip(), p.id
    assert 100 * 10**9 <= p.memory_bandwidth_bytes_per_s <= 10 * T
    f = p.dense_flops
    assert f.fp16 is not None
    assert f.bf16 is None or f.fp16 == f.bf16  # 16-bit tensor rates are equal on these
    assert f.tf32 is None or f.tf32 <= f.fp16
    # fp8 tensor math runs at twice the 16-bit rate (the L40S datasheet prints 733 vs 362.05)
    assert f.fp8 is None or 1.99 <= f.fp8 / f.fp16 <= 2.03
    assert f.int8 is None or f.int8 >= f.fp16
    assert f.fp4 is None  # no Blackwell entry yet
    catalog = gpus()[p.id].memory_bandwidth_bytes_per_s
    assert catalog is None or catalog == p.memory_bandwidth_bytes_per_s


def test_the_h100_sxm_is_the_datasheet_halved():
    """The datasheet lists rates with 2:4 sparsity ('Specifications 1/2 lower without
    sparsity'): 989 / 1,979 / 3,958 TFLOPS become 494.5 / 989.5 / 1,979 dense."""
    f = gpu_perf()["h100-sxm5-80gb"].dense_flops
    assert (f.tf32, f.bf16, f.fp8, f.int8) == (989 * T // 2, 1979 * T // 2, 3958 * T // 2, 1979 * T)


def test_no_private_ids_or_first_person_wording():
    raw = json.loads(resources.files("vrambudget.core.data").joinpath("gpu_perf.json").read_text())
    bad = [(e["id"], path, hits) for e in raw["gpus"] for path, hits in wording_hits(e)]
    assert not bad, bad
