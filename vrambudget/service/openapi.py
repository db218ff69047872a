"""The published OpenAPI document: Litestar generates the paths; the request and response
schemas are replaced by msgspec's own JSON Schema of the same types, because that is exactly
what msgspec validates (constraints, tagged-union discriminators, and ``additionalProperties:
false`` for the structs that forbid unknown fields -- which Litestar's generator omits)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin

from vrambudget.core.catalog import GPU, ModelPreset
from vrambudget.core.fit import FitRequest, FitResponse
from vrambudget.core.result import Budget
from vrambudget.core.spec import SCHEMA_RULES, BudgetRequest

from .problems import Problem

__all__ = ["WIRE_TYPES", "install_components", "openapi_document", "patch_openapi"]


def _wire_types() -> list[Any]:
    from .app import Health, ModelDetail, ModelSummary, Ready

    return [BudgetRequest, Budget, FitRequest, FitResponse, GPU, ModelPreset, ModelSummary,
            ModelDetail, Problem, Health, Ready]


WIRE_TYPES = _wire_types


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref.rsplit("/", 1)[-1])
        for v in node.values():
            _refs(v, found)
    elif isinstance(node, list):
        for v in node:
            _refs(v, found)


def install_components(document: dict[str, Any], components: dict[str, Any]) -> None:
    """Put msgspec's schemas (with the cross-field rules) into ``document``, drop the ones no
    path uses, and fail on a reference without a schema. Shared with the agent's document."""
    for name, rules in SCHEMA_RULES.items():
        if name in components:
            components[name] = {**components[name], "allOf": rules}
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(components)
    used: set[str] = set()
    _refs(document.get("paths", {}), used)
    _refs(components, used)
    for name in list(schemas):
        if name not in used:
            del schemas[name]
    missing = used - set(schemas)
    if missing:
        raise RuntimeError(f"OpenAPI references without schemas: {sorted(missing)}")
    document["x-schemas-from"] = "msgspec"


def patch_openapi(app: Litestar) -> None:
    plugin = app.plugins.get(OpenAPIPlugin)
    document = plugin.provide_openapi_schema()  # cached dict, served as /schema/openapi.json
    if document.get("x-schemas-from") == "msgspec":
        return
    _, components = msgspec.json.schema_components(
        _wire_types(), ref_template="#/components/schemas/{name}")
    for item in document.get("paths", {}).values():
        for operation in item.values():
            responses = operation.get("responses", {}) if isinstance(operation, dict) else {}
            if "422" in responses and "400" in responses:
                # Litestar documents its own 400 validation body; this app answers 400 only
                # for malformed JSON and 422 for invalid values, both problem+json.
                responses["400"] = {"description": "Malformed JSON", "content": {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}
    busy = document["paths"]["/v1/budgets"]["post"]["responses"].get("503")
    if busy is not None:  # ResponseSpec cannot declare headers
        busy["headers"] = {"Retry-After": {
            "description": "Seconds after which a retry is likely to find a free trace slot "
                           "(sent with `.../problems/trace-busy`).",
            "required": False, "schema": {"type": "integer", "minimum": 1}}}
    bodies = {"/v1/budgets": "BudgetRequest", "/v1/fits": "FitRequest"}
    for path, name in bodies.items():  # the handlers decode the raw body strictly themselves
        document["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    metrics = document["paths"].get("/metrics", {}).get("get")
    if metrics:
        metrics["responses"]["200"]["content"] = {
            "text/plain": {"schema": {"type": "string"},
                           "x-format": "Prometheus text exposition format 0.0.4"}}
    install_components(document, components)


def openapi_document(app: Litestar) -> dict[str, Any]:
    patch_openapi(app)
    return app.plugins.get(OpenAPIPlugin).provide_openapi_schema()
