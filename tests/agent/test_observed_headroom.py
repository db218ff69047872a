"""A finished probe carries the headroom its iterations and the device's earlier probes of the
same workload advise (vrambudget/agent/worker.py, core/compare/observed.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.support.workloads import INFER
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings

pytest.importorskip("torch")


def _finish(client: TestClient[Any], body: dict[str, Any], auth: dict[str, str]) -> Any:
    r = client.post("/v1/probes", json=body, headers=auth)
    assert r.status_code == 202, r.text
    url = r.headers["location"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        probe = client.get(url, headers=auth).json()
        if probe["status"] not in ("queued", "running"):
            return probe
        time.sleep(0.2)
    raise AssertionError("probe did not finish")


def test_second_probe_of_a_workload_rests_on_both(tmp_path: Path) -> None:
    app = create_agent_app(AgentSettings(tokens=(b"t",), data_dir=tmp_path))
    auth = {"Authorization": "Bearer t"}
    body = {"workload": INFER, "iterations": 3}
    with TestClient(app) as client:
        first = _finish(client, body, auth)
        assert first["status"] == "succeeded", first
        h1 = first["result"]["headroom"]
        peaks = first["result"]["torch"]["iteration_peak_bytes"]
        assert h1["probes"] == 1 and h1["iterations"] == 3
        assert h1["iteration_spread_bytes"] == max(peaks) - min(peaks)
        assert h1["peak_bytes"] == first["result"]["torch"]["allocated_peak_bytes"]
        other = _finish(client, {"workload": {**INFER, "batch_size": 1}}, auth)
        assert other["result"]["headroom"]["probes"] == 1  # a different workload
        second = _finish(client, body, auth)
        h2 = second["result"]["headroom"]
        assert h2["probes"] == 2
        a = first["result"]["torch"]["allocated_peak_bytes"]
        b = second["result"]["torch"]["allocated_peak_bytes"]
        assert h2["probe_spread_bytes"] == abs(a - b)
