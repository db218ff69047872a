"""The GPU peak rates (data/gpu_perf.json) that the latency estimate reads: every entry is a
catalog GPU, every number has an openable, quoted source, dense rates are ordered as the
tensor-core formats are, and bandwidths agree with gpus.json where it has one."""

from __future__ import annotations

import json
from decimal import Decimal
from importlib import resources
from pathlib import Path

import pytest

from tests.support.sources import openable, wording_hits
from vrambudget.core.catalog import gpus
from vrambudget.core.gpu_perf import GPUPerf, gpu_perf, perf_of

PERF = list(gpu_perf().values())
T = 10**12


# Catalog GPUs with no quoted per-GPU rate found (docs/LATENCY.md, Catalog rates): no guess.
UNSOURCED = {
    "h100-nvl-94gb",
    "a10g-24gb",
    "rtx-a5000-24gb",
    "rtx-pro-6000-blackwell-server-96gb",
    "a800-sxm4-80gb",
    "l20-48gb",
    "rtx-a4000-16gb",
    "rtx-3080-10gb",
    "rtx-3060-12gb",
}
BLACKWELL = {"b200-180gb", "gb200-186gb", "rtx-5090-32gb", "rtx-5080-16gb"}


def test_entries_are_catalog_gpus():
    assert {p.id for p in PERF} <= set(gpus())
    assert set(gpus()) - {p.id for p in PERF} == UNSOURCED
    assert len(PERF) == len(gpus()) - 9 == 34
    assert perf_of(None) is None and perf_of("a10g-24gb") is None  # unknown: no guess


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
    # FP4 tensor cores are Blackwell's only; they run at least twice the fp8 rate
    assert (f.fp4 is not None) == (p.id in BLACKWELL)
    assert f.fp4 is None or (f.fp8 is not None and f.fp4 >= 2 * f.fp8)
    catalog = gpus()[p.id].memory_bandwidth_bytes_per_s
    assert catalog is None or catalog == p.memory_bandwidth_bytes_per_s


def test_the_h100_sxm_is_the_datasheet_halved():
    """The datasheet lists rates with 2:4 sparsity ('Specifications 1/2 lower without
    sparsity'): 989 / 1,979 / 3,958 TFLOPS become 494.5 / 989.5 / 1,979 dense."""
    f = gpu_perf()["h100-sxm5-80gb"].dense_flops
    assert (f.tf32, f.bf16, f.fp8, f.int8) == (989 * T // 2, 1979 * T // 2, 3958 * T // 2, 1979 * T)


def test_amd_rates_are_rocm_dense_and_per_gcd():
    """The MI300X is AMD's ROCm table (dense: 1307.4 FP16, 2614.9 FP8; the 2x larger copies are
    with sparsity); the MI250X entry is one GCD, so the OAM module's 383 / 47.9 TFLOPS and 3.28
    TB/s are halved."""
    mi300x = gpu_perf()["mi300x-192gb"]
    assert mi300x.dense_flops.fp16 == 13074 * T // 10 and mi300x.dense_flops.fp8 == 26149 * T // 10
    assert mi300x.memory_bandwidth_bytes_per_s == 53 * T // 10
    assert gpu_perf()["mi325x-256gb"].dense_flops == mi300x.dense_flops  # same CDNA3 compute
    gcd = gpu_perf()["mi250x-64gb-gcd"]
    assert (gcd.dense_flops.fp16, gcd.dense_flops.fp32) == (383 * T // 2, 479 * T // 20)
    assert gcd.memory_bandwidth_bytes_per_s == 328 * 10**10 // 2
    assert gcd.dense_flops.fp8 is None and gcd.dense_flops.tf32 is None  # CDNA2: no such path


def test_geforce_is_the_fp32_accumulate_rate():
    """GeForce cards carry half the FP16-accumulate tensor rate their tables print (142, 195,
    419, 176, 116, 88 TFLOPS), as the RTX 4090 entry does (165.15 = 330.3 / 2); workstation Ada
    does not."""
    half = {
        "rtx-3090-24gb": 142,
        "rtx-4080-16gb": 195,
        "rtx-5090-32gb": 419,
        "rtx-4070-ti-super-16gb": 176,
        "rtx-4070-12gb": 116,
        "rtx-4060-ti-16gb": 88,
    }
    for gpu_id, fp16_accumulate in half.items():
        assert gpu_perf()[gpu_id].dense_flops.bf16 == fp16_accumulate * T // 2, gpu_id
    assert gpu_perf()["rtx-6000-ada-48gb"].dense_flops.bf16 == 364 * T


def test_no_private_ids_or_first_person_wording():
    raw = json.loads(resources.files("vrambudget.core.data").joinpath("gpu_perf.json").read_text())
    bad = [(e["id"], path, hits) for e in raw["gpus"] for path, hits in wording_hits(e)]
    assert not bad, bad


def test_the_docs_rates_table_lists_every_entry_bandwidth():
    """docs/LATENCY.md's catalog rates table has one row per entry (the two V100 SXM2 parts share
    a row) and its bandwidths are the entries' (TB/s and GB/s as printed, GB = 10^9)."""
    doc = (Path(__file__).parents[2] / "docs" / "LATENCY.md").read_text()
    table = doc[doc.index("| GPU | bandwidth | bf16 dense |") :].split("\n\n")[0]
    rows = [r.split("|")[1:3] for r in table.splitlines()[2:]]
    printed = []
    for name, bandwidth in rows:
        value, unit = bandwidth.split()
        scale = 10**12 if unit == "TB/s" else 10**9
        copies = 2 if "V100" in name else 1
        printed += [int(Decimal(value.replace(",", "")) * scale)] * copies
    assert sorted(printed) == sorted(p.memory_bandwidth_bytes_per_s for p in PERF)
