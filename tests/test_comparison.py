"""Comparisons (service/budget/compare.py) and calibration profiles: the measurement-to-
component mapping checked by hand on a CUDA-shaped report, degraded reports, the API, and the
calibration round trip (store -> ``vrambudget calibrate`` -> profile directory -> budget)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from vrambudget.agent.store import Store
from vrambudget.service.app import Settings, create_app
from vrambudget.core.calibration import (
    CalibrationProfile,
    ProfileSet,
    apply_profile,
    build_profiles,
    load_profiles,
)
from vrambudget.core.compare import compare, estimate_input, match_gpu
from vrambudget.core.components import Component
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.overheads import ROUNDING_PART, device_overheads
from vrambudget.core.probe_report import (
    DeviceView,
    Iteration,
    ProbeRequest,
    ProbeResource,
    ProbeResult,
    TorchView,
)
from vrambudget.core.spec import CatalogDevice, Headroom, Software
from vrambudget.cli.main import main

C = Component
MiB = 1 << 20
H100_TOTAL = 85_045_477_376  # the catalog's h100-sxm5-80gb runtime total
WORKLOAD = {"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "batch_size": 4, "prompt_tokens": 512, "generated_tokens": 64}


def _cuda_report(*, probe_id: str = "p-h100", nvml: bool = True, kv: bool = True,
                 status: str = "succeeded", workload: dict[str, Any] | None = None,
                 torch_version: str = "2.13.0+cu130", context: int = 560 * MiB,
                 reserved_extra: int = 300 * MiB) -> ProbeResource:
    """A report shaped like the CUDA path's, with round numbers to check the arithmetic."""
    req = msgspec.convert({"workload": workload or WORKLOAD, "iterations": 3}, ProbeRequest)
    weights = 1_000 * MiB
    kv_bytes = 200 * MiB
    workspace = 36 * MiB
    allocated_peak = weights + workspace + (kv_bytes if kv else 0) + 150 * MiB
    reserved_peak = allocated_peak + reserved_extra
    view = DeviceView(baseline_used_bytes=2 * MiB, peak_used_bytes=0, samples=100,
                      sample_interval_s=0.005, max_sample_interval_s=0.02,
                      process_peak_used_bytes=reserved_peak + context + 12 * MiB,
                      accounting_max_memory_bytes=None, cuda_context_bytes=context,
                      others_changed_bytes=0, others_visible=True) if nvml else None
    result = ProbeResult(
        device="cuda", device_name="NVIDIA H100 80GB HBM3", torch_version=torch_version,
        cuda_version="13.0", driver_version="580.82.07",
        torch=TorchView(allocated_peak_bytes=allocated_peak, reserved_peak_bytes=reserved_peak,
                        num_alloc_retries=0, num_ooms=0, inactive_split_peak_bytes=8 * MiB,
                        weights_bytes=weights, kv_cache_bytes=kv_bytes if kv else None,
                        workspace_bytes=workspace,
                        iteration_peak_bytes=(allocated_peak - 4 * MiB, allocated_peak,
                                              allocated_peak - 2 * MiB)),
        nvml=view, host_peak_rss_bytes=3 << 30,
        iterations=Iteration(p50_s=0.1, p95_s=0.2, count=3, throughput_per_s=30.0, errors=0),
        outputs_finite=True, memory_total_bytes=85_024_112_640, compute_capability="9.0")
    return ProbeResource(id=probe_id, status=status, created_at=1.0,  # type: ignore[arg-type]
                         updated_at=2.0, request=req, result=result)


def _compare(report: ProbeResource) -> Any:
    inp = estimate_input(report)
    budget = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
    return compare(report, {"analytic": budget}, inp), budget


