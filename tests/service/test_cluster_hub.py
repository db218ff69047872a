"""A cluster request whose model comes from the Hub: the service resolves it before the worker
renders (the same resolutions as a budget), and a repository the Hub does not hold is a 422
naming the field inside the request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.hub.fake_hub import FakeHub
from tests.service.test_hub_models import TOKEN, _local_only, hub  # noqa: F401 (fixtures)
from vrambudget.hub import HubSettings
from vrambudget.service.app import Settings, create_app


def body(model_id: str) -> dict[str, Any]:
    return {
        "source": {
            "from": "budget",
            "request": {
                "workloads": [{"kind": "inference", "model": {"source": "hub", "id": model_id}}],
                "device": {"source": "catalog", "id": "l4-24gb"},
            },
        }
    }


def test_hub_model_is_resolved_and_rendered(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    server, counts = request.getfixturevalue("hub")
    assert isinstance(server, FakeHub)
    settings = Settings(
        hub=HubSettings(endpoint=server.url, token=TOKEN, cache_dir=str(tmp_path), timeout_s=5)
    )
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/cluster-requests", json=body("org/tiny-qwen2"))
        assert r.status_code == 200, r.text
        a = r.json()
        # one process: 2 GiB resident + the whole (tiny) checkpoint, its stored bytes (bf16)
        host = 2 * (1 << 30) + counts["org/tiny-qwen2"] * 2
        memory = host + (1 << 30) + 2 * (1 << 30)
        assert a["pod"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == (
            f"{-(-memory // (1 << 20))}Mi"
        )
        r = client.post("/v1/cluster-requests", json=body("org/absent"))
        assert r.status_code == 422, r.text
        fields = [e["field"] for e in r.json()["errors"]]
        assert fields == ["$.source.request.workloads[0].model.id"], r.text
