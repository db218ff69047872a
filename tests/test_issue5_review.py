"""Regression tests from the review of issue 5 (comparisons, round trip, calibration)."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import pytest

from vrambudget.agent.roundtrip import fetch_estimate
from vrambudget.core.calibration import load_profiles
from vrambudget.core.compare import _headroom, compare, estimate_input
from vrambudget.core.estimate import estimate, headroom_bytes
from vrambudget.core.probe_report import ProbeRequest
from vrambudget.core.spec import BudgetRequest, Headroom

from .test_comparison import _cuda_report

MiB = 1 << 20
_H100_PROFILE = ('{"id": "h100-small-ws", "gpu_name": "NVIDIA H100 80GB HBM3", '
                 '"gpu_id": "h100-sxm5-80gb", "torch_version": null, "cuda_version": null, '
                 '"driver_version": null, "workspace_bytes": %d, "probe_ids": ["p1"]}')


def test_a_calibrated_workspace_below_the_cublaslt_size_traces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUBLAS_WORKSPACE_CONFIG=:16:8 (128 KiB) measured into a profile: the trace tier split it
    into cuBLAS = 128 KiB - 1 MiB (negative) and its replay raised (a 500)."""
    pytest.importorskip("torch")
    from vrambudget.trace.engine import trace_budget

    (tmp_path / "p.json").write_text(_H100_PROFILE % (128 << 10))
    monkeypatch.setenv("VRAMBUDGET_PROFILES_DIR", str(tmp_path))
    req = msgspec.convert({
        "method": "trace", "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
        "workloads": [{"kind": "inference",
                       "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                       "batch_size": 1, "prompt_tokens": 16, "generated_tokens": 2}]},
        BudgetRequest)
    budget = trace_budget(req)
    lines = {ln.component.value: ln.bytes for ln in budget.devices[0].lines}
    assert lines["runtime_workspace"] == 128 << 10


def test_a_profile_with_a_negative_value_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(_H100_PROFILE % -1)
    with pytest.raises(ValueError, match="p.json"):
        load_profiles(tmp_path)


def test_an_estimate_that_is_not_a_budget_is_an_estimate_error() -> None:
    """A 2xx that is not a Budget was stored as the probe's estimate; every later read of the
    probe (its callback, its comparison row, GET /v1/probes) then failed to decode it."""
    req = msgspec.convert({"workload": {"kind": "inference",
                                        "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                                        "batch_size": 1, "prompt_tokens": 8,
                                        "generated_tokens": 1},
                           "service_url": "http://127.0.0.1:8000"}, ProbeRequest)
    for body in (b"<html>proxy</html>", b'{"ok": true}'):
        transport = httpx.MockTransport(lambda r, b=body: httpx.Response(200, content=b))
        answer, error = fetch_estimate(req, None, transport)
        assert answer is None and error is not None and "not a budget" in error


def test_headroom_fraction_is_exact() -> None:
    """The advice's fraction is the smallest whole percent that covers its bytes: a float
    quotient made 7% into 8%, and the 2% floor's own byte rounding made it 3%."""
    report = _cuda_report()
    inp = estimate_input(report)
    budget = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
    subtotal = budget.devices[0].total_bytes
    # Make the measurement agree with the estimate: only the floor is left.
    t = report.result.torch  # type: ignore[union-attr]
    nv = report.result.nvml  # type: ignore[union-attr]
    nv = msgspec.structs.replace(nv, process_peak_used_bytes=subtotal)
    t = msgspec.structs.replace(t, iteration_peak_bytes=())
    result = msgspec.structs.replace(report.result, torch=t, nvml=nv)
    report = msgspec.structs.replace(report, result=result)
    advice = compare(report, {"analytic": budget}, inp).headroom
    assert any("floor of 2%" in r for r in advice.reasons)
    assert advice.fraction == 0.02
    assert headroom_bytes(subtotal, Headroom(fraction=advice.fraction)) >= advice.bytes
    # 7% exactly (7/100*100 is 7.000000000000001 in floats): 0.07, not 0.08.
    tier = compare(report, {"analytic": budget}, inp).tiers[0]
    advice = _headroom(report, tier, {"device_used": 107 * MiB, "comparable": 100 * MiB})
    assert advice.bytes == 7 * MiB and advice.fraction == 0.07


def test_a_probe_cancelled_while_its_estimate_is_fetched_is_cancelled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate fetch (up to its timeout) ran before the probe was in ``st.running``: a
    DELETE then found a running probe with no process, did nothing, and the probe ran."""
    import threading
    import time

    from litestar.testing import TestClient

    import vrambudget.agent.api as agent_api
    from vrambudget.agent.api import create_agent_app
    from vrambudget.agent.settings import AgentSettings

    from .test_agent_e2e import INFER

    entered, release = threading.Event(), threading.Event()

    def slow_fetch(*_: object, **__: object) -> tuple[None, str]:
        entered.set()
        release.wait(30)
        return None, "estimate: service slow"

    monkeypatch.setattr(agent_api, "fetch_estimate", slow_fetch)
    settings = AgentSettings(data_dir=tmp_path, tokens=(b"t",),
                             service_allow_list=("http://127.0.0.1:9",))
    auth = {"Authorization": "Bearer t"}
    with TestClient(create_agent_app(settings)) as client:
        r = client.post("/v1/probes", json={"workload": INFER, "iterations": 1,
                                            "service_url": "http://127.0.0.1:9"}, headers=auth)
        assert r.status_code == 202, r.text
        probe_id = r.json()["id"]
        assert entered.wait(30)
        threading.Timer(0.5, release.set).start()
        client.delete(f"/v1/probes/{probe_id}", headers=auth)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            doc = client.get(f"/v1/probes/{probe_id}", headers=auth).json()
            if doc["status"] not in ("queued", "running"):
                break
            time.sleep(0.2)
        assert doc["status"] == "cancelled", doc["status"]


def test_a_profile_name_with_braces_is_not_a_format_string() -> None:
    """The source text was built with str.format after the profile's name was interpolated:
    a name with braces raised KeyError in every budget for its device (a 500)."""
    from vrambudget.core.calibration import CalibrationProfile, ProfileSet
    from vrambudget.core.spec import CatalogDevice, InferenceWorkload

    profile = CalibrationProfile(id="odd", gpu_name="GPU {x}", gpu_id="h100-sxm5-80gb",
                                 torch_version=None, cuda_version=None, driver_version=None,
                                 cuda_context_bytes=500 * MiB, probe_ids=("p{1}",))
    w = msgspec.convert({"kind": "inference",
                         "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                         "batch_size": 1, "prompt_tokens": 8, "generated_tokens": 1},
                        InferenceWorkload)
    budget = estimate((w,), CatalogDevice(id="h100-sxm5-80gb"), None, ProfileSet([profile]))
    line = next(ln for ln in budget.devices[0].lines if ln.component.value == "cuda_context")
    assert line.bytes == 500 * MiB and "GPU {x}" in line.source and "p{1}" in line.source


def test_extra_streams_workspaces_are_in_the_working_set_estimate() -> None:
    """cuBLAS keeps a workspace per (handle, stream): with N streams on CUDA the working-set
    estimate carries N - 1 more of them (the measured first one is runtime_workspace)."""
    from vrambudget.core.components import Component

    one = _cuda_report()
    four = msgspec.structs.replace(one, request=msgspec.structs.replace(one.request,
                                                                        concurrency=4))
    inp1, inp4 = estimate_input(one), estimate_input(four)
    b1 = estimate((inp1.workload,), inp1.device, Headroom(fraction=0.0))
    b4 = estimate((inp4.workload,), inp4.device, Headroom(fraction=0.0))
    q4 = {q.name: q for q in compare(four, {"analytic": b4}, inp4).tiers[0].quantities}
    lines4 = {ln.component: ln.bytes for ln in b4.devices[0].lines}
    blas = lines4[Component.RUNTIME_WORKSPACE]
    assert q4["working_set_peak"].estimate_bytes == (
        lines4[Component.ACTIVATIONS] + lines4[Component.LOGITS] + 3 * blas)
    assert "3 more stream(s)" in (q4["working_set_peak"].note or "")
    q1 = {q.name: q for q in compare(one, {"analytic": b1}, inp1).tiers[0].quantities}
    assert q1["working_set_peak"].note is None


def test_headroom_advice_above_what_a_request_accepts_says_use_min_bytes() -> None:
    report = _cuda_report()
    inp = estimate_input(report)
    budget = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
    tier = compare(report, {"analytic": budget}, inp).tiers[0]
    advice = _headroom(report, tier, {"device_used": 300 * MiB, "comparable": 100 * MiB})
    # shortfall 200 MiB + the iterations' 4 MiB spread, over a 100 MiB estimate
    assert advice.bytes == 204 * MiB and advice.fraction == 2.04
    assert any(f"headroom.min_bytes = {204 * MiB}" in r for r in advice.reasons)


def test_a_comparison_attempt_that_raises_still_sends_the_callback(tmp_path: Path) -> None:
    """An exception inside a comparison attempt counts against the comparison limit; when it is
    reached the probe's callback is still enqueued (with the error), not given up silently."""
    from vrambudget.agent.store import Store
    from vrambudget.agent.webhooks import Deliverer

    store = Store(tmp_path / "a.sqlite3")
    store.create_probe("p", "{}", "cpu", 1.0)
    store.transition("p", "running", 2.0, expected={"queued"})
    store.finish_with_callback("p", "succeeded", 3.0, "{}", None,
                               comparison=("http://svc/v1/comparisons", "{}", "cmp_p"))
    calls = []

    def settle(row, body, error):  # type: ignore[no-untyped-def]
        calls.append(error)
        if len(calls) == 1:
            raise RuntimeError("database is locked")
        store.complete_comparison(row.id, 9.0, None, error,
                                  lambda probe: ("https://cb/x", probe.comparison_error, "msg_p"))

    clock = [10.0]
    d = Deliverer(store, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", (),
                  transport=httpx.MockTransport(lambda r: httpx.Response(200, text="{}")),
                  service_allow_list=("http://svc",), on_comparison=settle,
                  comparison_max_attempts=2, backoff=lambda n: 1.0, clock=lambda: clock[0])
    d.deliver_due()  # the handler raises: rescheduled (attempt 1 of 2)
    assert store.get_callback("cmp_p").attempts == 1  # type: ignore[union-attr]
    clock[0] = 20.0
    d.deliver_due()  # the answer is not a comparison -> settle(error) -> callback enqueued
    assert [r.id for r in store.due_callbacks(30.0, 10)] == ["msg_p"]
    store.close()


def test_profile_ids_are_ascii() -> None:
    from vrambudget.core.calibration import _slug

    assert _slug("NVIDIA Ｈ100 — 80GB") == "nvidia-100-80gb"


def test_the_agent_matches_its_gpu_when_nvml_total_exceeds_the_runtime_total() -> None:
    """NVML's total includes the driver's reserved memory (L4: 23034 MiB vs the runtime's
    22478): the name and compute capability still find the catalog GPU."""
    from types import SimpleNamespace

    from vrambudget.agent.roundtrip import device_ref
    from vrambudget.core.spec import CatalogDevice

    gpu = SimpleNamespace(index=0, uuid="GPU-1", name="NVIDIA L4",
                          memory_total_bytes=23034 * MiB, compute_capability="8.9")
    inv = SimpleNamespace(available=True, gpus=[gpu])
    assert device_ref(inv, 0) == CatalogDevice(id="l4-24gb")
    assert device_ref(SimpleNamespace(available=False, gpus=[]), 0) is None


def test_the_pre_run_estimate_names_the_software_so_the_profile_matches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's estimate before the run sent no software, so a profile keyed on torch/CUDA
    versions was never used for it while the comparison (which reads the report's versions)
    used it: the stored estimate and the comparison's estimate disagreed."""
    from types import SimpleNamespace

    import vrambudget.agent.roundtrip as rt
    from vrambudget.core.calibration import load_profiles
    from vrambudget.core.result import Budget

    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "version.py").write_text("from typing import Optional\n__version__ = "
                                     "'2.13.0+cu128'\ncuda: Optional[str] = '12.8'\n")
    monkeypatch.setattr(rt.importlib.metadata, "version", lambda name: "2.13.0+cu128")
    monkeypatch.setattr(rt.importlib.util, "find_spec", lambda name: SimpleNamespace(
        submodule_search_locations=[str(fake)]))
    rt._torch_build.cache_clear()
    try:
        sw = rt.local_software(SimpleNamespace(available=True, driver_version="580.82.07"))
    finally:
        rt._torch_build.cache_clear()
    assert sw is not None
    assert (sw.torch_version, sw.cuda_version, sw.driver_version) == (
        "2.13.0+cu128", "12.8", "580.82.07")

    profiles_dir = tmp_path / "profiles"
    profiles_dir.mkdir()
    (profiles_dir / "p.json").write_text(
        '{"id": "h100-cu128", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_id": "h100-sxm5-80gb", '
        '"torch_version": "2.13.0+cu128", "cuda_version": "12.8", "driver_version": null, '
        '"cuda_context_bytes": %d, "probe_ids": ["p1"]}' % (600 * MiB))
    profiles = load_profiles(profiles_dir)
    sent: list[dict] = []

    def service(r: httpx.Request) -> httpx.Response:  # the service's own decode and estimate
        sent.append(msgspec.json.decode(r.content))
        q = msgspec.json.decode(r.content, type=BudgetRequest)
        b = estimate(q.workloads, q.device, q.headroom, profiles, q.software)
        return httpx.Response(200, content=msgspec.json.encode(b))

    req = msgspec.convert({"workload": {"kind": "inference",
                                        "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                                        "batch_size": 1, "prompt_tokens": 8,
                                        "generated_tokens": 1},
                           "service_url": "http://127.0.0.1:8000"}, ProbeRequest)
    from vrambudget.core.spec import CatalogDevice

    h100 = CatalogDevice(id="h100-sxm5-80gb")
    answer, error = fetch_estimate(req, h100, httpx.MockTransport(service), sw)
    assert error is None and answer is not None
    assert sent[-1]["software"] == {"torch_version": "2.13.0+cu128", "cuda_version": "12.8",
                                    "driver_version": "580.82.07"}
    budget = msgspec.json.decode(answer, type=Budget)
    assert budget.calibration is not None and budget.calibration.profile == "h100-cu128"
    lines = {ln.component.value: ln.bytes for ln in budget.devices[0].lines}
    assert lines["cuda_context"] == 600 * MiB
    # Another torch minor: the profile is not used, the built-in context is.
    other = msgspec.structs.replace(sw, torch_version="2.12.0+cu128")
    answer, _ = fetch_estimate(req, h100, httpx.MockTransport(service), other)
    assert msgspec.json.decode(answer, type=Budget).calibration.profile is None