def test_the_mapping_by_hand_on_a_cuda_report() -> None:
    report = _cuda_report()
    comparison, budget = _compare(report)
    assert comparison.gpu_id == "h100-sxm5-80gb" and comparison.views == ("torch", "nvml")
    assert comparison.degraded == ()
    lines = {ln.component: ln for ln in budget.devices[0].lines}
    est = {c: ln.bytes for c, ln in lines.items()}
    rounding = {p.name: p.bytes for p in lines[C.ALLOCATOR_OVERHEAD].parts}[ROUNDING_PART]
    q = {x.name: x for x in comparison.tiers[0].quantities}
    t = report.result.torch  # type: ignore[union-attr]
    nv = report.result.nvml  # type: ignore[union-attr]
    assert q["resident_after_load"].estimate_bytes == (
        est[C.WEIGHTS] + est[C.QUANTIZATION_METADATA] + est[C.ADAPTERS] + rounding)
    assert q["resident_after_load"].measured_bytes == 1_000 * MiB
    assert q["kv_cache"].estimate_bytes == est[C.KV_CACHE]
    assert q["kv_cache"].measured_bytes == 200 * MiB
    assert q["runtime_workspace"].estimate_bytes == est[C.RUNTIME_WORKSPACE]
    assert q["runtime_workspace"].measured_bytes == 36 * MiB
    assert q["working_set_peak"].measured_bytes == 150 * MiB  # peak - resident - kv - workspace
    assert q["working_set_peak"].estimate_bytes == est[C.ACTIVATIONS] + est[C.LOGITS]
    assert q["allocator_overhead"].measured_bytes == 300 * MiB
    assert q["allocator_overhead"].estimate_bytes == est[C.ALLOCATOR_OVERHEAD] - rounding
    assert q["cuda_context"].measured_bytes == 560 * MiB
    assert q["device_used_peak"].measured_bytes == nv.process_peak_used_bytes  # type: ignore
    assert q["unexplained"].measured_bytes == 12 * MiB  # used - reserved - context
    assert q["allocated_peak"].measured_bytes == t.allocated_peak_bytes
    for x in q.values():
        if x.measured_bytes is not None and x.estimate_bytes is not None:
            assert x.difference_bytes == x.estimate_bytes - x.measured_bytes
    rows = {r.component: r for r in comparison.tiers[0].components}
    assert list(rows) == list(Component)
    assert rows[C.KV_CACHE].measured_bytes == 200 * MiB and rows[C.KV_CACHE].quantity == "kv_cache"
    assert rows[C.WEIGHTS].verdict == "grouped" and rows[C.WEIGHTS].quantity == (
        "resident_after_load")
    assert rows[C.HEADROOM].verdict == "not_applicable"
    assert rows[C.COMMUNICATION_BUFFERS].verdict == "not_applicable"  # TP 1: none estimated
    # Headroom advice: shortfall (if any) + the per-iteration spread (4 MiB), floor 2%.
    advice = comparison.headroom
    assert any("varied by 4194304 B across 3" in r for r in advice.reasons)
    subtotal = comparison.tiers[0].estimate_subtotal_bytes
    assert advice.bytes >= max(0, q["device_used_peak"].measured_bytes - subtotal) + 4 * MiB
    assert advice.fraction * subtotal >= advice.bytes


def test_verdicts_follow_the_tolerance() -> None:
    report = _cuda_report()
    inp = estimate_input(report)
    budget = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
    strict = compare(report, {"analytic": budget}, inp, tolerance_percent=0.0, tolerance_bytes=0)
    loose = compare(report, {"analytic": budget}, inp, tolerance_percent=100.0)
    s = {x.name: x.verdict for x in strict.tiers[0].quantities}
    lo = {x.name: x.verdict for x in loose.tiers[0].quantities}
    # 560 MiB measured vs the 534 MiB built-in H100 context: under when strict, within at 100%.
    assert s["cuda_context"] == "under" and lo["cuda_context"] == "within"
    assert s["unexplained"] == "under"  # 12 MiB outside the allocator and the context


@pytest.mark.parametrize("case", ["no_nvml", "no_kv", "cpu", "oom"])
def test_degraded_reports_say_so_and_do_not_crash(case: str) -> None:
    report = _cuda_report(nvml=case != "no_nvml", kv=case != "no_kv",
                          status="oom" if case == "oom" else "succeeded")
    if case == "cpu":
        res = msgspec.structs.replace(report.result, device="cpu", device_name="cpu", nvml=None,
                                      memory_total_bytes=None, compute_capability=None,
                                      torch=msgspec.structs.replace(
                                          report.result.torch,  # type: ignore[union-attr]
                                          reserved_peak_bytes=None, workspace_bytes=None))
        report = msgspec.structs.replace(report, result=res)
    comparison, _ = _compare(report)
    q = {x.name: x for x in comparison.tiers[0].quantities}
    assert comparison.degraded
    if case == "no_nvml":
        assert q["cuda_context"].verdict == "not_measured"
        assert q["device_used_peak"].verdict == "not_measured"
        assert "no NVML view" in comparison.degraded[0]
    elif case == "no_kv":
        assert q["kv_cache"].verdict == "not_measured"
        assert C.KV_CACHE in q["working_set_peak"].components
        rows = {r.component: r for r in comparison.tiers[0].components}
        assert rows[C.KV_CACHE].quantity == "working_set_peak"
    elif case == "cpu":
        assert comparison.gpu_id is None and comparison.views == ("torch",)
        for name in ("cuda_context", "allocator_overhead", "runtime_workspace", "unexplained"):
            assert q[name].verdict == "not_applicable"
    else:
        assert any("out of memory" in d for d in comparison.degraded)
        assert any("lower bound" in r for r in comparison.headroom.reasons)


