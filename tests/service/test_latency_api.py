"""/v1/fits with a latency target over HTTP: the estimate in the answer, and bad targets
answered 4xx problem+json naming the field and the allowed range."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from vrambudget.service.app import Settings, create_app

LLAMA = {"source": "preset", "id": "llama-3.1-8b"}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings())) as c:
        yield c


def test_fit_answers_a_latency_estimate(client):
    body = {
        "workloads": [{"kind": "inference", "model": LLAMA}],
        "devices": [{"source": "catalog", "id": "l40s-48gb"}],
        "latency_target": {"time_per_output_token_ms": 30},
        "prices": {"l40s-48gb": 0.9},
    }
    r = client.post("/v1/fits", json=body)
    assert r.status_code == 200, r.text
    est = r.json()["gpus"][0]["layouts"][0]["latency"]
    assert est["memory_bandwidth_bytes_per_s"] == 864 * 10**9
    assert est["time_per_output_token_ms"] <= 30
    assert r.json()["cost_ranking"][0]["gpu_id"] == "l40s-48gb"


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ({"time_per_output_token_ms": -1}, "time_per_output_token_ms"),
        ({"time_to_first_token_ms": 0}, "time_to_first_token_ms"),
        ({"mbu": 2}, "mbu"),
    ],
)
def test_bad_target_is_a_4xx_naming_the_field(client, target, needle):
    body = {"workloads": [{"kind": "inference", "model": LLAMA}], "latency_target": target}
    r = client.post("/v1/fits", json=body)
    assert 400 <= r.status_code < 500
    assert r.headers["content-type"].startswith("application/problem+json")
    assert needle in r.text


def test_latency_target_of_a_training_workload_is_a_4xx(client):
    body = {
        "workloads": [{"kind": "training", "model": LLAMA}],
        "latency_target": {"time_per_output_token_ms": 20},
    }
    r = client.post("/v1/fits", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert "latency_target" in r.text and "inference and llm_serving" in r.text
