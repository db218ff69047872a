"""Inputs that once answered 500 or were read wrongly, through the service: deep nesting,
rope-scaling overflow, duplicate keys, a text/plain cross-origin POST, malformed JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from litestar.testing import TestClient

from vrambudget.http.body import MAX_DEPTH, _depth
from vrambudget.service.app import create_app


@pytest.fixture(scope="module")
def client() -> Any:
    with TestClient(create_app()) as c:
        yield c


def _nested(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("depth", [MAX_DEPTH, 990, 1000, 100_000])
def test_deep_nesting_inside_config_is_400(client: Any, depth: int) -> None:
    body = (
        '{"workloads":[{"kind":"inference","model":{"source":"hf_config","config":'
        '{"model_type":"llama","x":' + _nested(depth) + "}}}]}"
    )
    r = client.post("/v1/budgets", content=body)
    assert r.status_code == 400, r.text
    assert "nested deeper than 64" in r.json()["detail"]


@pytest.mark.parametrize("path", ["/v1/comparisons", "/v1/fits", "/v1/budgets"])
def test_deep_nesting_at_the_top_level_is_400(client: Any, path: str) -> None:
    for body in (_nested(5000), '{"a":' + _nested(1000) + "}"):
        r = client.post(path, content=body)
        assert r.status_code == 400, r.text


def test_depth_ignores_brackets_in_strings() -> None:
    assert _depth(b'{"a": "[[[[{{{{\\"[[[", "b": [[1]]}') == 3
    assert _depth(b"1") == 0


def test_duplicate_keys_are_400_naming_the_key(client: Any) -> None:
    r = client.post("/v1/budgets", content=b'{"method":"trace","method":"analytic"}')
    assert r.status_code == 400
    assert "'method'" in r.json()["detail"] and "more than once" in r.json()["detail"]
    nested = b'{"workloads":[{"kind":"inference","kind":"training"}]}'
    r = client.post("/v1/budgets", content=nested)
    assert r.status_code == 400 and "'kind'" in r.json()["detail"]


def test_malformed_json_says_so_once(client: Any) -> None:
    for body in (b"x", b"{", b'{"a":}'):
        detail = client.post("/v1/budgets", content=body).json()["detail"]
        assert detail.startswith("JSON is malformed: ") and detail.count("malformed") == 1


def test_a_cross_origin_simple_post_does_not_go_through(client: Any) -> None:
    body = json.dumps({"workloads": [{"kind": "inference", "model": {"source": "preset"}}]})
    for path in ("/v1/budgets", "/v1/fits", "/v1/comparisons"):
        r = client.post(path, content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 415, r.text


def test_rope_scaling_overflow_is_a_422_naming_the_field(client: Any) -> None:
    config = client.get("/v1/models/llama-3.1-8b").json()["preset"]["config"]
    config["rope_scaling"] = {"rope_type": "linear", "factor": 1e308}
    body = {
        "workloads": [{"kind": "llm_serving", "model": {"source": "hf_config", "config": config}}],
        "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
    }
    r = client.post("/v1/budgets", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "$.workloads[0].model.config.rope_scaling.factor"


def test_a_driver_version_that_is_no_driver_is_a_422_naming_the_field(client: Any) -> None:
    """`software.driver_version` is an NVIDIA driver as nvidia-smi prints it: a CUDA version
    (nvidia-smi's header prints one beside it) or a word is refused with the field and the
    pattern; a Windows-style two-part driver is accepted."""
    body = {
        "workloads": [{"kind": "llm_serving", "model": {"source": "preset", "id": "qwen3-8b"}}],
        "device": {"source": "catalog", "id": "a100-sxm4-40gb"},
    }
    for bad in ("12.4", "0.0", "R535", "535-1", "1e9"):
        r = client.post("/v1/budgets", json={**body, "software": {"driver_version": bad}})
        assert r.status_code == 422, (bad, r.text)
        err = r.json()["errors"][0]
        assert err["field"] == "$.software.driver_version", err
        assert "[1-9][0-9]{2}" in r.text
    for good in ("535.247.01", "560.94", "580"):
        r = client.post("/v1/budgets", json={**body, "software": {"driver_version": good}})
        assert r.status_code == 200, (good, r.text)
