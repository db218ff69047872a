"""Named request examples of every operation, published in the OpenAPI document
(``requestBody.content["application/json"].examples``, and ``examples`` of path parameters):
Swagger UI at ``/schema`` lists them in each operation's "Examples" menu and "Try it out" sends
the chosen one. :func:`install_examples` decodes each body with the operation's own type as it
is published, so an invalid example fails the document, and ``tests/service/test_examples.py``
posts every one to the app and expects a 2xx.

Every example is analytic (milliseconds, no network): a Hub model or ``method: trace`` would
make "Try it out" depend on the Hub or take seconds; docs/FIRST_HOUR.md shows both."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from vrambudget.core.fit import FitRequest
from vrambudget.core.probe_report import ProbeResource
from vrambudget.core.spec import BudgetRequest
from vrambudget.core.spec.cluster import ClusterRequest

__all__ = ["BODY_EXAMPLES", "PARAMETER_EXAMPLES", "install_examples"]

_H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}
_LLAMA_8B = {"source": "preset", "id": "llama-3.1-8b"}
_LLAMA_70B = {"source": "preset", "id": "llama-3.1-70b"}

_INFERENCE = {
    "workloads": [
        {
            "kind": "inference",
            "model": _LLAMA_8B,
            "batch_size": 8,
            "prompt_tokens": 4096,
            "generated_tokens": 512,
        }
    ],
    "device": _H100,
}
_VLLM = {
    "kind": "llm_serving",
    "engine": "vllm",
    "engine_version": "0.19.0",
    "model": _LLAMA_8B,
    "max_model_len": 8192,
    "gpu_memory_utilization": 0.9,
}


@cache
def _cpu_probe_report() -> dict[str, Any]:
    """A real report of the agent's CPU probe (``data/cpu_probe_report.json``): the
    ``tiny-inference-cpu`` example of the agent's ``POST /v1/probes``, run by
    :func:`vrambudget.agent.probe.measure` on a 2-core CPU host with torch 2.13.0."""
    path = Path(__file__).parent / "data" / "cpu_probe_report.json"
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return report


def _example(summary: str, value: Any, description: str | None = None) -> dict[str, Any]:
    example = {"summary": summary, "value": value}
    if description:
        example["description"] = description
    return example


def _body_examples() -> dict[str, dict[str, dict[str, Any]]]:
    return {
        "/v1/budgets": {
            "inference": _example(
                "Llama 3.1 8B, batch 8 x (4096 + 512) tokens on an H100", _INFERENCE
            ),
            "lora-training": _example(
                "LoRA fine-tune of Llama 3.1 8B on an A100 80GB",
                {
                    "workloads": [
                        {
                            "kind": "training",
                            "model": _LLAMA_8B,
                            "method": {"kind": "lora", "rank": 16},
                            "micro_batch_size": 4,
                            "sequence_length": 2048,
                            "checkpointing": "full",
                        }
                    ],
                    "device": {"source": "catalog", "id": "a100-sxm4-80gb"},
                },
            ),
            "vllm-serving": _example(
                "vLLM 0.19.0 serving Llama 3.1 8B on an H100",
                {"workloads": [_VLLM], "device": _H100},
            ),
            "custom-device": _example(
                "Qwen2.5 7B inference on a device given by its capacity",
                {
                    "workloads": [
                        {
                            "kind": "inference",
                            "model": {"source": "preset", "id": "qwen2.5-7b"},
                            "batch_size": 1,
                            "prompt_tokens": 8192,
                            "generated_tokens": 1024,
                        }
                    ],
                    "device": {
                        "source": "custom",
                        "name": "my-48g",
                        "memory_total_bytes": 51_539_607_552,
                    },
                },
            ),
        },
        "/v1/fits": {
            "catalog": _example(
                "Llama 3.1 70B inference on every catalog GPU, 1 to 8 devices",
                {
                    "workloads": [
                        {
                            "kind": "inference",
                            "model": _LLAMA_70B,
                            "batch_size": 4,
                            "prompt_tokens": 8192,
                            "generated_tokens": 1024,
                        }
                    ],
                    "device_counts": [1, 2, 4, 8],
                },
            ),
            "vllm-cheapest": _example(
                "vLLM serving Llama 3.1 70B: device count, context, concurrency, cheapest GPU",
                {
                    "workloads": [
                        {
                            "kind": "llm_serving",
                            "engine_version": "0.19.0",
                            "model": _LLAMA_70B,
                            "max_model_len": 32768,
                        }
                    ],
                    "devices": [_H100, {"source": "catalog", "id": "a100-sxm4-80gb"}],
                    "device_counts": [4, 8],
                    "solve": ["device_count", "max_model_len", "concurrency"],
                    "target_concurrency": 16,
                    "prices": {"h100-sxm5-80gb": 2.5, "a100-sxm4-80gb": 1.6},
                },
            ),
        },
        "/v1/cluster-requests": {
            "from-budget": _example(
                "vLLM serving Llama 3.1 8B over 2 H100s as a Pod",
                {
                    "source": {
                        "from": "budget",
                        "request": {
                            "workloads": [{**_VLLM, "parallelism": {"tensor": 2}}],
                            "device": _H100,
                        },
                    },
                    "name": "llama-8b",
                    "image": "vllm/vllm-openai:v0.19.0",
                },
            ),
        },
        "/v1/comparisons": {
            "cpu-probe": _example(
                "A probe agent's report of a small inference on a CPU host",
                _cpu_probe_report(),
                "A real report (the agent's CPU probe, torch 2.13.0, 2-core host) of a 2-layer "
                "model given by its dimensions: the comparison estimates the same workload and "
                "sets each measured quantity beside its estimate.",
            ),
        },
    }


BODY_EXAMPLES = _body_examples
"""path -> name -> OpenAPI Example object of the POST body."""

PARAMETER_EXAMPLES: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("/v1/gpus/{gpu_id}", "gpu_id"): {
        "h100": _example("NVIDIA H100 SXM5 80GB", "h100-sxm5-80gb"),
        "l4": _example("NVIDIA L4 24GB", "l4-24gb"),
    },
    ("/v1/models/{model_id}", "model_id"): {
        "llama-8b": _example("Llama 3.1 8B", "llama-3.1-8b"),
    },
}
"""(path, parameter) -> name -> OpenAPI Example object of a path parameter."""

_TYPES: dict[str, Any] = {
    "/v1/budgets": BudgetRequest,
    "/v1/fits": FitRequest,
    "/v1/cluster-requests": ClusterRequest,
    "/v1/comparisons": ProbeResource,
}


def install_examples(document: dict[str, Any]) -> None:
    """Put the examples into ``document``; raise on one its operation's type rejects."""
    paths = document["paths"]
    for path, examples in BODY_EXAMPLES().items():
        for name, example in examples.items():
            try:  # as the handler decodes a body (vrambudget.http.body)
                msgspec.json.decode(msgspec.json.encode(example["value"]), type=_TYPES[path])
            except msgspec.ValidationError as exc:
                raise RuntimeError(f"OpenAPI example {path} {name!r} is invalid: {exc}") from exc
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]
        body["examples"] = examples
    for (path, parameter_name), examples in PARAMETER_EXAMPLES.items():
        for parameter in paths[path]["get"].get("parameters", ()):
            if parameter.get("name") == parameter_name:
                parameter["examples"] = examples
