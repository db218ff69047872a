"""Schemathesis against the app in process: no 5xx, every response conforms to its schema, and a
schema-valid request is never rejected by validation. The only 4xx a schema-valid request may
get is a documented semantic 422 (``invalid-workload``: e.g. a tensor-parallel degree that does
not divide the model's heads, which no JSON Schema can state)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from service.api.app import create_app

app = create_app()
schema = schemathesis.openapi.from_asgi("/schema/openapi.json", app)

SEMANTIC = "https://vrambudget.dev/problems/invalid-workload"


@schemathesis.check
def schema_valid_requests_pass_validation(ctx, response, case):
    """A 422 to schema-conforming data must be semantic, never a validation failure."""
    if case.meta is not None and getattr(case.meta, "generation", None) is not None:
        if not case.meta.generation.mode.is_positive:
            return None
    if response.status_code == 422:
        body = response.json()
        assert body.get("type") == SEMANTIC, f"schema-valid request failed validation: {body}"
    return None


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True)  # reproducible in CI; rare generator dead ends seen with random seeds
def test_api_conforms(case):
    case.call_and_validate(excluded_checks=[positive_data_acceptance],
                           checks=[schema_valid_requests_pass_validation])
