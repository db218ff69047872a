"""The positive-acceptance rule both fuzz tests apply (not a test module: importing it
registers no schemathesis check)."""

from __future__ import annotations

from typing import Any

SEMANTIC = (
    "https://vrambudget.dev/problems/invalid-workload",
    "https://vrambudget.dev/problems/trace-time-limit",
)
VALIDATION = "https://vrambudget.dev/problems/validation"


_DECODER_WORDS = ("Expected", "Object missing", "Object contains unknown", "Invalid enum")


def semantic_422_names_the_field(
    response: Any, deployment_fields: tuple[str, ...] = (), semantic_under: str | None = None
) -> None:
    """A 422 to schema-conforming data must be semantic and name the field (the trace tier's
    time limit names none: it is a bound on time, not a rule of one field); a validation 422 is
    a failure unless every field it names is one of ``deployment_fields`` (rules set by the
    host's settings, which no published schema can state), or, with ``semantic_under``, every
    field lies under that path and no message is the decoder's (the agent answers the core's
    model-dependent rules with the validation type)."""
    if response.status_code != 422:
        return
    body = response.json()
    kind = body.get("type")
    fields = [e.get("field", "") for e in body.get("errors", ())]
    if kind == VALIDATION and fields and all(f in deployment_fields for f in fields):
        return
    messages = [e.get("message", "") for e in body.get("errors", ())]
    if (
        kind == VALIDATION
        and semantic_under
        and fields
        and all(f.startswith(semantic_under) for f in fields)
        and not any(m.startswith(_DECODER_WORDS) for m in messages)
    ):
        return
    assert kind in SEMANTIC, f"schema-valid request failed validation: {body}"
    if kind != "https://vrambudget.dev/problems/trace-time-limit":
        assert fields and all(f.startswith("$.") for f in fields), f"no field named: {body}"
