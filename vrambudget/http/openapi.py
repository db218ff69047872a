"""OpenAPI assembly shared by both apps: Litestar generates the paths; the request and response
schemas are replaced by msgspec's own JSON Schema of the same types, because that is exactly
what msgspec validates (constraints, tagged-union discriminators, and ``additionalProperties:
false`` for the structs that forbid unknown fields -- which Litestar's generator omits)."""

from __future__ import annotations

import json
from typing import Any

from vrambudget.core.probe_report import SCHEMA_RULES as PROBE_RULES
from vrambudget.core.spec import SCHEMA_RULES

__all__ = ["PROBLEM_CONTENT", "common_responses", "install_components", "prometheus_text"]

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
    for name, rules in {**SCHEMA_RULES, **PROBE_RULES}.items():
        if name in components:
            components[name] = {**components[name], "allOf": rules}
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(components)
    used: set[str] = set()
    _refs(document.get("paths", {}), used)
    _refs(components, used)
    for _ in range(len(schemas)):  # what the used schemas refer to, to a fixed point
        before = len(used)
        _refs([schemas[n] for n in used if n in schemas], used)
        if len(used) == before:
            break
    for name in list(schemas):
        if name not in used:
            del schemas[name]
    missing = used - set(schemas)
    if missing:
        raise RuntimeError(f"OpenAPI references without schemas: {sorted(missing)}")
    for schema in schemas.values():
        _for_generators(schema)
    document["x-schemas-from"] = "msgspec"


def _for_generators(node: Any) -> None:
    """Two spellings of msgspec's that client generators cannot read, rewritten to say the same:

    - a fixed-length tuple, ``prefixItems`` with ``items: false``: ``maxItems`` (always given
      with it) already forbids more items, so ``items`` goes (openapi-python-client rejects a
      boolean schema);
    - a property whose value is a tagged union of structs, with an object ``default``
      (``TrainingWorkload.method``, ``.optimizer``): a default is an annotation, not a
      constraint, and openapi-python-client drops the whole owning schema over it. The default
      moves into the property's description, where a reader still finds it.
    """
    if isinstance(node, list):
        for item in node:
            _for_generators(item)
        return
    if not isinstance(node, dict):
        return
    prefix = node.get("prefixItems")
    if (
        node.get("items") is False
        and isinstance(prefix, list)
        and node.get("maxItems") == len(prefix)
    ):
        del node["items"]
    default = node.get("default")
    members = node.get("anyOf", node.get("oneOf"))
    if (
        isinstance(default, dict)
        and isinstance(members, list)
        and all(isinstance(m, dict) and "$ref" in m for m in members)
    ):
        del node["default"]
        text = node.get("description", "")
        node["description"] = (
            f"{text}{' ' if text else ''}Default: `{json.dumps(default, sort_keys=True)}`."
        )
    for value in node.values():
        _for_generators(value)


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


def common_responses(document: dict[str, Any]) -> None:
    """The answers every operation may give whatever its handler (:mod:`vrambudget.http.logs`,
    :mod:`vrambudget.http.body`): 500 with the request id on any operation; on one with a
    request body, 400 (malformed JSON, a duplicate key, nesting deeper than the limit) and 415
    (a Content-Type other than JSON). A 200 JSON answer holding integers beyond 2^53 says how
    many in ``X-Unsafe-Integers``."""
    for item in document.get("paths", {}).values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            responses = operation.setdefault("responses", {})
            if _litestar_400(responses.get("400")):
                # Litestar documents its own validation body; both apps answer problem+json
                # (vrambudget.http.problems), 422 for an invalid parameter.
                responses["400"] = {"description": "Bad request", "content": PROBLEM_CONTENT}
            if "requestBody" in operation:
                responses["400"] = {
                    "description": "Malformed JSON, a key twice in one object, or nesting "
                    "deeper than 64 arrays / objects",
                    "content": PROBLEM_CONTENT,
                }
                responses["415"] = {
                    "description": "A body whose Content-Type is not JSON (a missing one is "
                    "read as JSON)",
                    "content": PROBLEM_CONTENT,
                }
                ok = responses.get("200")
                if isinstance(ok, dict) and "application/json" in ok.get("content", {}):
                    ok.setdefault("headers", {})["X-Unsafe-Integers"] = {
                        "description": "Present when the answer holds integers beyond 2^53 "
                        "(JavaScript numbers lose them): how many. The body is unchanged; "
                        "read it with a big-integer-aware parser.",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1},
                    }
            if operation.get("parameters"):
                responses.setdefault(
                    "422",
                    {
                        "description": "Invalid parameter (the field path is named)",
                        "content": PROBLEM_CONTENT,
                    },
                )
            responses.setdefault(
                "500",
                {
                    "description": "Internal error, logged with its traceback under the "
                    "`request_id` the body carries (also the `X-Request-ID` header)",
                    "content": PROBLEM_CONTENT,
                },
            )


def _litestar_400(response: Any) -> bool:
    if not isinstance(response, dict):
        return False
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return isinstance(schema, dict) and schema.get("description") == "Validation Exception"
