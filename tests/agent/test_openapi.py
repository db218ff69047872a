"""The agent's OpenAPI document: the committed file matches the app, and the auth it declares."""

from __future__ import annotations

import json

from tests.support import ROOT
from vrambudget.agent.__main__ import openapi_document


def test_committed_openapi_matches_the_agent() -> None:
    committed = json.loads((ROOT / "openapi" / "agent.json").read_text())
    generated = json.loads(json.dumps(openapi_document()))
    assert committed == generated, (
        "run: .venv/bin/python -m vrambudget.agent openapi > openapi/agent.json"
    )


def test_openapi_says_every_endpoint_but_healthz_needs_the_token() -> None:
    doc = openapi_document()
    for path, item in doc["paths"].items():
        for op in item.values():
            assert op["security"] == ([] if path == "/healthz" else [{"bearer": []}])
    assert "429" in doc["paths"]["/v1/probes"]["post"]["responses"]
