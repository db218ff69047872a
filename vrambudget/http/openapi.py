"""OpenAPI assembly shared by both apps: Litestar generates the paths; the request and response
schemas are replaced by msgspec's own JSON Schema of the same types, because that is exactly
what msgspec validates (constraints, tagged-union discriminators, and ``additionalProperties:
false`` for the structs that forbid unknown fields -- which Litestar's generator omits)."""

from __future__ import annotations

from typing import Any

from vrambudget.core.spec import SCHEMA_RULES

__all__ = ["PROBLEM_CONTENT", "install_components", "prometheus_text"]

PROBLEM_CONTENT = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


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


def prometheus_text(document: dict[str, Any]) -> None:
    """``GET /metrics`` answers Prometheus' text format, not JSON."""
    metrics = document.get("paths", {}).get("/metrics", {}).get("get")
    if metrics:
        metrics["responses"]["200"]["content"] = {
            "text/plain": {
                "schema": {"type": "string"},
                "x-format": "Prometheus text exposition format 0.0.4",
            }
        }
