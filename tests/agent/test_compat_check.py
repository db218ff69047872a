"""The agent checks the service's compatibility rules against the live device (a fake NVML
built from the real binding's structures) before a probe runs, and refuses with the rule that
fails; without NVML the check is skipped with a note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pynvml
import pytest
from litestar.testing import TestClient

import vrambudget.agent.handlers as handlers
import vrambudget.agent.roundtrip as roundtrip
from tests.support.fake_nvml import FakeGPU, FakeNVML
from tests.support.workloads import INFER, TRAIN
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.compat_check import live_check
from vrambudget.agent.nvml import inventory
from vrambudget.agent.settings import AgentSettings
from vrambudget.agent.spec import ProbeRequest

T4 = FakeGPU(name="Tesla T4", total_bytes=15_360 * 2**20, compute_capability=(7, 5))
B200 = FakeGPU(name="NVIDIA B200", total_bytes=183_359 * 2**20, compute_capability=(10, 0))
H100 = FakeGPU()  # NVIDIA H100 80GB HBM3, sm90


def _probe(workload: dict[str, Any]) -> ProbeRequest:
    return msgspec.convert({"workload": workload}, ProbeRequest)


@pytest.fixture
def torch_build(monkeypatch: pytest.MonkeyPatch):
    """The host's torch as its metadata would say (the agent never imports torch)."""

    def install(version: str, cuda: str | None) -> None:
        monkeypatch.setattr(roundtrip, "_torch_build", lambda: (version, cuda))

    return install


def test_flash_attention_probe_on_a_t4_is_refused_with_the_rule(torch_build):
    torch_build("2.8.0+cu128", "12.8")
    check = live_check(_probe({**TRAIN, "attention": "flash"}), inventory(FakeNVML([T4])))
    field, message = check.refusal() or ("", "")
    assert field == "$.workload"
    assert message.startswith("refused by rule flash_attention.cuda_arch: FlashAttention-2 needs")
    assert "Tesla T4 is sm75" in message and "attention: sdpa (or eager)" in message
    # The same probe with SDPA runs.
    assert (
        live_check(_probe({**TRAIN, "attention": "sdpa"}), inventory(FakeNVML([T4]))).refusal()
        is None
    )


def test_b200_with_a_cuda_11_8_torch_and_driver_470_is_refused(torch_build):
    torch_build("2.7.0+cu118", "11.8")
    nvml = FakeNVML([B200], driver_version="470.82.01", cuda_driver_version=11040)
    check = live_check(_probe(INFER), inventory(nvml))
    assert check.compatibility is not None
    failed = [o.rule for o in check.compatibility.checks if o.verdict == "unsupported"]
    assert failed == ["cuda.architecture"]
    assert "NVIDIA B200 (sm100) needs CUDA >= 12.8" in (check.refusal() or ("", ""))[1]


def test_a_cuda_13_build_on_a_driver_for_cuda_12_is_refused(torch_build):
    torch_build("2.11.0+cu130", "13.0")
    nvml = FakeNVML([H100], driver_version="550.54.15", cuda_driver_version=12040)
    check = live_check(_probe(INFER), inventory(nvml))
    rules = {o.rule: o.verdict for o in check.compatibility.checks}  # type: ignore[union-attr]
    assert rules["cuda.driver_supports"] == "unsupported"
    assert rules["cuda.driver_minimum"] == "unsupported"  # 550 < 580, CUDA 13's minimum
    assert "refused by rule cuda.driver_minimum" in (check.refusal() or ("", ""))[1]


def test_a_matching_host_is_accepted(torch_build):
    torch_build("2.8.0+cu128", "12.8")
    nvml = FakeNVML([H100], driver_version="570.124.06", cuda_driver_version=12080)
    check = live_check(_probe({**TRAIN, "attention": "flash"}), inventory(nvml))
    assert check.refusal() is None and check.note is None
    assert check.compatibility is not None and check.compatibility.verdict == "supported"


def test_without_a_driver_the_check_is_skipped_with_a_note(torch_build):
    torch_build("2.8.0+cu128", "12.8")
    nvml = FakeNVML([T4], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    check = live_check(_probe({**TRAIN, "attention": "flash"}), inventory(nvml))
    assert check.compatibility is None and check.refusal() is None
    assert check.note is not None and check.note.startswith("compatibility not checked: NVML")


def test_submission_is_refused_with_422_naming_the_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_build
) -> None:
    torch_build("2.8.0+cu128", "12.8")
    fake = FakeNVML([T4])
    monkeypatch.setattr(handlers.nvml, "inventory", lambda: inventory(fake))
    app = create_agent_app(AgentSettings(data_dir=tmp_path, tokens=(b"t",)))
    with TestClient(app) as client:
        client.app.state.agent.cuda = True
        r = client.post(
            "/v1/probes",
            json={"workload": {**TRAIN, "attention": "flash"}},
            headers={"Authorization": "Bearer t"},
        )
        assert r.status_code == 422
        assert "refused by rule flash_attention.cuda_arch" in r.text
        page = client.get("/v1/probes", headers={"Authorization": "Bearer t"}).json()
        assert page["items"] == []  # nothing was stored or queued
    # What the check read came from NVML (the agent creates no CUDA context).
    assert fake.calls["nvmlDeviceGetCudaComputeCapability"] >= 1
