"""The links multi-GPU layouts assume (vrambudget/core/interconnect.py): every catalog GPU has a
structured interconnect; fit layouts over several GPUs state it, and tensor parallelism that
crosses PCIe carries a warning a user can act on."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.sources import openable
from vrambudget.core.catalog import gpus
from vrambudget.core.fit import FitRequest, fit
from vrambudget.core.interconnect import layout_interconnect, pcie_bytes_per_s

GPUS = list(gpus().values())


@pytest.mark.parametrize("g", GPUS, ids=[g.id for g in GPUS])
def test_every_gpu_has_a_consistent_interconnect(g):
    ic = g.interconnect
    assert ic is not None and ic.summary
    if ic.kind == "pcie":
        assert ic.domain_max_gpus == 1 and ic.link_bytes_per_s is None
        assert ic.pcie_generation is not None
    else:
        assert ic.domain_max_gpus >= 2
    assert all(openable(s) for s in ic.sources)
    # A fact without a source says what is not confirmed.
    assert ic.sources or ic.unverified


def test_pcie_bandwidth_by_hand():
    # GT/s per lane x 16 lanes / 8 bits x 2 directions.
    assert pcie_bytes_per_s(3) == 8 * 16 // 8 * 2 * 10**9 == 32_000_000_000
    assert pcie_bytes_per_s(4) == 64_000_000_000
    assert pcie_bytes_per_s(5) == 128_000_000_000  # "a theoretical maximum of 128 GB/s"


def _layouts(workload: dict[str, object], gpu_id: str, counts: list[int]) -> dict[int, object]:
    body = {
        "workloads": [workload],
        "devices": [{"source": "catalog", "id": gpu_id}],
        "device_counts": counts,
    }
    g = fit(msgspec.convert(body, FitRequest)).gpus[0]
    return {lay.device_count: lay for lay in g.layouts}


LLAMA_70B = {
    "kind": "inference",
    "model": {"source": "preset", "id": "llama-3.1-70b"},
    "batch_size": 1,
    "prompt_tokens": 4096,
    "generated_tokens": 256,
}


def test_tensor_parallel_8_over_rtx_4090_warns_about_pcie():
    by_n = _layouts(LLAMA_70B, "rtx-4090-24gb", [1, 8])
    assert by_n[1].interconnect is None  # type: ignore[attr-defined]
    eight = by_n[8]
    assert (eight.tensor, eight.pipeline) == (8, 1)  # type: ignore[attr-defined]
    ic = eight.interconnect  # type: ignore[attr-defined]
    assert (ic.tensor_parallel_over, ic.tensor_parallel_bytes_per_s) == ("pcie", 64_000_000_000)
    assert not ic.across_nodes
    [warning] = [w for w in eight.warnings if "crosses PCIe" in w]  # type: ignore[attr-defined]
    assert "tensor parallel 8 crosses PCIe" in warning
    assert "PCIe Gen4 x16 (64 GB/s per GPU)" in warning
    assert "900 GB/s per GPU on NVIDIA H100 SXM5 80GB" in warning  # what NVLink would give
    assert "Instead: pipeline parallel 8 (tensor 1)" in warning


def test_tensor_parallel_within_nvswitch_has_no_warning():
    by_n = _layouts(LLAMA_70B, "h100-sxm5-80gb", [8, 16])
    ic8 = by_n[8].interconnect  # type: ignore[attr-defined]
    assert (ic8.tensor_parallel_over, ic8.tensor_parallel_bytes_per_s) == ("nvswitch", 9 * 10**11)
    assert not any("PCIe" in w for w in by_n[8].warnings)  # type: ignore[attr-defined]
    ic16 = by_n[16].interconnect  # type: ignore[attr-defined]
    assert ic16.across_nodes and "cluster network" in ic16.assumption


def test_h100_nvl_pairs_tensor_parallel_4_is_told_to_stay_within_a_pair():
    by_n = _layouts(LLAMA_70B, "h100-nvl-94gb", [2, 4])
    assert by_n[2].interconnect.tensor_parallel_over == "nvlink_bridge"  # type: ignore[attr-defined]
    assert not by_n[2].warnings  # type: ignore[attr-defined]
    assert by_n[4].interconnect.tensor_parallel_over == "pcie"  # type: ignore[attr-defined]
    [warning] = by_n[4].warnings  # type: ignore[attr-defined]
    assert "Instead: tensor parallel 2 x pipeline parallel 2" in warning


def test_vllm_tensor_parallel_over_l40s_warns():
    w = {
        "kind": "llm_serving",
        "model": {"source": "preset", "id": "llama-3.1-70b"},
        "max_model_len": 8192,
    }
    by_n = _layouts(w, "l40s-48gb", [4])
    assert by_n[4].interconnect.tensor_parallel_over == "pcie"  # type: ignore[attr-defined]
    assert any("tensor parallel 4 crosses PCIe" in x for x in by_n[4].warnings)  # type: ignore[attr-defined]


def test_custom_devices_state_unknown_links_and_no_warning():
    ic, warnings = layout_interconnect(None, 4, 4, 1)
    assert ic is not None and ic.gpu_interconnect.startswith("unknown") and warnings == ()
    assert layout_interconnect("h100-sxm5-80gb", 1, 1, 1) == (None, ())
