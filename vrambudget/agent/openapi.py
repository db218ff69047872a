"""The agent's published OpenAPI document: paths from Litestar, schemas from msgspec (what the
handlers actually validate), as for the service (:mod:`vrambudget.http.openapi`)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin

from vrambudget.http.openapi import (
    PROBLEM_CONTENT,
    common_responses,
    install_components,
    prometheus_text,
)
from vrambudget.http.problems import Problem

from .examples import install_examples

__all__ = ["PUBLIC", "agent_openapi_document"]

PUBLIC = frozenset({"/healthz", "/readyz"})
"""Paths the bearer guard lets through (their handlers' ``opt={"public": True}``)."""


def agent_openapi_document(app: Litestar) -> dict[str, Any]:
    from vrambudget.core.hf_config import HFConfig

    from .handlers import DeviceReport, Health, ProbePage
    from .spec import ProbeRequest, ProbeResource

    plugin = app.plugins.get(OpenAPIPlugin)
    document: dict[str, Any] = plugin.provide_openapi_schema()
    if document.get("x-schemas-from") == "msgspec":
        return document
    _, components = msgspec.json.schema_components(
        [ProbeRequest, ProbeResource, ProbePage, DeviceReport, Health, Problem, HFConfig],
        ref_template="#/components/schemas/{name}",
    )
    paths = document["paths"]
    paths["/v1/probes"]["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ProbeRequest"}}},
    }
    install_examples(document)
    paths["/v1/probes"]["post"]["responses"]["202"]["headers"] = {
        "Location": {
            "description": "The probe's URL, to poll.",
            "required": True,
            "schema": {"type": "string"},
        }
    }
    for path, item in paths.items():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            responses = operation.setdefault("responses", {})
            if path not in PUBLIC:
                responses["401"] = {
                    "description": "Missing or wrong bearer token",
                    "content": PROBLEM_CONTENT,
                }
            if "400" in responses:
                responses["400"] = {"description": "Malformed JSON", "content": PROBLEM_CONTENT}
    for parameter in paths["/v1/probes"].get("get", {}).get("parameters", ()):
        if parameter.get("name") == "limit":  # the handler's range (handlers.list_probes)
            parameter["schema"] = {**parameter["schema"], "minimum": 1, "maximum": 500}
    post = paths["/v1/probes"]["post"]["responses"]
    post["422"] = {
        "description": "Invalid probe (field path and allowed range)",
        "content": PROBLEM_CONTENT,
    }
    post["429"] = {
        "description": "The device's probe queue is full",
        "content": PROBLEM_CONTENT,
        "headers": {"Retry-After": {"required": True, "schema": {"type": "integer", "minimum": 1}}},
    }
    post["413"] = {"description": "Request body too large", "content": PROBLEM_CONTENT}
    post["503"] = {
        "description": "The agent cannot record probes now (full disk, read-only data "
        "directory; see `/readyz`)",
        "content": PROBLEM_CONTENT,
    }
    ready = paths.get("/readyz", {}).get("get")
    if ready is not None:
        ready["responses"]["503"] = {
            "description": "Not ready: probes cannot be recorded (the reason is named)",
            "content": ready["responses"]["200"].get("content", {}),
        }
    for path in ("/v1/probes/{probe_id}",):
        for method in ("get", "delete"):
            if method in paths.get(path, {}):
                paths[path][method]["responses"]["404"] = {
                    "description": "No such probe",
                    "content": PROBLEM_CONTENT,
                }
    snapshot = paths.get("/v1/probes/{probe_id}/snapshot", {}).get("get")
    if snapshot is not None:  # snapshot_routes.get_snapshot
        ok = snapshot["responses"]["200"]
        ok["description"] = (
            "The probe's memory snapshot: a `torch.cuda.memory._snapshot()` pickle (open it at "
            "https://pytorch.org/memory_viz)"
        )
        ok.setdefault("headers", {})["Content-Disposition"] = {
            "description": "`attachment; filename=<id>.pickle`",
            "required": True,
            "schema": {"type": "string"},
        }
        snapshot["responses"]["404"] = {
            "description": "No such probe, or no snapshot to serve (not asked for, not yet "
            "written, over the size cap, deleted, expired): the reason is named",
            "content": PROBLEM_CONTENT,
        }
    common_responses(document)
    prometheus_text(document)
    install_components(document, components)
    document["components"]["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from VRAMBUDGET_AGENT_TOKENS / VRAMBUDGET_AGENT_TOKEN_FILE.",
        }
    }
    for path, item in paths.items():
        for operation in item.values():
            if isinstance(operation, dict):
                operation["security"] = [] if path in PUBLIC else [{"bearer": []}]
    return document
