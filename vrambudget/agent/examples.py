"""Named request examples of ``POST /v1/probes``, published in the agent's OpenAPI document
(Swagger UI at ``/schema`` lists them under "Examples"). :func:`install_examples` decodes each
with :class:`~vrambudget.agent.spec.ProbeRequest`, so an invalid one fails the document;
``tests/agent/test_examples.py`` submits each to the agent (on a CPU host) and expects 202.

They run on any host: a model given by its dimensions or a small preset, without a serving
engine, callback or service URL (each of those needs the agent's own settings first)."""

from __future__ import annotations

from typing import Any

import msgspec

from .spec import ProbeRequest

__all__ = ["PROBE_EXAMPLES", "TINY_MODEL", "install_examples"]

TINY_MODEL = {
    "source": "dimensions",
    "hidden_size": 128,
    "num_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "vocab_size": 500,
}
"""A 2-layer model given by its dimensions: a real CPU probe of it takes about a second."""
_FP32 = {"weights": "fp32", "compute": "fp32"}

PROBE_EXAMPLES: dict[str, dict[str, Any]] = {
    "tiny-inference-cpu": {
        "summary": "A 2-layer model given by its dimensions: seconds, on a CPU host too",
        "value": {
            "workload": {
                "kind": "inference",
                "model": TINY_MODEL,
                "batch_size": 2,
                "prompt_tokens": 32,
                "generated_tokens": 4,
                "precision": _FP32,
            },
            "iterations": 3,
        },
    },
    "qwen-inference": {
        "summary": "Qwen2.5 0.5B, batch 2 x (128 + 8) tokens in bf16 (the host's checkpoint "
        "if it has one, else synthetic weights)",
        "value": {
            "workload": {
                "kind": "inference",
                "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                "batch_size": 2,
                "prompt_tokens": 128,
                "generated_tokens": 8,
                "precision": {"weights": "bf16", "compute": "bf16"},
            },
            "iterations": 2,
        },
    },
    "tiny-training-step": {
        "summary": "One AdamW training step of the 2-layer model",
        "value": {
            "workload": {
                "kind": "training",
                "model": TINY_MODEL,
                "sequence_length": 32,
                "precision": _FP32,
                "mixed_precision": "pure",
                "optimizer": {"name": "adamw", "implementation": "for_loop"},
            },
            "iterations": 2,
        },
    },
}
"""name -> OpenAPI Example object of the ``POST /v1/probes`` body."""


def install_examples(document: dict[str, Any]) -> None:
    """Put the examples into ``document``; raise on one :class:`ProbeRequest` rejects."""
    for name, example in PROBE_EXAMPLES.items():
        try:  # as the handler decodes a body (vrambudget.http.body)
            msgspec.json.decode(msgspec.json.encode(example["value"]), type=ProbeRequest)
        except msgspec.ValidationError as exc:
            raise RuntimeError(f"OpenAPI example POST /v1/probes {name!r}: {exc}") from exc
    body = document["paths"]["/v1/probes"]["post"]["requestBody"]["content"]["application/json"]
    body["examples"] = PROBE_EXAMPLES