@pytest.mark.parametrize(("status", "workload", "field"), [
    ("failed", None, "status"),
    ("cancelled", None, "status"),
    ("succeeded", {"kind": "custom", "entry_point": "x"}, "request.workload.kind"),
])
def test_reports_without_a_comparable_measurement_are_refused(status: str, workload: Any,
                                                             field: str) -> None:
    report = _cuda_report(status=status)
    if workload is not None:
        req = msgspec.convert({"workload": workload}, ProbeRequest)
        report = msgspec.structs.replace(report, request=req)
    with pytest.raises(InvalidWorkload) as exc:
        estimate_input(report)
    assert exc.value.field == field


def test_device_matching() -> None:
    assert match_gpu("NVIDIA H100 80GB HBM3", 85_024_112_640, "9.0").id == (  # type: ignore
        "h100-sxm5-80gb")
    assert match_gpu("NVIDIA H100 PCIe", 84_943_044_608, "9.0").id == (  # type: ignore
        "h100-pcie-80gb")
    assert match_gpu("NVIDIA A100-SXM4-80GB", 85_100_000_000, "8.0").id == (  # type: ignore
        "a100-sxm4-80gb")
    assert match_gpu("Mystery GPU", 12 << 30, "9.9") is None


# ------------------------------------------------------------------------------ the API ----


def test_api_comparison_of_a_report_and_its_errors() -> None:
    report = _cuda_report()
    body = msgspec.json.encode(report)
    with TestClient(create_app()) as client:
        r = client.post("/v1/comparisons", content=body)
        assert r.status_code == 200, r.text
        assert r.json() == json.loads(msgspec.json.encode(_compare(report)[0]))
        r = client.post("/v1/comparisons?tolerance_percent=101", content=body)
        assert r.status_code in (400, 422) and "tolerance_percent" in r.text
        r = client.post("/v1/comparisons?gpu=nope", content=body)
        assert r.status_code == 422 and "$.gpu" in r.text
        failed = msgspec.json.encode(msgspec.structs.replace(report, status="failed"))
        r = client.post("/v1/comparisons", content=failed)
        assert r.status_code == 422 and "$.status" in r.text
        r = client.post("/v1/comparisons", content=b'{"id": 1}')
        assert r.status_code == 422


# -------------------------------------------------------------------------- calibration ----


def _profile(**changes: Any) -> CalibrationProfile:
    base = dict(id="h100-a", gpu_name="NVIDIA H100 80GB HBM3", gpu_id="h100-sxm5-80gb",
                torch_version="2.13.0+cu130", cuda_version="13.0", driver_version="580.82.07",
                cuda_context_bytes=534 * MiB, probe_ids=("p1",), created_at="2026-12-01")
    return CalibrationProfile(**{**base, **changes})


def test_profile_matching_rules() -> None:
    a = _profile()
    b = _profile(id="h100-b", torch_version="2.4.1", created_at="2026-12-02")
    other = _profile(id="a100", gpu_id="a100-sxm4-80gb", gpu_name="NVIDIA A100-SXM4-80GB")
    ps = ProfileSet([a, b, other])
    got, matched = ps.best("h100-sxm5-80gb", "NVIDIA H100 SXM5 80GB",
                           Software(torch_version="2.13.1"))
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


def _store_with_probe(path: Path, report: ProbeResource) -> None:
    with Store(path) as store:
        store.create_probe(report.id, msgspec.json.encode(report.request).decode(), "cuda:0", 1.0)
        store.transition(report.id, "running", 2.0, expected={"queued"})
        store.finish_with_callback(report.id, "succeeded", 3.0,
                                   msgspec.json.encode(report.result).decode(), None)


