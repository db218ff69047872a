"""The OpenAPI document's request examples: every operation that takes a body or a path
parameter has named examples, and each one, sent to the app as "Try it out" sends it, is
answered 2xx (an example the app rejects would teach the wrong request)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from litestar.testing import TestClient

from vrambudget.service.app import create_app
from vrambudget.service.examples import install_examples
from vrambudget.service.openapi import openapi_document


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient[Any]]:
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture(scope="module")
def document(client: TestClient[Any]) -> dict[str, Any]:
    served: dict[str, Any] = client.get("/schema/openapi.json").json()
    return served


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if isinstance(operation, dict) and method in {"get", "post", "put", "delete"}:
                yield path, method, operation


def test_every_body_and_path_parameter_has_named_examples(document: dict[str, Any]) -> None:
    missing = []
    for path, method, operation in _operations(document):
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None and not body.get("examples"):
            missing.append(f"{method.upper()} {path} body")
        for parameter in operation.get("parameters", ()):
            if parameter["in"] == "path" and not parameter.get("examples"):
                missing.append(f"{method.upper()} {path} {parameter['name']}")
    assert not missing, f"operations without examples: {missing}"
    for _, _, operation in _operations(document):
        for example in (
            operation.get("requestBody", {})
            .get("content", {})
            .get("application/json", {})
            .get("examples", {})
            .values()
        ):
            assert example["summary"] and "value" in example


def _examples(document: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    found = []
    for path, method, operation in _operations(document):
        body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
        for name, example in body.get("examples", {}).items():
            found.append((method, path, name, example["value"]))
        for parameter in operation.get("parameters", ()):
            for name, example in parameter.get("examples", {}).items():
                url = path.replace("{" + parameter["name"] + "}", example["value"])
                found.append((method, url, name, None))
    return found


def test_each_example_is_answered_2xx(client: TestClient[Any], document: dict[str, Any]) -> None:
    examples = _examples(document)
    assert len(examples) >= 11  # 4 budgets, 2 fits, 1 cluster, 1 comparison, 3 parameters
    failed = []
    for method, url, name, body in examples:
        r = client.request(method.upper(), url, json=body)
        if not 200 <= r.status_code < 300:
            failed.append(f"{method.upper()} {url} {name!r}: {r.status_code} {r.text[:300]}")
    assert not failed, "\n".join(failed)


def test_the_fit_example_names_a_model_and_fits_somewhere(
    client: TestClient[Any], document: dict[str, Any]
) -> None:
    """The generated FitRequest example used to have ``"model": null`` (a 422 on "Try it")."""
    examples = document["paths"]["/v1/fits"]["post"]["requestBody"]["content"]["application/json"][
        "examples"
    ]
    first = next(iter(examples.values()))["value"]
    assert first["workloads"][0]["model"] == {"source": "preset", "id": "llama-3.1-70b"}
    answer = client.post("/v1/fits", json=first).json()
    assert any(layout["fits"] for gpu in answer["gpus"] for layout in gpu["layouts"])


def test_an_invalid_example_fails_the_document(
    client: TestClient[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import vrambudget.service.examples as examples

    broken = examples.BODY_EXAMPLES()
    broken["/v1/fits"]["catalog"]["value"]["workloads"][0]["model"] = None
    monkeypatch.setattr(examples, "BODY_EXAMPLES", lambda: broken)
    document = copy.deepcopy(openapi_document(client.app))
    with pytest.raises(RuntimeError, match=r"/v1/fits 'catalog' is invalid"):
        install_examples(document)
