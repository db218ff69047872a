"""The agent's CORS: off unless its owner lists origins (it is no public API)."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings, AgentSettingsError

PREFLIGHT = {
    "origin": "https://console.example.com",
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type",
}


def test_cors_is_off_by_default(tmp_path: Path) -> None:
    assert AgentSettings.from_env({}).cors_origins == ()
    with TestClient(create_agent_app(AgentSettings(data_dir=tmp_path))) as client:
        r = client.options("/v1/probes", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in r.headers
        r = client.get("/healthz", headers={"origin": "https://console.example.com"})
        assert "access-control-allow-origin" not in r.headers


def test_listed_origins_may_call_it_with_a_token(tmp_path: Path) -> None:
    settings = AgentSettings.from_env(
        {
            "VRAMBUDGET_AGENT_CORS_ORIGINS": "https://console.example.com",
            "VRAMBUDGET_AGENT_DATA_DIR": str(tmp_path),
            "VRAMBUDGET_AGENT_TOKENS": "t",
        }
    )
    assert settings.cors_origins == ("https://console.example.com",)
    with TestClient(create_agent_app(settings)) as client:
        r = client.options("/v1/probes", headers=PREFLIGHT)
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == "https://console.example.com"
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE"
        assert "authorization" in r.headers["access-control-allow-headers"].split(", ")
        r = client.get(
            "/v1/probes",
            headers={"origin": "https://console.example.com", "authorization": "Bearer t"},
        )
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://console.example.com"
        assert "Location" in r.headers["access-control-expose-headers"]
        assert r.headers["vary"] == "Origin"
        r = client.options("/v1/probes", headers={**PREFLIGHT, "origin": "https://x.example"})
        assert r.status_code == 403 and "VRAMBUDGET_AGENT_CORS_ORIGINS" in r.json()["detail"]


def test_a_malformed_origin_stops_the_agent() -> None:
    with pytest.raises(AgentSettingsError, match="VRAMBUDGET_AGENT_CORS_ORIGINS: 'console'"):
        AgentSettings.from_env({"VRAMBUDGET_AGENT_CORS_ORIGINS": "console"})
