"""Pictures from the service (vrambudget/service/pictures.py): ``POST /v1/budgets`` and
``POST /v1/comparisons`` answer SVG under ``format=svg`` or ``Accept: image/svg+xml``, JSON by
default; a bad ``format`` is a 422 naming the allowed values."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from tests.support.comparisons import parse_svg, svg_texts
from tests.support.reports import cuda_report
from vrambudget.core.budget_chart import render_budget_svg
from vrambudget.core.chart import render_comparison_svg
from vrambudget.core.comparison import Comparison
from vrambudget.core.result import Budget
from vrambudget.service.app import Settings, create_app

REQUEST = {
    "workloads": [
        {"kind": "inference", "model": {"source": "preset", "id": "llama-3.1-8b"}, "batch_size": 4}
    ],
    "device": {"source": "catalog", "id": "l4-24gb"},
}
SVG = "image/svg+xml"


@pytest.fixture(scope="module")
def client() -> Any:
    with TestClient(create_app(Settings())) as c:
        yield c


@pytest.fixture(scope="module")
def budget(client: Any) -> Budget:
    r = client.post("/v1/budgets", json=REQUEST)
    assert r.status_code == 200, r.text
    return msgspec.json.decode(r.content, type=Budget)


@pytest.mark.parametrize(
    ("query", "accept", "media"),
    [
        ("", None, "application/json"),  # the default is unchanged
        ("", "*/*", "application/json"),
        ("", "application/json", "application/json"),
        ("", "text/html", "application/json"),  # neither offered: JSON, not 406
        ("", SVG, SVG),
        ("", "image/*", SVG),
        ("", f"application/json;q=0.5, {SVG}", SVG),
        ("", f"application/json, {SVG};q=0.9", "application/json"),
        ("?format=svg", None, SVG),
        ("?format=svg", "application/json", SVG),  # the parameter wins over Accept
        ("?format=json", SVG, "application/json"),
    ],
)
def test_budget_media_type_follows_format_then_accept(
    client: Any, budget: Budget, query: str, accept: str | None, media: str
) -> None:
    headers = {"accept": accept} if accept is not None else {}
    r = client.post(f"/v1/budgets{query}", json=REQUEST, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].split(";")[0] == media
    if media == SVG:
        assert r.text == render_budget_svg(budget)  # the picture of the JSON answer
        assert svg_texts(parse_svg(r.text), "title") == [
            "Memory budget: llama-3.1-8b on NVIDIA L4 24GB"
        ]
    else:
        assert msgspec.json.decode(r.content, type=Budget) == budget


@pytest.mark.parametrize("value", ["png", "SVG", ""])
def test_a_bad_format_names_the_allowed_values(client: Any, value: str) -> None:
    r = client.post(f"/v1/budgets?format={value}", json=REQUEST)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["errors"] == [
        {"field": "$.format", "message": f"Invalid enum value '{value}'; allowed: 'json', 'svg'"}
    ]


def test_an_invalid_request_asking_for_svg_is_still_a_problem(client: Any) -> None:
    r = client.post("/v1/budgets?format=svg", json={"workloads": []})
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "$.workloads" in r.text


def test_a_trace_budget_is_drawn_too(client: Any) -> None:
    # The trace tier is optional here; its 501 stays a problem whatever was asked.
    r = client.post("/v1/budgets?format=svg", json={**REQUEST, "method": "trace"})
    if r.status_code != 200:
        assert r.headers["content-type"].startswith("application/problem+json")
        pytest.skip(f"no trace tier: {r.status_code}")
    assert r.headers["content-type"].startswith(SVG)
    assert svg_texts(parse_svg(r.text), "title")[0].startswith("Memory budget: llama-3.1-8b")


def test_comparison_as_svg(client: Any) -> None:
    body = msgspec.json.encode(cuda_report())
    r = client.post("/v1/comparisons", content=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    comparison = msgspec.json.decode(r.content, type=Comparison)
    for query, headers in (("?format=svg", {}), ("", {"accept": SVG})):
        r = client.post(f"/v1/comparisons{query}", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith(SVG)
        assert r.text == render_comparison_svg(comparison)
    assert comparison.model is not None
    title = svg_texts(parse_svg(r.text), "title")[0]
    assert title.startswith(f"Estimate vs measured: {comparison.model} on ")
    r = client.post("/v1/comparisons?format=gif", content=body)
    assert r.status_code == 422 and "allowed: 'json', 'svg'" in r.text
