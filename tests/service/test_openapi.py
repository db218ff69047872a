"""HTTP behaviour through Litestar's test client: answers, problem+json errors, limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import ROOT
from vrambudget.service.app import create_app
from vrambudget.service.openapi import openapi_document


def test_committed_openapi_matches_the_app():
    committed = json.loads((ROOT / "openapi" / "service.json").read_text())
    generated = json.loads(json.dumps(openapi_document(create_app())))
    assert committed == generated, "run: .venv/bin/vrambudget openapi > openapi/service.json"


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
