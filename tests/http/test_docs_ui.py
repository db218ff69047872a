"""``/schema`` on both apps: a page whose every asset is same-origin and served by the app, from
the vendored Swagger UI files whose hashes VENDORED.md records (tests/e2e/test_schema_page.py
renders it in headless Chromium with the network limited to 127.0.0.1)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings
from vrambudget.http.docs_ui import ASSETS, SWAGGER_UI_VERSION
from vrambudget.service.app import create_app

_REFERENCE = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


@pytest.fixture(scope="module", params=["service", "agent"])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient[Any]]:
    if request.param == "service":
        app = create_app()
    else:  # the agent's documentation is public; its operations keep the token
        data_dir = tmp_path_factory.mktemp("agent")
        app = create_agent_app(AgentSettings(data_dir=data_dir, tokens=(b"t",)))
    with TestClient(app) as c:
        yield c


def test_the_page_loads_only_same_origin_assets_and_each_is_served(
    client: TestClient[Any],
) -> None:
    for page in ("/schema", "/schema/swagger"):
        r = client.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "http://" not in r.text and "https://" not in r.text
        references = _REFERENCE.findall(r.text)
        assert all(u.startswith("/") and not u.startswith("//") for u in references)
        base = f"/schema/swagger-ui/{SWAGGER_UI_VERSION}"
        assert sorted(references) == sorted(
            [
                f"{base}/favicon-32x32.png",
                f"{base}/swagger-ui.css",
                f"{base}/swagger-ui-bundle.js",
                "/schema/openapi.json",  # the <noscript> link to the document
            ]
        )
        assert '"url": "/schema/openapi.json"' in r.text and '"validatorUrl": null' in r.text
    expected = {
        "swagger-ui-bundle.js": "text/javascript",
        "swagger-ui.css": "text/css",
        "favicon-32x32.png": "image/png",
        "LICENSE": "text/plain",
    }
    for name, media_type in expected.items():
        r = client.get(f"/schema/swagger-ui/{SWAGGER_UI_VERSION}/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"].split(";")[0] == media_type
        assert r.content == (ASSETS / name).read_bytes()
        assert "immutable" in r.headers["cache-control"]
    document = client.get("/schema/openapi.json")
    assert document.status_code == 200 and document.json()["paths"]


@pytest.mark.parametrize(
    "path",
    [
        "swagger-ui-bundle.js.map",  # not vendored
        "VENDORED.md",  # vendored, not served
        "package.json",
        "..%2F..%2Fdocs_ui.py",
    ],
)
def test_nothing_else_is_served(client: TestClient[Any], path: str) -> None:
    r = client.get(f"/schema/swagger-ui/{SWAGGER_UI_VERSION}/{path}")
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/problem+json")


def test_another_version_is_not_found(client: TestClient[Any]) -> None:
    r = client.get("/schema/swagger-ui/5.0.0/swagger-ui-bundle.js")
    assert r.status_code == 404 and SWAGGER_UI_VERSION in r.json()["detail"]


def test_the_vendored_files_are_the_recorded_release() -> None:
    record = (ASSETS / "VENDORED.md").read_text()
    package = json.loads((ASSETS / "package.json").read_text())
    assert package["name"] == "swagger-ui-dist" and package["license"] == "Apache-2.0"
    assert f"swagger-ui-dist {package['version']}" in record
    assert "Apache License" in (ASSETS / "LICENSE").read_text()
    hashes = dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", record, re.M))
    assert len(hashes) == 7
    for name, digest in hashes.items():
        assert hashlib.sha256((ASSETS / name).read_bytes()).hexdigest() == digest, name
    assert {p.name for p in ASSETS.iterdir()} == set(hashes) | {"VENDORED.md"}


def test_the_wheel_carries_the_assets() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"vrambudget.http" = ["static/swagger-ui/*"]' in pyproject
