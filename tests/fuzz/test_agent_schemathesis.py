"""Schemathesis against the probe agent in process, from the document it serves (with the bearer
token): every default check but two. ``positive_data_acceptance`` is replaced as for the
service: a schema-valid request may get a 422 only when the answer names the field and the rule
is one no schema can state: a workload the core refuses for this model (``invalid-workload``),
a rule of this host's settings (a ``service_url`` / callback URL off its allow-lists, a
``time_limit_s`` above its limit, an entry point it does not configure, a workload over its
CPU memory cap), a paging cursor this agent did not issue (``$.after``), and a model-dependent
rule of the core under ``$.workload`` (the agent answers those with the validation type, not
``invalid-workload``: the message is the core's, never the decoder's).
``allow_header_conformance`` is left out: Litestar's automatic OPTIONS answer on a path with
two handlers lists one handler's methods
(``/v1/probes/{probe_id}``: ``GET, OPTIONS``; its 405s list DELETE too), a Litestar
behaviour reported, not fixed, here. No probe runs: the worker ends each accepted probe
``failed`` at once, so the fuzzer exercises the HTTP contract, not the host."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis

# Imported here, at the top of the stack: schemathesis imports it lazily inside a check, deep in
# Hypothesis' frames, and pytest rewrites a plugin's modules on first import -- on a fresh venv
# (no cached rewrite) CPython 3.11's parser then fails there with "SystemError: AST constructor
# recursion depth mismatch".
import schemathesis.specs.openapi.object_authorization
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import allow_header_conformance, positive_data_acceptance

from tests.fuzz.semantic import semantic_422_names_the_field
from vrambudget.agent import worker
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.settings import AgentSettings

TOKEN = "fuzz-token"


async def _not_run(st: Any, probe_id: str) -> None:
    await worker._fail_probe(st, probe_id, "not run: the fuzz test's stand-in worker")


app = create_agent_app(
    AgentSettings(
        data_dir=Path(tempfile.mkdtemp(prefix="vrambudget-fuzz-")), tokens=(b"fuzz-token",)
    )
)
schema = schemathesis.openapi.from_asgi(
    "/schema/openapi.json", app, headers={"Authorization": f"Bearer {TOKEN}"}
)


DEPLOYMENT_FIELDS = (
    "$.service_url",
    "$.callback.url",
    "$.callback",
    "$.after",
    "$.time_limit_s",
    "$.workload.entry_point",
    "$.workload",
    # the host's checkpoints (weights: checkpoint needs the model in its cache or model dirs)
    # and its memory (the quality check's reference logits must fit it)
    "$.weights",
    "$.quality.max_sequences",
    # a custom job among the overlapping ones names an entry point too (at most 7 of them)
    *(f"$.overlap[{i}].entry_point" for i in range(7)),
)


@pytest.fixture(autouse=True, scope="module")
def _no_probe_runs() -> Iterator[None]:
    """The worker's per-probe step (a module global, read per probe) is the stand-in while this
    module's tests run, and only then (collection alone patches nothing)."""
    run_one = worker._run_one
    worker._run_one = _not_run  # type: ignore[assignment]
    yield
    worker._run_one = run_one  # type: ignore[assignment]


def schema_valid_probes_pass_validation(ctx, response, case):
    generation = getattr(case.meta, "generation", None) if case.meta is not None else None
    if generation is not None and not generation.mode.is_positive:
        return None
    semantic_422_names_the_field(response, DEPLOYMENT_FIELDS, semantic_under="$.workload.")
    return None


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_agent_conforms(case):
    # The security scheme makes Authorization a required header: generated values are replaced
    # by the real token, and a case without the header (a negative one) is sent without it.
    if case.headers and any(k.lower() == "authorization" for k in case.headers):
        case.headers = {k: v for k, v in case.headers.items() if k.lower() != "authorization"}
        case.headers["Authorization"] = f"Bearer {TOKEN}"
    case.call_and_validate(
        excluded_checks=[positive_data_acceptance, allow_header_conformance],
        additional_checks=[schema_valid_probes_pass_validation],
    )
