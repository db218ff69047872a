"""The agent app in-process: committed OpenAPI, settings, and the HTTP contract details that do
not need a probe to run (tests/test_agent_e2e.py runs probes in a real agent process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from litestar.testing import TestClient

from vrambudget.agent.__main__ import openapi_document
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings, AgentSettingsError

ROOT = Path(__file__).resolve().parents[1]


def test_committed_openapi_matches_the_agent() -> None:
    committed = json.loads((ROOT / "openapi" / "agent.json").read_text())
    generated = json.loads(json.dumps(openapi_document()))
    assert committed == generated, "run: .venv/bin/python -m vrambudget.agent openapi > openapi/agent.json"


def test_openapi_says_every_endpoint_but_healthz_needs_the_token() -> None:
    doc = openapi_document()
    for path, item in doc["paths"].items():
        for op in item.values():
            assert op["security"] == ([] if path == "/healthz" else [{"bearer": []}])
    assert "429" in doc["paths"]["/v1/probes"]["post"]["responses"]


def test_settings_from_env(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("# comment\nfrom-file\n")
    s = AgentSettings.from_env({
        "VRAMBUDGET_AGENT_TOKENS": "a, b", "VRAMBUDGET_AGENT_TOKEN_FILE": str(token_file),
        "VRAMBUDGET_AGENT_ENTRY_POINTS": "x=pkg.mod:fn", "VRAMBUDGET_AGENT_PORT": "9000",
        "VRAMBUDGET_AGENT_CALLBACK_ALLOW": "https://hooks.example.com"})
    assert s.tokens == (b"a", b"b", b"from-file")
    assert s.entry_points == {"x": "pkg.mod:fn"}
    assert s.port == 9000 and s.callback_allow_list == ("https://hooks.example.com",)


@pytest.mark.parametrize(("env", "message"), [
    ({"VRAMBUDGET_AGENT_PORT": "70000"}, "VRAMBUDGET_AGENT_PORT must be in 0 .. 65535"),
    ({"VRAMBUDGET_AGENT_PORT": "x"}, "VRAMBUDGET_AGENT_PORT must be a number"),
    ({"VRAMBUDGET_AGENT_ENTRY_POINTS": "os.system"}, "is not name=module:function"),
    ({"VRAMBUDGET_AGENT_MAX_QUEUE": "0"}, "VRAMBUDGET_AGENT_MAX_QUEUE must be in 1 .. 10000"),
])
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(AgentSettingsError, match=message):
        AgentSettings.from_env(env)


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
        r = client.post("/v1/probes", json={"workload": {"kind": "inference", "model": {
            "source": "preset", "id": "gpt2"}}, "iterationz": 3}, headers=auth)
        assert r.status_code == 422 and "iterationz" in r.text
        assert client.get("/v1/probes/nope", headers=auth).status_code == 404
        assert client.get("/v1/probes", params={"limit": 0}, headers=auth).status_code == 422


def test_cli_prints_the_agent_openapi(capsys: pytest.CaptureFixture[str]) -> None:
    from vrambudget.cli.main import main

    assert main(["agent", "openapi"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(
        (ROOT / "openapi" / "agent.json").read_text())
