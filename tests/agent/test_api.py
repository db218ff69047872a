"""The agent app in-process: the HTTP contract details that do not need a probe to run
(tests/e2e/test_agent.py runs probes in a real agent process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from tests.support.workloads import INFER
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings


def test_no_tokens_configured_means_401_everywhere_but_healthz(tmp_path: Path) -> None:
    app = create_agent_app(AgentSettings(data_dir=tmp_path))
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        r = client.get("/v1/probes", headers={"Authorization": "Bearer "})
        assert r.status_code == 401


def test_malformed_json_is_400_and_unknown_fields_422(tmp_path: Path) -> None:
    app = create_agent_app(AgentSettings(data_dir=tmp_path, tokens=(b"t",)))
    auth = {"Authorization": "Bearer t"}
    with TestClient(app) as client:
        r = client.post("/v1/probes", content=b"{", headers=auth)
        assert r.status_code == 400
        r = client.post(
            "/v1/probes",
            json={
                "workload": {"kind": "inference", "model": {"source": "preset", "id": "gpt2"}},
                "iterationz": 3,
            },
            headers=auth,
        )
        assert r.status_code == 422 and "iterationz" in r.text
        assert client.get("/v1/probes/nope", headers=auth).status_code == 404
        assert client.get("/v1/probes", params={"limit": 0}, headers=auth).status_code == 422


def test_a_probe_cancelled_while_its_estimate_is_fetched_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimate fetch (up to its timeout) ran before the probe was in ``st.running``: a
    DELETE then found a running probe with no process, did nothing, and the probe ran."""
    import threading
    import time

    from litestar.testing import TestClient

    import vrambudget.agent.worker as agent_worker
    from vrambudget.agent.api import create_agent_app
    from vrambudget.agent.settings import AgentSettings

    entered, release = threading.Event(), threading.Event()

    def slow_fetch(*_: object, **__: object) -> tuple[None, str]:
        entered.set()
        release.wait(30)
        return None, "estimate: service slow"

    monkeypatch.setattr(agent_worker, "fetch_estimate", slow_fetch)
    settings = AgentSettings(
        data_dir=tmp_path, tokens=(b"t",), service_allow_list=("http://127.0.0.1:9",)
    )
    auth = {"Authorization": "Bearer t"}
    with TestClient(create_agent_app(settings)) as client:
        r = client.post(
            "/v1/probes",
            json={"workload": INFER, "iterations": 1, "service_url": "http://127.0.0.1:9"},
            headers=auth,
        )
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
