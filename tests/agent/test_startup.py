"""The agent's startup line (vrambudget/agent/startup.py) and its one-line startup errors for a
bad setting (vrambudget/agent/settings.py, vrambudget/agent/__main__.py)."""

from __future__ import annotations

import platform
from importlib.metadata import version
from pathlib import Path

import pytest
from litestar.testing import TestClient

from tests.support.fake_nvml import H100_TOTAL_BYTES, FakeGPU, FakeNVML
from vrambudget.agent import nvml
from vrambudget.agent.__main__ import main as agent_main
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.nvml.records import NVMLInventory
from vrambudget.agent.settings import AgentSettings, AgentSettingsError
from vrambudget.agent.startup import startup_line


def test_the_line_names_address_gpus_store_and_versions(tmp_path: Path) -> None:
    inv = nvml.inventory(FakeNVML([FakeGPU(), FakeGPU(uuid="GPU-1")]))
    settings = AgentSettings(
        host="0.0.0.0", port=8194, data_dir=tmp_path, tokens=(b"t",), engines={"vllm": ("vllm",)}
    )
    line = startup_line(settings, inv)
    gib = f"{H100_TOTAL_BYTES / 2**30:.2f}"  # 81,559 MiB = 79.65 GiB
    assert gib == "79.65"
    assert line.startswith(f"vrambudget agent {version('vrambudget')} on http://0.0.0.0:8194; ")
    assert (
        f"2 GPU(s): cuda:0 NVIDIA H100 80GB HBM3 ({gib} GiB), cuda:1 NVIDIA H100 80GB HBM3 "
        f"({gib} GiB); driver 550.54.15, CUDA 12.4; " in line
    )
    assert f"store {tmp_path.resolve() / 'agent.sqlite3'}; " in line
    assert f"python {platform.python_version()}, torch " in line
    assert line.endswith("; engines vllm; auth: on")


def test_the_line_without_nvml_says_cpu_only(tmp_path: Path) -> None:
    inv = NVMLInventory(available=False, error="nvidia-ml-py is not installed: x")
    line = startup_line(AgentSettings(host="::1", data_dir=tmp_path), inv)
    assert " on http://[::1]:8100; " in line
    assert "; no GPU (nvidia-ml-py is not installed: x): CPU probes only; " in line
    assert (
        "auth: no tokens (VRAMBUDGET_AGENT_TOKENS): every authenticated endpoint answers 401"
        in (line)
    )


def test_the_app_logs_it_at_startup(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with TestClient(create_agent_app(AgentSettings(data_dir=tmp_path))):
        pass
    err = capfd.readouterr().err
    assert f"vrambudget.agent.api - api - vrambudget agent {version('vrambudget')} on " in err
    assert f"store {tmp_path.resolve() / 'agent.sqlite3'}" in err


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"VRAMBUDGET_AGENT_PORT": "x"},
            "VRAMBUDGET_AGENT_PORT must be a number (an integer in 0 .. 65535), got 'x'",
        ),
        (
            {"VRAMBUDGET_AGENT_RETRY_AFTER_S": "-5"},
            "VRAMBUDGET_AGENT_RETRY_AFTER_S must be in 1 .. 86400, got -5",
        ),
        (
            {"VRAMBUDGET_AGENT_MAX_BODY_BYTES": "0"},
            "VRAMBUDGET_AGENT_MAX_BODY_BYTES must be in 1024 .. 2**30, got 0",
        ),
        (
            {"VRAMBUDGET_AGENT_BODY_TIMEOUT_S": "soon"},
            "VRAMBUDGET_AGENT_BODY_TIMEOUT_S must be a number (a number in 0.1 .. 600), got 'soon'",
        ),
        (
            {"VRAMBUDGET_AGENT_WEBHOOK_SECRET": "whsec_!!!"},
            "VRAMBUDGET_AGENT_WEBHOOK_SECRET: webhook secret is not valid base64 (allowed: "
            "whsec_<base64>",
        ),
        (
            {"VRAMBUDGET_AGENT_HOST": "no-such-host.invalid"},
            "VRAMBUDGET_AGENT_HOST: cannot listen on 'no-such-host.invalid': ",
        ),
        ({"VRAMBUDGET_LOG_FORMAT": "xml"}, "VRAMBUDGET_LOG_FORMAT must be 'text' or 'json'"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(
    env: dict[str, str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("VRAMBUDGET_AGENT_DATA_DIR", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as done:
        agent_main([])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vrambudget agent: {message}"), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_settings_built_in_code_are_checked_too() -> None:
    with pytest.raises(AgentSettingsError, match=r"VRAMBUDGET_AGENT_SNAPSHOT_MAX_BYTES must be in"):
        AgentSettings(snapshot_max_bytes=0)
