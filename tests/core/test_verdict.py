"""``Budget.fit`` (vrambudget/core/verdict.py): the capacity, free or missing bytes and the
verdict of a budget against its device, counted as ``/v1/fits`` counts a layout."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.support.workloads import serving_budget
from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import fit
from vrambudget.core.spec import BudgetRequest, FitRequest
from vrambudget.core.verdict import memory_verdict

GiB = 1 << 30


def _generic(
    capacity: int, pipeline_assets: tuple[int, ...] = (6 * GiB,), workspace: int = 0
) -> Any:
    """6 GiB of assets (or assets and a workspace), no CUDA context and no headroom: the
    device uses exactly their sum."""
    req = msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "generic",
                    "assets": [
                        {"name": f"a{i}", "bytes": b} for i, b in enumerate(pipeline_assets)
                    ],
                    "workspaces": [{"name": "w", "bytes": workspace}] if workspace else [],
                    "uses_cuda_context": False,
                }
            ],
            "device": {"source": "custom", "name": "box", "memory_total_bytes": capacity},
            "headroom": {"fraction": 0, "min_bytes": 0},
        },
        BudgetRequest,
    )
    return estimate(req.workloads, req.device, req.headroom)


def test_free_bytes_by_hand() -> None:
    b = _generic(8 * GiB)
    f = b.fit
    assert f is not None
    assert f.capacity_bytes == 8 * GiB
    assert f.used_bytes == 6 * GiB == b.total_bytes
    assert f.free_bytes == 2 * GiB and f.missing_bytes == 0
    assert f.free_percent == 25.0  # 2 / 8
    assert f.fits and f.reason is None
    assert [(d.label, d.used_bytes, d.free_bytes, d.fits) for d in f.devices] == [
        ("every device", 6 * GiB, 2 * GiB, True)
    ]


def test_missing_bytes_by_hand() -> None:
    b = _generic(5 * GiB)
    f = b.fit
    assert f is not None
    assert f.free_bytes == -GiB and f.missing_bytes == GiB
    assert f.free_percent == -20.0  # -1 / 5
    assert not f.fits
    assert f.reason == (
        "needs 6,442,450,944 bytes on every device: 1,073,741,824 more than the device's "
        "5,368,709,120"
    )


def test_verdict_reads_the_band_at_its_edges() -> None:
    """1 GiB of assets and a 5 GiB workspace: the band's ratio sets its low end."""
    band = _generic(8 * GiB, (GiB,), 5 * GiB).devices[0].band
    assert band is not None and GiB < band.low_bytes < 6 * GiB < band.high_bytes
    cases = {
        band.high_bytes: (True, "fits"),  # the band's high end fits exactly
        band.high_bytes - 1: (True, "fits_if_low"),  # the total fits, the high end does not
        6 * GiB - 1: (False, "fits_if_low"),  # only the low end fits
        band.low_bytes: (False, "fits_if_low"),
        band.low_bytes - 1: (False, "does_not_fit"),
    }
    for capacity, expected in cases.items():
        f = _generic(capacity, (GiB,), 5 * GiB).fit
        assert f is not None
        assert (f.fits, f.verdict) == expected, capacity


def test_no_band_reaches_below_the_assets() -> None:
    """6 GiB of assets are on the device whatever the band's ratio says: its low end is
    them, and a device one byte short of them gets ``does_not_fit``."""
    band = _generic(8 * GiB).devices[0].band
    assert band is not None and band.low_bytes == band.counted_bytes == 6 * GiB
    f = _generic(6 * GiB - 1).fit
    assert f is not None and (f.fits, f.verdict) == (False, "does_not_fit")


def test_memory_verdict_without_a_band() -> None:
    assert memory_verdict(80, 80) == "fits"
    assert memory_verdict(81, 80) == "does_not_fit"
    assert memory_verdict(70, 80, 50, 80) == "fits"
    assert memory_verdict(81, 80, 80, 90) == "fits_if_low"
    assert memory_verdict(81, 80, 81, 90) == "does_not_fit"


def test_no_device_no_fit() -> None:
    req = msgspec.convert(
        {"workloads": [{"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"}}]},
        BudgetRequest,
    )
    assert estimate(req.workloads).fit is None


