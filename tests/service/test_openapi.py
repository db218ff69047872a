"""HTTP behaviour through Litestar's test client: answers, problem+json errors, limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import ROOT
from vrambudget.service.app import create_app
from vrambudget.service.openapi import openapi_document


def _served() -> dict[str, Any]:
    from litestar.testing import TestClient

    with TestClient(create_app()) as client:
        r = client.get("/schema/openapi.json")
        assert r.status_code == 200
        return r.json()


def test_committed_openapi_is_the_served_one():
    """What the app serves, not a document generated beside it, is the published contract."""
    committed = json.loads((ROOT / "openapi" / "service.json").read_text())
    served = _served()
    assert committed == served, "run: .venv/bin/vrambudget openapi > openapi/service.json"
    assert served == json.loads(json.dumps(openapi_document(create_app())))


def test_every_ref_resolves_and_bodies_are_required():
    served = _served()
    schemas = served["components"]["schemas"]
    found: set[str] = set()
    stack: list[Any] = [served]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                found.add(_name(ref))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    assert "TierComparison" in found
    assert found <= set(schemas), sorted(found - set(schemas))
    for path, name in (
        ("/v1/budgets", "BudgetRequest"),
        ("/v1/fits", "FitRequest"),
        ("/v1/comparisons", "ProbeResource"),
    ):
        operation = served["paths"][path]["post"]
        body = operation["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"]["$ref"].endswith("/" + name)
        assert {"400", "415", "422", "500"} <= set(operation["responses"])
        assert "X-Unsafe-Integers" in operation["responses"]["200"]["headers"]
    for item in served["paths"].values():
        for operation in item.values():
            assert "500" in operation["responses"]


REQUESTS = ("BudgetRequest", "FitRequest")

PREFIX = "#/components/schemas/"


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    document = json.loads(json.dumps(openapi_document(create_app())))
    return document["components"]["schemas"]


def _name(ref: str) -> str:
    assert ref.startswith(PREFIX), ref
    return ref[len(PREFIX) :]


def _refs(node: Any) -> set[str]:
    """Component names referenced by a schema node, following anyOf/allOf/oneOf/items/..."""
    found: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            ref = current.get("$ref")
            if isinstance(ref, str):
                found.add(_name(ref))
            for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
                stack.extend(current.get(key, ()))
            for key in ("items", "additionalProperties", "not", "if", "then", "else"):
                if isinstance(current.get(key), dict):
                    stack.append(current[key])
            stack.extend(current.get("properties", {}).values())
            stack.extend(current.get("$defs", {}).values())
    return found


def _reachable(schemas: dict[str, Any]) -> list[str]:
    seen: set[str] = set()
    todo = list(REQUESTS)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        assert name in schemas, f"dangling $ref to {name}"
        seen.add(name)
        todo.extend(_refs(schemas[name]) - seen)
    return sorted(seen)


def _tag_fields(schemas: dict[str, Any]) -> set[tuple[str, str]]:
    """(component, property) pairs that are the tag of a tagged union, from discriminators."""
    tags: set[tuple[str, str]] = set()
    stack: list[Any] = list(schemas.values())
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            discriminator = current.get("discriminator")
            if isinstance(discriminator, dict):
                prop = discriminator["propertyName"]
                for ref in discriminator.get("mapping", {}).values():
                    tags.add((_name(ref), prop))
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return tags


def test_request_components_are_found(schemas):
    reachable = _reachable(schemas)
    # A sanity check of the walk itself: nested unions, items and optional refs are followed.
    for name in (
        "InferenceWorkload",
        "TrainingWorkload",
        "GenericWorkload",
        "SizedItem",
        "CacheItem",
        "HFConfig",
        "HFTextConfig",
        "HFVisionConfig",
        "MoESpec",
        "QLoRA",
        "BitsAndBytes4bit",
        "Adafactor",
        "CustomDevice",
        "Headroom",
        "Parallelism",
    ):
        assert name in reachable


def test_tag_fields_come_from_discriminators(schemas):
    tags = _tag_fields(schemas)
    assert ("PresetModel", "source") in tags
    assert ("InferenceWorkload", "kind") in tags
    assert ("GPTQ", "scheme") in tags
    assert ("AdamW", "name") in tags
    # Real fields that share a tag's name are not tags.
    assert ("SizedItem", "name") not in tags
    assert ("CustomDevice", "name") not in tags
    assert ("DimensionsModel", "kind") not in tags


def test_every_request_property_has_a_description(schemas):
    tags = _tag_fields(schemas)
    missing = []
    checked = 0
    for name in _reachable(schemas):
        for prop, schema in schemas[name].get("properties", {}).items():
            if (name, prop) in tags:
                continue
            checked += 1
            description = schema.get("description")
            if not (isinstance(description, str) and description.strip()):
                missing.append(f"{name}.{prop}")
    assert checked > 100
    assert not missing, "undocumented request fields: " + ", ".join(missing)
