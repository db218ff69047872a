"""Schemathesis against the app in process: no 5xx, every response conforms to its schema, and a
schema-valid request is never rejected by validation. The only 4xx a schema-valid request may
get is a documented semantic 422 (``invalid-workload``: e.g. a tensor-parallel degree that does
not divide the model's heads, which no JSON Schema can state; ``trace-time-limit``: a workload
too big to trace in the limit)."""

from __future__ import annotations

import os

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from vrambudget.service.app import Settings, create_app

# `method: trace` requests go to a worker pool like in production, with a short time limit so a
# schema-valid workload too big to trace is the documented 422 trace-time-limit, not a hang. The
# real engine is fuzzed (it found three 500s: fixed, with the model checks now semantic 422s);
# VRAMBUDGET_SCHEMATHESIS_TRACE_ENTRY=tests.support.trace_entries:tiny swaps in a fast stand-in.
app = create_app(
    Settings(
        trace_time_limit_s=3,
        trace_entry=os.environ.get(
            "VRAMBUDGET_SCHEMATHESIS_TRACE_ENTRY", "vrambudget.trace.engine:trace_budget"
        ),
    )
)

schema = schemathesis.openapi.from_asgi("/schema/openapi.json", app)

SEMANTIC = (
    "https://vrambudget.dev/problems/invalid-workload",
    "https://vrambudget.dev/problems/trace-time-limit",
)


@schemathesis.check
def schema_valid_requests_pass_validation(ctx, response, case):
    """A 422 to schema-conforming data must be semantic, never a validation failure."""
    generation = getattr(case.meta, "generation", None) if case.meta is not None else None
    if generation is not None and not generation.mode.is_positive:
        return None
    if response.status_code == 422:
        body = response.json()
        assert body.get("type") in SEMANTIC, f"schema-valid request failed validation: {body}"
    return None


# `checks=` replaces schemathesis' default set (passing only the custom check, as this test once
# did, runs no server-error or conformance check at all), so the response checks are named here.
# Not the whole default set: with it, the fits operation sometimes ends in a schemathesis
# generator dead end ("Cannot generate an array with 1 demanded elements": an any_of demand whose
# branches are all unsatisfiable), depending on the constants Hypothesis collects from the loaded
# modules. positive_data_acceptance stays out: the custom check is its version that allows the
# semantic 422s.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    schema_valid_requests_pass_validation,
]


@schema.parametrize()
@settings(
    max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)  # reproducible in CI; rare generator dead ends seen with random seeds
def test_api_conforms(case):
    case.call_and_validate(checks=CHECKS)
