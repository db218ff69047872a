"""The published vLLM runs (``research/data/vllm_runs.json``) as budget requests, and the
comparison of prediction and measurement that calibration and the accuracy tests share.

Each run is mapped to a preset (and quantization) when the model's architecture is one the
service resolves exactly; the others are listed with the reason they are left out
(``UNMODELLED``), never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from statistics import median
from typing import Any

import msgspec

from vrambudget.core.spec import LLMServingWorkload
from vrambudget.core.units import GiB

__all__ = [
    "MODELS",
    "UNMODELLED",
    "Comparison",
    "compare",
    "load_runs",
    "run_request",
    "summary",
]

# Model as published -> (preset id, quantization method or None, note).
MODELS: dict[str, tuple[str, str | None, str]] = {
    "codellama/CodeLlama-7b-hf": ("codellama-7b", None, ""),
    "deepseek-ai/DeepSeek-V2-Lite-Chat": (
        "deepseek-v2-lite",
        None,
        "the chat fine-tune has the base model's config",
    ),
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic": ("llama-3.3-70b", "fp8_channel", ""),
    "redhatai/Llama-3.3-70B-Instruct-quantized.w8a8": ("llama-3.3-70b", "w8a8_int8", ""),
    "RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic": ("qwen2.5-7b", "fp8_channel", ""),
    "RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8": ("qwen2.5-7b", "w8a8_int8", ""),
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16": ("llama-3.1-8b", "gptq", ""),
    "google/gemma-2-2b-it": ("gemma-2-2b", None, ""),
    "google/gemma-2-9b-it": ("gemma-2-9b", None, ""),
    "google/gemma-2-27b-it": ("gemma-2-27b", None, ""),
    "google/gemma-3-4b-it": ("gemma-3-4b", None, ""),
    "google/gemma-3-12b-it": ("gemma-3-12b", None, ""),
    "google/gemma-3-27b-it": ("gemma-3-27b", None, ""),
    "ibm-granite/granite-3.1-2b-instruct": ("granite-3.1-2b", None, ""),
    "ibm-granite/granite-3.1-8b-instruct": ("granite-3.1-8b", None, ""),
    "meta-llama/Llama-3.1-8B-Instruct": (
        "llama-3.1-8b",
        None,
        "the instruct model has the base model's shapes",
    ),
    "microsoft/phi-4": ("phi-4", None, ""),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ("mixtral-8x7b", None, ""),
    "moonshotai/Kimi-Dev-72B": ("qwen2.5-72b", None, "a Qwen2.5-72B fine-tune (same config)"),
    "Qwen/Qwen2.5-7B-Instruct": ("qwen2.5-7b", None, ""),
    "Qwen/Qwen2.5-72B-Instruct": ("qwen2.5-72b", None, ""),
    "Qwen/Qwen3-8B": ("qwen3-8b", None, ""),
    "Qwen/Qwen3-30B-A3B": ("qwen3-30b-a3b", None, ""),
}

# The instruct checkpoints' config.json differs from the base preset's in fields that change
# vLLM's memory: Qwen2.5 instruct models publish max_position_embeddings 32768 (the base models
# 131072), which sizes the rotary cos/sin cache.
_QWEN25_INSTRUCT = {"max_position_embeddings": 32768}
CONFIG_OVERRIDES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": _QWEN25_INSTRUCT,
    "RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic": _QWEN25_INSTRUCT,
    "RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8": _QWEN25_INSTRUCT,
    "Qwen/Qwen2.5-72B-Instruct": _QWEN25_INSTRUCT,
}

UNMODELLED: dict[str, str] = {
    "ibm-granite/granite-vision-3.3-2b": "vision-language model (LLaVA-Next + SigLIP): no preset",
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": "Mistral 3 with a Pixtral vision tower: "
    "no preset (mistral-small-24b is the text-only 2501 base)",
    "RedHatAI/Mistral-Small-3.1-24B-Instruct-2503-quantized.w8a8": "as Mistral-Small-3.1",
    "moonshotai/Kimi-VL-A3B-Instruct": "DeepSeek-V3-style MoE with a MoonViT tower: no preset",
    "Qwen/Qwen3-235B-A22B-FP8": "no preset",
    "meta-llama/Llama-3.2-11B-Vision": "Mllama cross-attention model: not modelled",
    "kaitchup/Phi-4-AutoRound-GPTQ-4bit": "vLLM 0.6 (V0 engine): version not modelled",
    "meta-llama/Meta-Llama-3-8B": "vLLM 0.6 (V0 engine): version not modelled",
}

_SWEEP_TOTAL_GIB = 79.19  # the sweep's logged total, for its per-run JSONs that omit it


@cache
def load_runs() -> tuple[dict[str, Any], ...]:
    raw = (Path(__file__).parent / "data" / "vllm_runs.json").read_bytes()
    return tuple(msgspec.json.decode(raw)["runs"])


def _model(published: str, preset_id: str) -> dict[str, Any]:
    overrides = CONFIG_OVERRIDES.get(published)
    if not overrides:
        return {"source": "preset", "id": preset_id}
    from vrambudget.core.catalog import preset

    config = dict(preset(preset_id).config or {})
    return {"source": "hf_config", "name": published, "config": {**config, **overrides}}


def run_request(run: dict[str, Any]) -> tuple[LLMServingWorkload, int, str] | str:
    """(workload, GPU total bytes, GPU name) as the run was launched, or why it is left out."""
    if run["vllm_version"] != "0.19.0":
        return UNMODELLED.get(run["model"], f"vLLM {run['vllm_version']}: not modelled")
    if run["model"] not in MODELS:
        return UNMODELLED.get(run["model"], "no preset")
    preset, method, _ = MODELS[run["model"]]
    total_gib = run["gpu_memory_total_gib"] or _SWEEP_TOTAL_GIB
    body: dict[str, Any] = {
        "kind": "llm_serving",
        "engine_version": run["vllm_version"],
        "model": _model(run["model"], preset),
        "parallelism": {
            "tensor": run["tensor_parallel"],
            "pipeline": run["pipeline_parallel"],
            "data": run["data_parallel"],
        },
        "gpu_memory_utilization": run["gpu_memory_utilization"],
        "max_model_len": run["max_model_len"],
        "max_num_seqs": run["max_num_seqs"],
        "max_num_batched_tokens": run["max_num_batched_tokens"],
        "enforce_eager": run["enforce_eager"],
        "block_size": run["block_size"],
        "dtype": run["dtype"] if run["dtype"] in ("bfloat16", "float16", "float32") else "auto",
        "kv_cache_dtype": "fp8" if run["kv_cache_dtype"] == "fp8" else "auto",
    }
    if method is None and run["quantization"] == "fp8":
        body["quantization"] = {"method": "fp8", "applied_at_load": True}
    elif method is not None:
        body["quantization"] = {"method": method}
    return (msgspec.convert(body, LLMServingWorkload), round(total_gib * GiB), run["gpu"])


@dataclass(frozen=True, slots=True)
class Comparison:
    run_id: str
    split: str
    label: str
    quantity: str
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        """Relative error of the prediction, (predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured


def _label(run: dict[str, Any]) -> str:
    extra = []
    if run["quantization"]:
        extra.append(str(run["quantization"]))
    if run["kv_cache_dtype"] not in (None, "auto"):
        extra.append(f"kv {run['kv_cache_dtype']}")
    if run["dtype"] == "float32":
        extra.append("fp32")
    tail = f" ({', '.join(extra)})" if extra else ""
    return (
        f"{run['model'].split('/')[-1]}{tail} TP{run['tensor_parallel']} "
        f"PP{run['pipeline_parallel']} len {run['max_model_len']}"
    )


def compare(run: dict[str, Any]) -> list[Comparison]:
    """Predicted and measured weights per GPU (GiB, first pipeline stage: the rank that logs),
    activation peak, KV pool (GiB), KV tokens and maximum concurrency of one run."""
    from vrambudget.core.resolve import resolve_model
    from vrambudget.core.serving.vllm import account

    req = run_request(run)
    if isinstance(req, str):
        return []
    w, total, gpu_name = req
    a = account(w, resolve_model(w.model), total, gpu_name)
    first = a.stages[0]
    m = run["measured"]
    predicted = {
        "weights_gib": first.weights_memory_bytes / GiB,
        "activation_peak_gib": first.activation_bytes / GiB,
        "kv_cache_gib": first.available_bytes / GiB,
        "kv_cache_tokens": a.kv_tokens,
        "max_concurrency": a.max_concurrency,
    }
    label = _label(run)
    return [
        Comparison(run["id"], run["split"], label, q, float(p), float(m[q]))
        for q, p in predicted.items()
        if m.get(q)
    ]


def summary(comparisons: list[Comparison], quantity: str, split: str) -> dict[str, float]:
    """Count, median and largest absolute relative error of one quantity on one split."""
    errors = [abs(c.error) for c in comparisons if c.quantity == quantity and c.split == split]
    if not errors:
        return {"n": 0, "median": 0.0, "max": 0.0}
    return {"n": len(errors), "median": median(errors), "max": max(errors)}
