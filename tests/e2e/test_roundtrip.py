"""The whole loop with real processes on 127.0.0.1: the calculation service (uvicorn), the
probe agent (CPU path) and a webhook receiver.

A probe naming the service is estimated before it runs, measured, posted to the service's
``/v1/comparisons`` from the agent's outbox, and its one signed callback carries the
comparison -- identical to what the service answers for the same report. A service that is down
when the probe finishes does not lose the measurement: the comparison is retried until the
service is back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import SECRET, Agent, Receiver, Service, free_port
from tests.support.workloads import INFER, TRAIN
from vrambudget.agent.webhooks import verify
from vrambudget.core.components import Component


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    s = Service(free_port())
    s.start()
    yield s
    s.stop()


def _agent(tmp: Path, receiver: Receiver, service_port: int) -> Agent:
    a = Agent(tmp, receiver.port, VRAMBUDGET_AGENT_SERVICE_ALLOW=f"http://127.0.0.1:{service_port}")
    a.start()
    return a


def _callback_for(
    receiver: Receiver, probe_id: str, timeout: float = 60
) -> tuple[dict[str, str], bytes]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hits = [(h, b) for h, b in receiver.requests if h.get("webhook-id") == f"msg_{probe_id}"]
        if hits:
            time.sleep(0.5)  # a duplicate would arrive now
            hits = [
                (h, b) for h, b in receiver.requests if h.get("webhook-id") == f"msg_{probe_id}"
            ]
            assert len(hits) == 1, f"{len(hits)} callbacks for {probe_id}"
            return hits[0]
        time.sleep(0.1)
    raise AssertionError(f"no callback for {probe_id}")


@pytest.mark.parametrize("spec", [INFER, TRAIN], ids=["inference", "training"])
def test_probe_to_comparison_to_signed_callback(
    tmp_path: Path, service: Service, receiver: Receiver, spec: dict[str, Any]
) -> None:
    agent = _agent(tmp_path, receiver, service.port)
    try:
        r = agent.submit(
            {
                "workload": spec,
                "iterations": 2,
                "service_url": service.url,
                "callback": {"url": f"http://127.0.0.1:{receiver.port}/hook"},
            }
        )
        assert r.status_code == 202, r.text
        probe_id = r.json()["id"]
        doc = agent.wait(probe_id)
        assert doc["status"] == "succeeded", doc
        # The estimate was fetched before the run (CPU host: no device).
        assert doc["estimate_error"] is None and doc["estimate"]["method"] == "analytic"
        headers, body = _callback_for(receiver, probe_id)
        verify(SECRET, headers, body, time.time())
        data = json.loads(body)["data"]
        comparison = data["comparison"]
        assert data["comparison_error"] is None and comparison is not None
        assert data["result"] == doc["result"]
        (tier,) = comparison["tiers"]
        assert [c["component"] for c in tier["components"]] == [c.value for c in Component]
        assert comparison["device"] == "cpu" and comparison["degraded"]
        quantities = {q["name"]: q for q in tier["quantities"]}
        # The resident bytes are the workload's exact tensor inventory on the CPU path.
        assert quantities["resident_after_load"]["verdict"] == "within"
        assert quantities["resident_after_load"]["difference_bytes"] == 0
        assert quantities["cuda_context"]["verdict"] == "not_applicable"
        # The service's comparison of the same report (the agent's GET) is identical.
        stored = agent.wait(probe_id)
        assert stored["comparison"] == comparison
        again = httpx.post(f"{service.url}/v1/comparisons", json=stored, timeout=30)
        assert again.status_code == 200, again.text
        assert again.json() == comparison
    finally:
        agent.stop()


def test_service_down_then_up_the_comparison_is_retried(tmp_path: Path, receiver: Receiver) -> None:
    port = free_port()
    agent = _agent(tmp_path, receiver, port)
    later = Service(port)
    try:
        r = agent.submit(
            {
                "workload": INFER,
                "iterations": 1,
                "service_url": f"http://127.0.0.1:{port}",
                "callback": {"url": f"http://127.0.0.1:{receiver.port}/hook"},
            }
        )
        probe_id = r.json()["id"]
        doc = agent.wait(probe_id)
        # The measurement is kept; the estimate could not be fetched; no callback yet.
        assert doc["status"] == "succeeded" and doc["result"] is not None
        assert "estimate" in doc["estimate_error"] and doc["comparison"] is None
        assert not [h for h, _ in receiver.requests if h.get("webhook-id") == f"msg_{probe_id}"]
        later.start()
        headers, body = _callback_for(receiver, probe_id, timeout=90)
        verify(SECRET, headers, body, time.time())
        data = json.loads(body)["data"]
        assert data["comparison"]["probe_id"] == probe_id
        assert data["result"] == doc["result"]
    finally:
        agent.stop()
        later.stop()


def test_service_url_off_the_allow_list_is_422(
    tmp_path: Path, receiver: Receiver, service: Service
) -> None:
    agent = _agent(tmp_path, receiver, service.port)
    try:
        r = agent.submit({"workload": INFER, "service_url": "http://127.0.0.1:1"})
        assert r.status_code == 422 and "$.service_url" in r.text
    finally:
        agent.stop()
