"""Probe metrics at /metrics and one log line per probe state change, through an in-process
agent app running a real CPU probe (its child spawned)."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

import vrambudget.agent.worker as agent_worker
from tests.support.workloads import INFER
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings

AUTH = {"Authorization": "Bearer t"}
SERVICE = "http://127.0.0.1:9"


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus' text format (labels in any order)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if m is None or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if got == labels:
            return float(m.group(3))
    return None


def _wait(client: TestClient[Any], probe_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        doc: dict[str, Any] = client.get(f"/v1/probes/{probe_id}", headers=AUTH).json()
        if doc["status"] not in ("queued", "running"):
            return doc
        time.sleep(0.1)
    raise AssertionError(f"probe {probe_id} did not finish")


def test_probe_metrics_and_log_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The first probe's estimate fetch blocks the worker until released: the second probe
    # waits in the queue meanwhile.
    entered, release = threading.Event(), threading.Event()

    def slow_fetch(*_: object, **__: object) -> tuple[None, str]:
        entered.set()
        release.wait(60)
        return None, "estimate: no service in this test"

    monkeypatch.setattr(agent_worker, "fetch_estimate", slow_fetch)
    settings = AgentSettings(data_dir=tmp_path, tokens=(b"t",), service_allow_list=(SERVICE,))
    body = {"workload": INFER, "warmup_iterations": 0, "iterations": 2}
    probes_log = logging.getLogger("vrambudget.agent.probes")
    with TestClient(create_agent_app(settings)) as client:
        # After the app configured logging at its start (which drops the loggers' handlers).
        probes_log.addHandler(caplog.handler)
        caplog.set_level(logging.INFO, logger="vrambudget.agent.probes")
        text = client.get("/metrics", headers=AUTH).text
        assert _sample(text, "vrambudget_agent_probes_total", status="succeeded") == 0
        assert _sample(text, "vrambudget_agent_probe_queue_depth", device="cpu") is None
        assert client.get("/metrics").status_code == 401

        r = client.post("/v1/probes", json={**body, "service_url": SERVICE}, headers=AUTH)
        first = r.json()["id"]
        assert entered.wait(30)
        second = client.post("/v1/probes", json=body, headers=AUTH).json()["id"]
        text = client.get("/metrics", headers=AUTH).text
        assert _sample(text, "vrambudget_agent_probe_queue_depth", device="cpu") == 1
        assert client.delete(f"/v1/probes/{second}", headers=AUTH).json()["status"] == "cancelled"

        release.set()
        doc = _wait(client, first)
        assert doc["status"] == "succeeded", doc
        text = client.get("/metrics", headers=AUTH).text
        peak = doc["result"]["torch"]["allocated_peak_bytes"]

    assert _sample(text, "vrambudget_agent_probes_total", status="succeeded") == 1
    assert _sample(text, "vrambudget_agent_probes_total", status="cancelled") == 1
    assert _sample(text, "vrambudget_agent_probes_total", status="failed") == 0
    assert _sample(text, "vrambudget_agent_probe_queue_depth", device="cpu") == 0
    assert _sample(text, "vrambudget_agent_probe_duration_seconds_count", kind="inference") == 1
    assert _sample(text, "vrambudget_agent_probe_duration_seconds_count", kind="training") == 0
    took = _sample(text, "vrambudget_agent_probe_duration_seconds_sum", kind="inference")
    assert took is not None and took > 0
    assert (
        _sample(
            text, "vrambudget_agent_probe_last_peak_bytes", device="cpu", view="torch_allocated"
        )
        == peak
    )
    # The CPU path has no reserved or NVML view: no series for them.
    assert "torch_reserved" not in text and "nvml_device_used" not in text
    # Litestar's request metrics are served too.
    assert 'litestar_requests_total{app_name="vrambudget_agent"' in text

    probes_log.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if r.name == "vrambudget.agent.probes"]
    assert lines[0] == f"probe {first} queued on cpu (inference, dimensions)"
    assert lines[1] == f"probe {first} running on cpu"
    assert lines[2] == f"probe {second} queued on cpu (inference, dimensions)"
    assert lines[3] == f"probe {second} cancelled"
    assert re.fullmatch(
        rf"probe {first} succeeded in \d+\.\d s \(allocated peak \d+\.\d MiB\)", lines[4]
    ), lines[4]
    assert len(lines) == 5


def test_two_apps_in_one_process_keep_their_metrics_apart(tmp_path: Path) -> None:
    apps = [
        create_agent_app(AgentSettings(data_dir=tmp_path / str(i), tokens=(b"t",)))
        for i in range(2)
    ]
    with TestClient(apps[0]) as one, TestClient(apps[1]) as two:
        one.app.state.agent.metrics.finished.labels("oom").inc()
        assert (
            _sample(
                one.get("/metrics", headers=AUTH).text,
                "vrambudget_agent_probes_total",
                status="oom",
            )
            == 1
        )
        assert (
            _sample(
                two.get("/metrics", headers=AUTH).text,
                "vrambudget_agent_probes_total",
                status="oom",
            )
            == 0
        )
