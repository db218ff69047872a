"""The agent's OpenAPI document: the committed file is the one the app serves, and the auth it
declares."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from litestar.testing import TestClient

from tests.support import ROOT
from vrambudget.agent.__main__ import openapi_document
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings


def _served(tmp_path: Path) -> dict[str, Any]:
    app = create_agent_app(AgentSettings(data_dir=tmp_path, tokens=(b"t",)))
    with TestClient(app) as client:
        r = client.get("/schema/openapi.json", headers={"Authorization": "Bearer t"})
        assert r.status_code == 200, r.text
        return r.json()


def test_committed_openapi_is_the_served_one(tmp_path: Path) -> None:
    committed = json.loads((ROOT / "openapi" / "agent.json").read_text())
    served = _served(tmp_path)
    assert committed == served, "run: .venv/bin/vrambudget agent openapi > openapi/agent.json"
    assert served == json.loads(json.dumps(openapi_document()))


def test_served_openapi_has_the_probe_body_and_the_security_scheme(tmp_path: Path) -> None:
    served = _served(tmp_path)
    post = served["paths"]["/v1/probes"]["post"]
    assert post["requestBody"]["required"] is True
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ProbeRequest"
    assert served["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert {"400", "401", "413", "415", "422", "429", "500"} <= set(post["responses"])


def test_openapi_says_every_endpoint_but_the_public_ones_needs_the_token() -> None:
    doc = openapi_document()
    for path, item in doc["paths"].items():
        for op in item.values():
            public = path in ("/healthz", "/readyz")
            assert op["security"] == ([] if public else [{"bearer": []}])
            assert ("401" in op["responses"]) is not public
    assert "429" in doc["paths"]["/v1/probes"]["post"]["responses"]
