"""The agent's OpenAPI request examples: each one submitted to the agent (a CPU host here, as
"Try it out" would send it) is accepted with 202, can be read back and cancelled."""

from __future__ import annotations

from pathlib import Path

from litestar.testing import TestClient

from vrambudget.agent.api import create_agent_app
from vrambudget.agent.examples import PROBE_EXAMPLES
from vrambudget.agent.settings import AgentSettings


def test_each_probe_example_is_accepted(tmp_path: Path) -> None:
    auth = {"Authorization": "Bearer t"}
    app = create_agent_app(AgentSettings(data_dir=tmp_path, tokens=(b"t",)))
    with TestClient(app) as client:
        document = client.get("/schema/openapi.json").json()  # public, as the page is
        body = document["paths"]["/v1/probes"]["post"]["requestBody"]["content"]
        published = body["application/json"]["examples"]
        assert published == PROBE_EXAMPLES and len(published) == 3
        for name, example in published.items():
            r = client.post("/v1/probes", json=example["value"], headers=auth)
            assert r.status_code == 202, (name, r.text)
            location = r.headers["location"]
            read = client.get(location, headers=auth)
            assert read.status_code == 200
            assert (
                read.json()["request"]["workload"]["kind"] == example["value"]["workload"]["kind"]
            )
            assert client.delete(location, headers=auth).status_code in {200, 202, 204}
