"""Calibration profiles (vrambudget/core/calibration.py): matching rules, what a profile changes,
building profiles from reports, loading and refusing profile files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.reports import cuda_report
from vrambudget.core.calibration import (
    CalibrationProfile,
    ProfileSet,
    apply_profile,
    build_profiles,
    load_profiles,
)
from vrambudget.core.compare import estimate_input
from vrambudget.core.estimate import estimate
from vrambudget.core.overheads import device_overheads
from vrambudget.core.spec import CatalogDevice, Headroom, Software

MiB = 1 << 20


# -------------------------------------------------------------------------- calibration ----


def _profile(**changes: Any) -> CalibrationProfile:
    base = dict(
        id="h100-a",
        gpu_name="NVIDIA H100 80GB HBM3",
        gpu_id="h100-sxm5-80gb",
        torch_version="2.13.0+cu130",
        cuda_version="13.0",
        driver_version="580.82.07",
        cuda_context_bytes=534 * MiB,
        probe_ids=("p1",),
        created_at="2026-12-01",
    )
    return CalibrationProfile(**{**base, **changes})


def test_profile_matching_rules() -> None:
    a = _profile()
    b = _profile(id="h100-b", torch_version="2.4.1", created_at="2026-12-02")
    other = _profile(id="a100", gpu_id="a100-sxm4-80gb", gpu_name="NVIDIA A100-SXM4-80GB")
    ps = ProfileSet([a, b, other])
    got, matched = ps.best(
        "h100-sxm5-80gb", "NVIDIA H100 SXM5 80GB", Software(torch_version="2.13.1")
    )
    assert got is a and matched == ("gpu", "torch")
    got, _ = ps.best("h100-sxm5-80gb", "x", Software(torch_version="2.4.0"))
    assert got is b
    got, _ = ps.best("h100-sxm5-80gb", "x", Software(torch_version="2.9.0"))
    assert got is None  # both name a different torch: none applies
    got, matched = ps.best("h100-sxm5-80gb", "x", None)  # unnamed versions are not checked
    assert got is b and matched == ("gpu",)  # the newest
    assert ps.best("l4-24gb", "NVIDIA L4", None) == (None, ())
    with pytest.raises(ValueError, match="duplicate"):
        ProfileSet([a, a])


def test_apply_profile_changes_only_what_it_measured() -> None:
    ov = device_overheads("9.0", "nvidia", None)
    p = _profile(workspace_bytes=None, training_fragmentation_fraction=0.5)
    got = apply_profile(ov, p, ("gpu",))
    assert got.cuda_context_bytes == 534 * MiB and got.workspace_bytes == ov.workspace_bytes
    assert got.training_fragmentation_ppm == 500_000
    assert got.inference_fragmentation_ppm == ov.inference_fragmentation_ppm
    assert got.cuda_context_source.startswith("calibration profile h100-a")
    assert got.workspace_source == ov.workspace_source
    assert "inference: built-in" in got.fragmentation_source


def test_profiles_group_by_gpu_and_software() -> None:
    a = cuda_report(probe_id="a")
    b = cuda_report(probe_id="b", context=500 * MiB)  # a: 560 MiB
    c = cuda_report(probe_id="c", torch_version="2.12.0+cu130")
    inputs = []
    for r in (a, b, c):
        inp = estimate_input(r)
        inputs.append(
            (
                r,
                estimate(
                    (inp.workload,), CatalogDevice(id="h100-sxm5-80gb"), Headroom(fraction=0.0)
                ),
                inp.gpu_id,
            )
        )
    profiles = {p.torch_version: p for p in build_profiles(inputs, "t")}
    assert set(profiles) == {"2.13.0+cu130", "2.12.0+cu130"}
    assert profiles["2.13.0+cu130"].probe_ids == ("a", "b")
    assert profiles["2.13.0+cu130"].cuda_context_bytes == 500 * MiB  # lower median of 2
    assert profiles["2.13.0+cu130"].samples["cuda_context_bytes"] == 2


_H100_PROFILE = (
    '{"id": "h100-small-ws", "gpu_name": "NVIDIA H100 80GB HBM3", '
    '"gpu_id": "h100-sxm5-80gb", "torch_version": null, "cuda_version": null, '
    '"driver_version": null, "workspace_bytes": %d, "probe_ids": ["p1"]}'
)


def test_a_profile_with_a_negative_value_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(_H100_PROFILE % -1)
    with pytest.raises(ValueError, match=r"p\.json"):
        load_profiles(tmp_path)


def test_profile_ids_are_ascii() -> None:
    from vrambudget.core.calibration import _slug

    assert _slug("NVIDIA Ｈ100 — 80GB") == "nvidia-100-80gb"  # noqa: RUF001 - a fullwidth H on purpose