def test_serving_counts_what_the_engine_allocates() -> None:
    """A vLLM budget fills the device; the fit counts every line but the unclaimed share."""
    b = serving_budget("h100-sxm5-80gb", max_model_len=8192)
    f = b.fit
    assert f is not None
    lines = {ln.component: ln.bytes for ln in b.devices[0].lines}
    assert b.total_bytes == f.capacity_bytes == 85_045_477_376  # the catalog's 79.2 GiB
    assert f.used_bytes == sum(v for c, v in lines.items() if c is not Component.HEADROOM)
    assert f.free_bytes == lines[Component.HEADROOM] == f.capacity_bytes - f.used_bytes
    assert f.fits and f.verdict == "fits"


SERVING = {"model": {"source": "preset", "id": "llama-3.1-8b"}, "max_model_len": 8192}
EIGHT_B = {"model": {"source": "preset", "id": "llama-3.1-8b"}}
BIG = {"model": {"source": "preset", "id": "llama-3.1-70b"}}


@pytest.mark.parametrize(
    "workload",
    [
        {"kind": "inference", "model": {"source": "preset", "id": "llama-3.1-8b"}, "batch_size": 4},
        {"kind": "training", "model": {"source": "preset", "id": "llama-3.1-8b"}},
        {"kind": "llm_serving", **SERVING},
        {"kind": "llm_serving", "engine": "sglang", **SERVING},
        {"kind": "llm_serving", "engine": "llama_cpp", "gguf": {"n_ctx": 8192}, **EIGHT_B},
        {"kind": "llm_serving", "engine": "llama_cpp", **BIG},  # --fit offloads layers
        {"kind": "llm_serving", "engine": "ollama", **BIG},
        {"kind": "llm_serving", **BIG, "max_model_len": 8192},  # vLLM does not start
    ],
)
@pytest.mark.parametrize("gpu", ["h100-sxm5-80gb", "rtx-4090-24gb"])
def test_budget_and_fit_agree(workload: dict[str, Any], gpu: str) -> None:
    """A budget with a device and the fit of the same device and layout say the same:
    capacity, used, free, fits and verdict."""
    budget_req = msgspec.convert(
        {"workloads": [workload], "device": {"source": "catalog", "id": gpu}}, BudgetRequest
    )
    budget = estimate(budget_req.workloads, budget_req.device)
    answer = fit(
        msgspec.convert(
            {
                "workloads": [workload],
                "devices": [{"source": "catalog", "id": gpu}],
                "device_counts": [1],
            },
            FitRequest,
        )
    )
    f = msgspec.to_builtins(budget.fit)
    row = msgspec.to_builtins(answer.gpus[0].layouts[0])
    assert (f["capacity_bytes"], f["used_bytes"], f["free_bytes"], f["fits"], f["verdict"]) == (
        row["capacity_bytes"],
        row["total_bytes"],
        row["free_bytes"],
        row["fits"],
        row["verdict"],
    )
    assert f["free_percent"] == row["free_percent"]
    assert f["missing_bytes"] == max(0, -row["free_bytes"])
    assert row["fits"] or row["verdict"] != "fits"  # (a vLLM row that did not start said fits)
    assert (f["reason"] is None) == f["fits"]


def test_pipeline_stages_each_get_a_row() -> None:
    req = msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "inference",
                    "model": {"source": "preset", "id": "llama-3.1-8b"},
                    "parallelism": {"pipeline": 2},
                }
            ],
            "device": {"source": "catalog", "id": "l4-24gb"},
        },
        BudgetRequest,
    )
    b = estimate(req.workloads, req.device)
    f = b.fit
    assert f is not None and len(f.devices) == len(b.devices) == 2
    cap = b.device.memory_total_bytes  # type: ignore[union-attr]
    for row, d in zip(f.devices, b.devices, strict=True):
        assert (row.label, row.used_bytes, row.free_bytes) == (
            d.label,
            d.total_bytes,
            cap - d.total_bytes,
        )
    assert f.used_bytes == b.total_bytes == max(d.total_bytes for d in b.devices)
