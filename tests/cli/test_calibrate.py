"""``vrambudget calibrate`` (vrambudget/cli/calibrate.py): the calibration round trip (store ->
profile directory -> budget) and the inputs it refuses."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from litestar.testing import TestClient

from tests.support.reports import WORKLOAD, cuda_report
from vrambudget.agent.store import Store
from vrambudget.cli.main import main
from vrambudget.core.calibration import CalibrationProfile, load_profiles
from vrambudget.core.compare import estimate_input
from vrambudget.core.estimate import estimate
from vrambudget.core.probe_report import ProbeResource
from vrambudget.core.spec import Headroom
from vrambudget.service.app import Settings, create_app

MiB = 1 << 20


def _store_with_probe(path: Path, report: ProbeResource) -> None:
    with Store(path) as store:
        store.create_probe(report.id, msgspec.json.encode(report.request).decode(), "cuda:0", 1.0)
        store.transition(report.id, "running", 2.0, expected={"queued"})
        store.finish_with_callback(
            report.id, "succeeded", 3.0, msgspec.json.encode(report.result).decode(), None
        )


def test_calibration_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stored probe -> ``vrambudget calibrate`` -> a profile directory the service loads ->
    the overhead lines it measured change, every other line is identical, and the budget names
    the profile."""
    db = tmp_path / "agent.sqlite3"
    report = cuda_report()
    _store_with_probe(db, report)
    out = tmp_path / "profiles"
    assert main(["calibrate", "--store", str(db), "--out", str(out)]) == 0
    (written,) = out.glob("*.json")
    profile = msgspec.json.decode(written.read_bytes(), type=CalibrationProfile)
    assert profile.gpu_id == "h100-sxm5-80gb" and profile.probe_ids == ("p-h100",)
    assert profile.cuda_context_bytes == 560 * MiB and profile.workspace_bytes == 36 * MiB
    inp = estimate_input(report)
    built_in = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
    transient = built_in.devices[0].inputs["largest_transient_bytes"]
    assert profile.inference_fragmentation_fraction == round(300 * MiB / transient, 4)
    assert load_profiles(out).profiles == (profile,)

    request = {"workloads": [WORKLOAD], "device": {"source": "catalog", "id": "h100-sxm5-80gb"}}
    with (
        TestClient(create_app()) as plain,
        TestClient(create_app(Settings(profiles_dir=str(out)))) as calibrated,
    ):
        before = plain.post("/v1/budgets", json=request).json()
        after = calibrated.post("/v1/budgets", json=request).json()
        wrong_torch = calibrated.post(
            "/v1/budgets", json={**request, "software": {"torch_version": "2.4.0"}}
        ).json()
    lines_b = {ln["component"]: ln for ln in before["devices"][0]["lines"]}
    lines_a = {ln["component"]: ln for ln in after["devices"][0]["lines"]}
    changed = {c for c in lines_a if lines_a[c]["bytes"] != lines_b[c]["bytes"]}
    assert changed == {"cuda_context", "runtime_workspace", "allocator_overhead", "headroom"}
    # the measured context (the line's first part) and the built-in kernel images after it
    assert lines_a["cuda_context"]["parts"][0] == {"name": "CUDA context", "bytes": 560 * MiB}
    assert (
        lines_a["cuda_context"]["bytes"] == 560 * MiB + lines_a["cuda_context"]["parts"][1]["bytes"]
    )
    assert lines_a["runtime_workspace"]["bytes"] == 36 * MiB
    assert profile.id in lines_a["cuda_context"]["source"]
    assert after["calibration"]["profile"] == profile.id
    assert after["calibration"]["matched_on"] == ["gpu"]
    origins = {o["component"]: o["origin"] for o in after["calibration"]["overheads"]}
    assert origins == {
        "cuda_context": "profile",
        "runtime_workspace": "profile",
        "communication_buffers": "builtin",
        "allocator_overhead": "profile",
    }
    assert before["calibration"]["profile"] is None
    assert {o["origin"] for o in before["calibration"]["overheads"]} == {"builtin"}
    # A request for another torch does not get this profile: the built-in overheads of torch
    # 2.4 (an H100 keeps 32 MiB of cuBLAS and adds cuBLASLt's own 1 MiB before 2.12).
    assert wrong_torch["calibration"]["profile"] is None
    lines_w = {ln["component"]: ln["bytes"] for ln in wrong_torch["devices"][0]["lines"]}
    assert lines_w["runtime_workspace"] == 32 * MiB + MiB
    assert lines_w["cuda_context"] == lines_b["cuda_context"]["bytes"]


def test_calibrate_refuses_cpu_reports_and_bad_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = cuda_report()
    cpu = msgspec.structs.replace(
        report, result=msgspec.structs.replace(report.result, device="cpu", nvml=None)
    )
    f = tmp_path / "cpu.json"
    f.write_bytes(msgspec.json.encode({"type": "probe.succeeded", "data": cpu}))
    assert main(["calibrate", str(f), "--out", str(tmp_path / "o")]) == 2
    assert "ran on the CPU" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["calibrate", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert main(["calibrate", "--out", str(tmp_path / "o")]) == 2
    assert "no probe reports" in capsys.readouterr().err


def test_calibrate_leaves_out_a_probe_that_ran_with_expandable_segments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile holds fixed segments' fragmentation fractions: a probe whose allocator ran
    with ``expandable_segments:True`` is skipped, saying why."""
    report = cuda_report()
    expandable = msgspec.structs.replace(
        report, result=msgspec.structs.replace(report.result, expandable_segments=True)
    )
    f = tmp_path / "expandable.json"
    f.write_bytes(msgspec.json.encode({"type": "probe.succeeded", "data": expandable}))
    assert main(["calibrate", str(f), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "ran with expandable_segments:True" in err
    assert "no succeeded CUDA probe" in err
