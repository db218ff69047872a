"""The catalogs: every preset's parameter count equals its published checkpoint's, every GPU
entry is sourced, and runtime-reported totals are what the budget compares against."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from vrambudget.core.catalog import gpus, preset_arch, presets

RAW = json.loads(resources.files("vrambudget.core.data").joinpath("models.json").read_text())


# Entries without an exact public parameter count (counted by formula only, said in the data).
NO_EXACT_COUNT = {p["id"] for p in RAW["presets"] if p["checkpoint"]["num_params"] is None}


def test_enough_presets_and_gpus():
    assert len(presets()) >= 30
    assert len(gpus()) >= 25
    assert {"nvidia", "amd"} <= {g.vendor for g in gpus().values()}
    assert len(presets()) == len(RAW["presets"]), "a preset is missing its config"


@pytest.mark.parametrize("model_id", sorted(p["id"] for p in RAW["presets"]))
def test_preset_parameter_count_equals_checkpoint(model_id):
    facts = presets()[model_id].checkpoint
    arch = preset_arch(model_id)
    if model_id in NO_EXACT_COUNT:
        pytest.skip(f"{model_id}: no exact published count ({facts.how[:120]})")
    counted = arch.checkpoint_num_params if facts.counts == "checkpoint" else arch.num_params
    assert counted == facts.num_params, facts.source
    assert presets()[model_id].config_source


def test_no_exact_count_is_rare():
    assert len(NO_EXACT_COUNT) <= 1, NO_EXACT_COUNT


@pytest.mark.parametrize("gpu_id", sorted(gpus()))
def test_gpu_entry_is_sourced_and_plausible(gpu_id):
    g = gpus()[gpu_id]
    assert g.memory_total_source.quote
    # Runtime totals are below the marketing size in decimal GB (e.g. "80 GB" H100: 85.0e9 B
    # reported vs 80 GiB = 85.9e9 B) and never above it in binary units.
    digits = "".join(ch for ch in g.marketing_memory.split("GB")[0] if ch.isdigit() or ch == ".")
    marketing_gb = float(digits)
    assert g.memory_total_bytes <= marketing_gb * 2**30 * 1.03
    assert g.memory_total_bytes >= marketing_gb * 10**9 * 0.85
    if g.vendor == "nvidia":
        assert g.compute_capability
    if g.memory_total_basis == "runtime":
        assert g.memory_total_source.quote


def test_h100_reports_about_79_gib_to_cuda():
    h100 = gpus()["h100-sxm5-80gb"]
    assert 79.0 < h100.memory_total_bytes / 2**30 < 79.3


def test_an_nvidia_smi_total_is_said_to_be_above_the_runtimes():
    """Five entries hold nvidia-smi's total where no runtime printout was found (L40, L20,
    A800, H800, GB200): the runtime reports less on every GPU with both (the driver's
    reservation), so budgets and fits on them warn. The range is the catalog's own: V100 SXM2
    16GB, 16,384 MiB - 16,928,342,016 B = 251,527,168 B = 239.9 MiB (floor 239); A100 PCIe
    80GB, 81,920 MiB - 84,974,239,744 B = 925,106,176 B = 882.3 MiB (ceil 883)."""
    import msgspec

    from vrambudget.core.device import resolve_device, total_note
    from vrambudget.core.estimate import estimate
    from vrambudget.core.fit import FitRequest, fit
    from vrambudget.core.spec import BudgetRequest, CatalogDevice

    smi = sorted(g.id for g in gpus().values() if g.memory_total_basis == "nvidia_smi")
    assert smi == ["a800-sxm4-80gb", "gb200-186gb", "h800-sxm5-80gb", "l20-48gb", "l40-48gb"]
    note = total_note(resolve_device(CatalogDevice(id="h800-sxm5-80gb")))
    assert note is not None and "reports 239-883 MiB less" in note
    assert total_note(resolve_device(CatalogDevice(id="h100-sxm5-80gb"))) is None

    def budget(gpu_id: str):
        body = {
            "workloads": [
                {"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"}}
            ],
            "device": {"source": "catalog", "id": gpu_id},
        }
        req = msgspec.convert(body, BudgetRequest)
        return estimate(req.workloads, req.device)

    assert note in budget("h800-sxm5-80gb").warnings
    assert not any("nvidia-smi's total" in w for w in budget("h100-sxm5-80gb").warnings)
    answer = fit(
        msgspec.convert(
            {
                "workloads": [
                    {"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"}}
                ]
            },
            FitRequest,
        )
    )
    warned = sorted(
        g.gpu_id for g in answer.gpus if any("nvidia-smi's total" in w for w in g.warnings)
    )
    assert warned == smi
