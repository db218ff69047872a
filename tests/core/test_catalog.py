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
