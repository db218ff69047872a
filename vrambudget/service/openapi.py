"""The service's published OpenAPI document (assembled as both apps do, see
:mod:`vrambudget.http.openapi`): its wire types, request bodies and problem responses."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin

from vrambudget.core.catalog import gpus
from vrambudget.core.catalog_view import CatalogGPU, CatalogModel
from vrambudget.core.cluster import ClusterAnswer
from vrambudget.core.comparison import Comparison
from vrambudget.core.fit import FitRequest, FitResponse
from vrambudget.core.hf_config import HFConfig
from vrambudget.core.probe_report import ProbeResource
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest
from vrambudget.core.spec.cluster import ClusterRequest
from vrambudget.http.openapi import (
    PROBLEM_CONTENT,
    common_responses,
    install_components,
    prometheus_text,
)
from vrambudget.http.problems import Problem

from .examples import install_examples
from .pictures import document_pictures
from .wire import Health, ModelDetail, ModelSummary, Ready

__all__ = ["WIRE_TYPES", "openapi_document", "patch_openapi"]


def _wire_types() -> list[Any]:
    return [
        BudgetRequest,
        Budget,
        FitRequest,
        FitResponse,
        ClusterRequest,
        ClusterAnswer,
        ProbeResource,
        Comparison,
        CatalogGPU,
        CatalogModel,
        ModelSummary,
        ModelDetail,
        Problem,
        Health,
        Ready,
        HFConfig,  # the schema of HFConfigModel.config, a free JSON object checked against it
    ]


WIRE_TYPES = _wire_types


def patch_openapi(app: Litestar) -> None:
    plugin = app.plugins.get(OpenAPIPlugin)
    document = plugin.provide_openapi_schema()  # cached dict, served as /schema/openapi.json
    if document.get("x-schemas-from") == "msgspec":
        return
    _, components = msgspec.json.schema_components(
        _wire_types(), ref_template="#/components/schemas/{name}"
    )
    for item in document.get("paths", {}).values():
        for operation in item.values():
            responses = operation.get("responses", {}) if isinstance(operation, dict) else {}
            if "422" in responses and "400" in responses:
                # Litestar documents its own 400 validation body; this app answers 400 only
                # for malformed JSON and 422 for invalid values, both problem+json.
                responses["400"] = {"description": "Malformed JSON", "content": PROBLEM_CONTENT}
    busy = document["paths"]["/v1/budgets"]["post"]["responses"].get("503")
    if busy is not None:  # ResponseSpec cannot declare headers
        busy["headers"] = {
            "Retry-After": {
                "description": "Seconds after which a retry is likely to find a free trace slot "
                "(sent with `.../problems/trace-busy`).",
                "required": False,
                "schema": {"type": "integer", "minimum": 1},
            }
        }
    bodies = {
        "/v1/budgets": "BudgetRequest",
        "/v1/fits": "FitRequest",
        "/v1/cluster-requests": "ClusterRequest",
        "/v1/comparisons": "ProbeResource",
    }
    for path, name in bodies.items():  # the handlers decode the raw body strictly themselves
        document["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    cluster = document["paths"]["/v1/cluster-requests"]["post"]["responses"]["200"]
    cluster.setdefault("content", {})["application/yaml"] = {
        "schema": {
            "description": "`format=yaml` or `Accept: application/yaml`: the chosen manifests "
            "as a YAML stream (a v1 Pod; with `manifests=dra` a resource.k8s.io/v1 "
            "ResourceClaimTemplate, then the Pod), each quantity's rule and source in comments."
        }
    }
    document_pictures(document)
    ready = document["paths"].get("/readyz", {}).get("get")
    if ready is not None:
        ready["responses"]["503"] = {
            "description": "Not ready: a catalog is empty",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Ready"}}},
        }
    for parameter in document["paths"]["/v1/comparisons"]["post"].get("parameters", ()):
        if parameter.get("name") == "gpu":  # the handler accepts catalog ids only
            parameter["schema"] = {
                "type": "string",
                "enum": sorted(gpus()),
                "description": parameter.get("description", ""),
            }
    common_responses(document)
    prometheus_text(document)
    install_components(document, components)
    install_examples(document)


def openapi_document(app: Litestar) -> dict[str, Any]:
    patch_openapi(app)
    return app.plugins.get(OpenAPIPlugin).provide_openapi_schema()
