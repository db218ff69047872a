"""The agent's side of the round trip (vrambudget/agent/roundtrip.py): the estimate fetched before a
probe runs, the catalog GPU it names, the host's software it sends."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import pytest

from tests.support.workloads import QWEN_INFER
from vrambudget.agent.roundtrip import fetch_estimate
from vrambudget.core.calibration import load_profiles
from vrambudget.core.estimate import estimate
from vrambudget.core.probe_report import ProbeRequest
from vrambudget.core.spec import BudgetRequest

MiB = 1 << 20


def test_an_estimate_that_is_not_a_budget_is_an_estimate_error() -> None:
    """A 2xx that is not a Budget was stored as the probe's estimate; every later read of the
    probe (its callback, its comparison row, GET /v1/probes) then failed to decode it."""
    req = msgspec.convert(
        {"workload": QWEN_INFER, "service_url": "http://127.0.0.1:8000"}, ProbeRequest
    )
    for body in (b"<html>proxy</html>", b'{"ok": true}'):
        transport = httpx.MockTransport(lambda r, b=body: httpx.Response(200, content=b))
        answer, error = fetch_estimate(req, None, transport)
        assert answer is None and error is not None and "not a budget" in error


def test_the_agent_matches_its_gpu_when_nvml_total_exceeds_the_runtime_total() -> None:
    """NVML's total includes the driver's reserved memory (L4: 23034 MiB vs the runtime's
    22478): the name and compute capability still find the catalog GPU."""
    from types import SimpleNamespace

    from vrambudget.agent.roundtrip import device_ref
    from vrambudget.core.spec import CatalogDevice

    gpu = SimpleNamespace(
        index=0,
        uuid="GPU-1",
        name="NVIDIA L4",
        memory_total_bytes=23034 * MiB,
        compute_capability="8.9",
    )
    inv = SimpleNamespace(available=True, gpus=[gpu])
    assert device_ref(inv, 0) == CatalogDevice(id="l4-24gb")
    assert device_ref(SimpleNamespace(available=False, gpus=[]), 0) is None


def test_the_pre_run_estimate_names_the_software_so_the_profile_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's estimate before the run sent no software, so a profile keyed on torch/CUDA
    versions was never used for it while the comparison (which reads the report's versions)
    used it: the stored estimate and the comparison's estimate disagreed."""
    from types import SimpleNamespace

    import vrambudget.agent.roundtrip as rt
    from vrambudget.core.result import Budget

    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.13.0+cu128'\ncuda: Optional[str] = '12.8'\n"
    )
    monkeypatch.setattr(rt.importlib.metadata, "version", lambda name: "2.13.0+cu128")
    monkeypatch.setattr(
        rt.importlib.util,
        "find_spec",
        lambda name: SimpleNamespace(submodule_search_locations=[str(fake)]),
    )
    rt._torch_build.cache_clear()
    try:
        sw = rt.local_software(SimpleNamespace(available=True, driver_version="580.82.07"))
    finally:
        rt._torch_build.cache_clear()
    assert sw is not None
    assert (sw.torch_version, sw.cuda_version, sw.driver_version) == (
        "2.13.0+cu128",
        "12.8",
        "580.82.07",
    )

    profiles_dir = tmp_path / "profiles"
    profiles_dir.mkdir()
    (profiles_dir / "p.json").write_text(
        '{"id": "h100-cu128", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_id": "h100-sxm5-80gb", '
        '"torch_version": "2.13.0+cu128", "cuda_version": "12.8", "driver_version": null, '
        f'"cuda_context_bytes": {600 * MiB}, "probe_ids": ["p1"]}}'
    )
    profiles = load_profiles(profiles_dir)
    sent: list[dict] = []

    def service(r: httpx.Request) -> httpx.Response:  # the service's own decode and estimate
        sent.append(msgspec.json.decode(r.content))
        q = msgspec.json.decode(r.content, type=BudgetRequest)
        b = estimate(q.workloads, q.device, q.headroom, profiles, q.software)
        return httpx.Response(200, content=msgspec.json.encode(b))

    req = msgspec.convert(
        {"workload": QWEN_INFER, "service_url": "http://127.0.0.1:8000"}, ProbeRequest
    )
    from vrambudget.core.spec import CatalogDevice

    h100 = CatalogDevice(id="h100-sxm5-80gb")
    answer, error = fetch_estimate(req, h100, httpx.MockTransport(service), sw)
    assert error is None and answer is not None
    from vrambudget.core.spec import Software

    assert msgspec.convert(sent[-1]["software"], Software) == Software(
        torch_version="2.13.0+cu128", cuda_version="12.8", driver_version="580.82.07"
    )
    budget = msgspec.json.decode(answer, type=Budget)
    assert budget.calibration is not None and budget.calibration.profile == "h100-cu128"
    lines = {ln.component.value: ln.bytes for ln in budget.devices[0].lines}
    # the profile's context, and the 180,813,824 B of kernel images an inference loads after it
    assert lines["cuda_context"] == 600 * MiB + 180_813_824
    # Another torch minor: the profile is not used, the built-in context is.
    other = msgspec.structs.replace(sw, torch_version="2.12.0+cu128")
    answer, _ = fetch_estimate(req, h100, httpx.MockTransport(service), other)
    assert msgspec.json.decode(answer, type=Budget).calibration.profile is None


def test_an_nvml_driver_that_is_no_driver_version_is_not_sent() -> None:
    """The service refuses a `driver_version` outside its pattern; NVML's own strings pass."""
    from types import SimpleNamespace

    import vrambudget.agent.roundtrip as rt

    assert rt.nvml_driver(SimpleNamespace(driver_version="535.247.01")) == "535.247.01"
    assert rt.nvml_driver(SimpleNamespace(driver_version="560.94")) == "560.94"
    for odd in ("x", "", None, "12.4", "535.247.01-custom"):
        assert rt.nvml_driver(SimpleNamespace(driver_version=odd)) is None


def test_a_serving_probe_estimate_names_the_driver_alone() -> None:
    """A serving engine brings its own torch and CUDA build: the estimate sent before its probe
    names the host's driver only; other workloads name the agent's torch too."""
    from types import SimpleNamespace

    import msgspec

    import vrambudget.agent.roundtrip as rt
    from vrambudget.core.spec import LLMServingWorkload

    inv = SimpleNamespace(available=True, driver_version="535.247.01")
    serve = msgspec.convert(
        {"kind": "llm_serving", "model": {"source": "preset", "id": "qwen3-8b"}},
        LLMServingWorkload,
    )
    sw = rt.workload_software(serve, inv)
    assert sw is not None
    assert (sw.torch_version, sw.cuda_version, sw.driver_version) == (None, None, "535.247.01")
    assert rt.workload_software(serve, SimpleNamespace(available=False)) is None