def test_calibration_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stored probe -> ``vrambudget calibrate`` -> a profile directory the service loads ->
    the overhead lines it measured change, every other line is identical, and the budget names
    the profile."""
    db = tmp_path / "agent.sqlite3"
    report = _cuda_report()
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
    with TestClient(create_app()) as plain, TestClient(
            create_app(Settings(profiles_dir=str(out)))) as calibrated:
        before = plain.post("/v1/budgets", json=request).json()
        after = calibrated.post("/v1/budgets", json=request).json()
        wrong_torch = calibrated.post("/v1/budgets", json={
            **request, "software": {"torch_version": "2.4.0"}}).json()
    lines_b = {ln["component"]: ln for ln in before["devices"][0]["lines"]}
    lines_a = {ln["component"]: ln for ln in after["devices"][0]["lines"]}
    changed = {c for c in lines_a if lines_a[c]["bytes"] != lines_b[c]["bytes"]}
    assert changed == {"cuda_context", "runtime_workspace", "allocator_overhead", "headroom"}
    assert lines_a["cuda_context"]["bytes"] == 560 * MiB
    assert lines_a["runtime_workspace"]["bytes"] == 36 * MiB
    assert profile.id in lines_a["cuda_context"]["source"]
    assert after["calibration"]["profile"] == profile.id
    assert after["calibration"]["matched_on"] == ["gpu"]
    origins = {o["component"]: o["origin"] for o in after["calibration"]["overheads"]}
    assert origins == {"cuda_context": "profile", "runtime_workspace": "profile",
                       "communication_buffers": "builtin", "allocator_overhead": "profile"}
    assert before["calibration"]["profile"] is None
    assert {o["origin"] for o in before["calibration"]["overheads"]} == {"builtin"}
    # A request for another torch does not get this profile.
    assert wrong_torch["calibration"]["profile"] is None
    assert wrong_torch["devices"][0]["lines"] == before["devices"][0]["lines"]


def test_calibrate_refuses_cpu_reports_and_bad_files(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    report = _cuda_report()
    cpu = msgspec.structs.replace(report, result=msgspec.structs.replace(
        report.result, device="cpu", nvml=None))
    f = tmp_path / "cpu.json"
    f.write_bytes(msgspec.json.encode({"type": "probe.succeeded", "data": cpu}))
    assert main(["calibrate", str(f), "--out", str(tmp_path / "o")]) == 2
    assert "ran on the CPU" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["calibrate", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert main(["calibrate", "--out", str(tmp_path / "o")]) == 2
    assert "no probe reports" in capsys.readouterr().err


def test_profiles_group_by_gpu_and_software() -> None:
    a = _cuda_report(probe_id="a")
    b = _cuda_report(probe_id="b", context=500 * MiB)  # a: 560 MiB
    c = _cuda_report(probe_id="c", torch_version="2.12.0+cu130")
    inputs = []
    for r in (a, b, c):
        inp = estimate_input(r)
        inputs.append((r, estimate((inp.workload,), CatalogDevice(id="h100-sxm5-80gb"),
                                   Headroom(fraction=0.0)), inp.gpu_id))
    profiles = {p.torch_version: p for p in build_profiles(inputs, "t")}
    assert set(profiles) == {"2.13.0+cu130", "2.12.0+cu130"}
    assert profiles["2.13.0+cu130"].probe_ids == ("a", "b")
    assert profiles["2.13.0+cu130"].cuda_context_bytes == 500 * MiB  # lower median of 2
    assert profiles["2.13.0+cu130"].samples["cuda_context_bytes"] == 2


def test_a_bad_profile_directory_stops_the_service(tmp_path: Path) -> None:
    from vrambudget.service.app import SettingsError

    (tmp_path / "x.json").write_text('{"id": "x"}')
    with pytest.raises(SettingsError, match="VRAMBUDGET_PROFILES_DIR"):
        Settings(profiles_dir=str(tmp_path))
    with pytest.raises(SettingsError, match="does not exist"):
        Settings(profiles_dir=str(tmp_path / "missing"))


def test_a_trace_budget_says_its_allocator_overhead_is_the_replay() -> None:
    from vrambudget.core.spec import BudgetRequest
    from vrambudget.trace.engine import trace_budget

    tiny = {"kind": "inference", "model": {"source": "dimensions", "hidden_size": 128,
                                           "num_layers": 2, "num_attention_heads": 4,
                                           "num_key_value_heads": 2, "intermediate_size": 256,
                                           "vocab_size": 500},
            "batch_size": 1, "prompt_tokens": 16, "generated_tokens": 2}
    req = msgspec.convert({"method": "trace", "workloads": [tiny]}, BudgetRequest)
    use = trace_budget(req).calibration
    assert use is not None and use.profile is None
    origins = {o.component: o.source for o in use.overheads}
    assert origins[C.ALLOCATOR_OVERHEAD].startswith("trace tier: replay")
    assert origins[C.CUDA_CONTEXT] == estimate(req.workloads).calibration.overheads[0].source


def test_cpu_probe_kv_view_counts_every_stream() -> None:
    """The KV view is the known allocation of one request's cache (the exact K/V tensor bytes of
    the tiny model: layers x 2 x sequences x context x kv_heads x head_dim x 4 B) times the
    streams that each hold one."""
    from vrambudget.agent.probe import measure

    tiny = {"source": "dimensions", "hidden_size": 128, "num_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256,
            "vocab_size": 500}
    spec = {"kind": "inference", "model": tiny, "batch_size": 1, "prompt_tokens": 16,
            "generated_tokens": 2, "precision": {"weights": "fp32", "compute": "fp32"}}
    one_cache = 2 * 2 * 1 * 18 * 2 * 32 * 4  # layers, K+V, seqs, context, kv heads, dim, fp32
    for streams in (1, 3):
        req = msgspec.convert({"workload": spec, "iterations": 1, "concurrency": streams},
                              ProbeRequest)
        out = measure(req, {})
        assert out.result is not None
        assert out.result.torch.kv_cache_bytes == one_cache * streams
