"""Every cross-field rule, rule by rule: a request that breaks it is refused while decoding with
the rule's message, the same request with the rule satisfied decodes, and the published JSON
Schema (the served OpenAPI document's components, validated with jsonschema-rs) agrees on both."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import msgspec
import pytest

from vrambudget.core.probe_report import SCHEMA_RULES as PROBE_RULES
from vrambudget.core.probe_report import ProbeRequest
from vrambudget.core.spec import SCHEMA_RULES, BudgetRequest, FitRequest
from vrambudget.core.spec.rules import RULES
from vrambudget.service.app import create_app
from vrambudget.service.openapi import openapi_document

INFER = {"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"}}
TRAIN = {"kind": "training", "model": {"source": "preset", "id": "qwen2.5-0.5b"}}
SERVE = {"kind": "llm_serving", "model": {"source": "preset", "id": "qwen2.5-0.5b"}}
H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}
_QUALITY = {
    "reference": {"weights": "bf16"},
    "candidates": [{"label": "fp8", "precision": {"weights": "fp8"}}],
}


def _budget(**fields: Any) -> dict[str, Any]:
    return {"workloads": [INFER], **fields}


def _par(**par: Any) -> dict[str, Any]:
    return _budget(workloads=[{**TRAIN, "parallelism": par}])


def _quant(q: dict[str, Any]) -> dict[str, Any]:
    return _budget(workloads=[{**INFER, "precision": {"quantization": q}}])


# (struct, rule index) -> (request type, a body breaking the rule, the same body satisfying it)
CASES: dict[tuple[str, int], tuple[type[Any], dict[str, Any], dict[str, Any]]] = {
    ("GPTQ", 0): (
        BudgetRequest,
        _quant({"scheme": "gptq", "group_size": 0}),
        _quant({"scheme": "gptq", "group_size": 128}),
    ),
    ("AWQ", 0): (
        BudgetRequest,
        _quant({"scheme": "awq", "group_size": 0}),
        _quant({"scheme": "awq", "group_size": -1}),
    ),
    ("Precision", 0): (
        BudgetRequest,
        _budget(
            workloads=[
                {**INFER, "precision": {"weights": "fp8", "quantization": {"scheme": "int8"}}}
            ]
        ),
        _budget(workloads=[{**INFER, "precision": {"weights": "fp8"}}]),
    ),
    ("Parallelism", 0): (
        BudgetRequest,
        _par(offload_parameters=True, zero_stage=2),
        _par(offload_parameters=True, zero_stage=3),
    ),
    ("Parallelism", 1): (
        BudgetRequest,
        _par(offload_optimizer=True),
        _par(offload_optimizer=True, zero_stage=1),
    ),
    ("Parallelism", 2): (
        BudgetRequest,
        _par(virtual_stages=2),
        _par(virtual_stages=2, pipeline_schedule="interleaved_1f1b"),
    ),
    ("TrainingWorkload", 0): (
        BudgetRequest,
        _budget(
            workloads=[{**TRAIN, "mixed_precision": "autocast", "precision": {"weights": "bf16"}}]
        ),
        _budget(workloads=[{**TRAIN, "mixed_precision": "autocast"}]),
    ),
    ("TrainingWorkload", 2): (
        BudgetRequest,
        _budget(
            workloads=[
                {**TRAIN, "method": {"kind": "qlora", "target_modules": ["all-linear", "q_proj"]}}
            ]
        ),
        _budget(
            workloads=[{**TRAIN, "method": {"kind": "qlora", "target_modules": ["all-linear"]}}]
        ),
    ),
    ("TrainingWorkload", 1): (
        BudgetRequest,
        _budget(
            workloads=[
                {
                    **TRAIN,
                    "method": {"kind": "qlora"},
                    "precision": {"quantization": {"scheme": "int8"}},
                }
            ]
        ),
        _budget(workloads=[{**TRAIN, "method": {"kind": "qlora"}}]),
    ),
    ("ServingQuantization", 0): (
        BudgetRequest,
        {
            "workloads": [{**SERVE, "quantization": {"method": "gptq", "group_size": 0}}],
            "device": H100,
        },
        {
            "workloads": [{**SERVE, "quantization": {"method": "gptq", "group_size": 64}}],
            "device": H100,
        },
    ),
    ("ServingQuantization", 1): (
        BudgetRequest,
        {
            "workloads": [{**SERVE, "quantization": {"method": "awq", "applied_at_load": True}}],
            "device": H100,
        },
        {
            "workloads": [{**SERVE, "quantization": {"method": "fp8", "applied_at_load": True}}],
            "device": H100,
        },
    ),
    ("BudgetRequest", 0): (
        BudgetRequest,
        {"workloads": [SERVE, INFER], "device": H100},
        {"workloads": [SERVE], "device": H100},
    ),
    ("BudgetRequest", 1): (
        BudgetRequest,
        {"workloads": [SERVE]},
        {"workloads": [SERVE], "device": H100},
    ),
    ("BudgetRequest", 2): (
        BudgetRequest,
        {"workloads": [SERVE], "device": H100, "method": "trace"},
        {"workloads": [SERVE], "device": H100, "method": "analytic"},
    ),
    ("BudgetRequest", 3): (
        BudgetRequest,
        {"workloads": [INFER], "method": "trace", "allocator_replay": True},
        {"workloads": [INFER], "method": "analytic", "allocator_replay": True},
    ),
    ("FitRequest", 0): (FitRequest, {"workloads": [SERVE, INFER]}, {"workloads": [SERVE]}),
    ("FitRequest", 1): (
        FitRequest,
        {"workloads": [INFER, TRAIN], "latency_target": {"time_per_output_token_ms": 20}},
        {"workloads": [INFER, TRAIN]},
    ),
    ("Software", 0): (
        BudgetRequest,
        {"workloads": [TRAIN], "software": {"libraries": {"transformers": "4.48.1"}}},
        {
            "workloads": [TRAIN],
            "software": {"framework": "fsdp", "libraries": {"transformers": "4.48.1"}},
        },
    ),
    ("ProbeRequest", 0): (
        ProbeRequest,
        {"workload": TRAIN, "concurrency": 2},
        {"workload": INFER, "concurrency": 2},
    ),
    ("ProbeRequest", 1): (
        ProbeRequest,
        {"workload": SERVE, "concurrency": 2},
        {"workload": SERVE, "engine": {"concurrency": 2}},
    ),
    ("ProbeRequest", 2): (
        ProbeRequest,
        {"workload": INFER, "engine": {"concurrency": 2}},
        {"workload": SERVE, "engine": {"concurrency": 2}},
    ),
    ("ProbeRequest", 3): (
        ProbeRequest,
        {"workload": INFER, "recipe_gpu": "h100-sxm5-80gb"},
        {"workload": SERVE, "recipe_gpu": "h100-sxm5-80gb"},
    ),
    ("ProbeRequest", 4): (
        ProbeRequest,
        {"workload": TRAIN, "quality": _QUALITY},
        {"workload": INFER, "quality": _QUALITY},
    ),
    ("ProbeRequest", 5): (
        ProbeRequest,
        {"workload": SERVE, "overlap": [INFER]},
        {"workload": INFER, "overlap": [INFER]},
    ),
    ("ProbeRequest", 6): (
        ProbeRequest,
        {"workload": SERVE, "memory_snapshot": True},
        {"workload": INFER, "memory_snapshot": True},
    ),
    ("ProbeRequest", 7): (
        ProbeRequest,
        {"workload": SERVE, "expandable_segments": False},
        {"workload": INFER, "expandable_segments": False},
    ),
}


def _ct(**q: Any) -> dict[str, Any]:
    return _quant({"scheme": "compressed_tensors", **q})


CASES.update(
    {
        ("CompressedTensors", 0): (
            BudgetRequest,
            _ct(strategy="group", group_size=None),
            _ct(strategy="group", group_size=64),
        ),
        ("CompressedTensors", 1): (
            BudgetRequest,
            _ct(format="float-quantized", type="float", num_bits=8, strategy="block"),
            _ct(
                format="float-quantized",
                type="float",
                num_bits=8,
                strategy="block",
                block_structure=[128, 128],
            ),
        ),
        ("CompressedTensors", 2): (
            BudgetRequest,
            _ct(type="float", num_bits=8),
            _ct(type="int", num_bits=8),
        ),
        ("CompressedTensors", 3): (
            BudgetRequest,
            _ct(format="int-quantized", type="float", num_bits=8, strategy="channel"),
            _ct(format="int-quantized", type="int", num_bits=8, strategy="channel"),
        ),
        ("CompressedTensors", 4): (
            BudgetRequest,
            _ct(format="float-quantized", num_bits=8, strategy="channel"),
            _ct(format="float-quantized", type="float", num_bits=8, strategy="channel"),
        ),
        ("CompressedTensors", 5): (
            BudgetRequest,
            _ct(format="naive-quantized", type="float", num_bits=4),
            _ct(format="naive-quantized", type="float", num_bits=8),
        ),
    }
)


def _serve(**fields: Any) -> dict[str, Any]:
    return {"workloads": [{**SERVE, **fields}], "device": H100}


_GGUF_BAD: dict[str, Any] = {
    "gpu_memory_utilization": 0.8,
    "max_model_len": 4096,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 4096,
    "block_size": 32,
    "enforce_eager": True,
    "flashinfer_sampler": True,
    "kv_cache_memory_bytes": 1 << 30,
    "kv_cache_dtype": "fp8",
    "dtype": "float16",
    "quantization": {"method": "awq"},
    "entrypoint": "llm_class",
    "disable_hybrid_kv_cache_manager": True,
    "parallelism.tensor": 2,
    "parallelism.pipeline": 2,
    "parallelism.data": 2,
    "parallelism.enable_expert_parallel": True,
    "parallelism.peer_access": False,
}
_SGLANG_BAD: dict[str, Any] = {
    "gpu_memory_utilization": 0.8,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 4096,
    "block_size": 32,
    "enforce_eager": True,
    "flashinfer_sampler": True,
    "kv_cache_memory_bytes": 1 << 30,
    "entrypoint": "llm_class",
    "disable_hybrid_kv_cache_manager": True,
    "parallelism.enable_expert_parallel": True,
}


def _field(name: str, value: Any) -> dict[str, Any]:
    if name.startswith("parallelism."):
        return {"parallelism": {name.split(".")[1]: value}}
    return {name: value}


CASES.update(
    {
        ("GGUFOptions", 0): (
            BudgetRequest,
            _serve(engine="llama_cpp", gguf={"cache_type_v": "q8_0", "flash_attn": "off"}),
            _serve(engine="llama_cpp", gguf={"cache_type_v": "q8_0", "flash_attn": "on"}),
        ),
        ("LLMServingWorkload", 0): (
            BudgetRequest,
            _serve(sglang={"page_size": 16}),
            _serve(engine="sglang", sglang={"page_size": 16}),
        ),
        ("LLMServingWorkload", 1): (
            BudgetRequest,
            _serve(gguf={"n_ctx": 4096}),
            _serve(engine="llama_cpp", gguf={"n_ctx": 4096}),
        ),
        **{
            ("LLMServingWorkload", 2 + i): (
                BudgetRequest,
                _serve(engine="sglang", **_field(name, value)),
                _serve(engine="vllm", **_field(name, value)),
            )
            for i, (name, value) in enumerate(_SGLANG_BAD.items())
        },
        **{
            ("LLMServingWorkload", 2 + len(_SGLANG_BAD) + i): (
                BudgetRequest,
                _serve(engine="ollama", **_field(name, value)),
                _serve(engine="vllm", **_field(name, value)),
            )
            for i, (name, value) in enumerate(_GGUF_BAD.items())
        },
        ("LLMServingWorkload", 2 + len(_SGLANG_BAD) + len(_GGUF_BAD)): (
            BudgetRequest,
            _serve(engine="sglang", speculative={"method": "ngram", "num_speculative_tokens": 2}),
            _serve(engine="vllm", speculative={"method": "ngram", "num_speculative_tokens": 2}),
        ),
        ("SpeculativeOptions", 1): (
            BudgetRequest,
            _serve(
                speculative={
                    "method": "mtp",
                    "num_speculative_tokens": 1,
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                }
            ),
            _serve(speculative={"method": "mtp", "num_speculative_tokens": 1}),
        ),
        ("SpeculativeOptions", 2): (
            BudgetRequest,
            _serve(
                speculative={
                    "method": "eagle",
                    "num_speculative_tokens": 2,
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                    "draft_vocab_size": 32000,
                }
            ),
            _serve(
                speculative={
                    "method": "eagle3",
                    "num_speculative_tokens": 2,
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                    "draft_vocab_size": 32000,
                }
            ),
        ),
        ("SpeculativeOptions", 0): (
            BudgetRequest,
            _serve(
                speculative={
                    "method": "ngram",
                    "num_speculative_tokens": 2,
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                }
            ),
            _serve(
                speculative={
                    "method": "eagle",
                    "num_speculative_tokens": 2,
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                }
            ),
        ),
    }
)


@pytest.fixture(scope="module")
def validators() -> dict[str, Any]:
    document = openapi_document(create_app())
    out = {}
    for name in ("BudgetRequest", "FitRequest", "ProbeRequest"):
        schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
        out[name] = jsonschema_rs.validator_for(json.loads(json.dumps(schema)))
    return out


def test_every_rule_has_a_case() -> None:
    declared = {(name, i) for name, rules in RULES.items() for i in range(len(rules))}
    assert declared == set(CASES)


NO_LATENCY_WORKLOADS = [
    TRAIN,
    {"kind": "generic"},
    {**INFER, "kind": "vision"},
    {**INFER, "kind": "seq2seq"},
    {**INFER, "kind": "speech_to_text"},
    {"kind": "image_generation", "pipeline": {"source": "preset", "id": "sd-1.5"}},
]


@pytest.mark.parametrize("other", NO_LATENCY_WORKLOADS, ids=lambda w: w["kind"])
def test_a_latency_target_is_refused_beside_each_kind_it_does_not_apply_to(
    other: dict[str, Any], validators: dict[str, Any]
) -> None:
    """FitRequest's rule 1 names six kinds in one ``contains`` (enum): each of them trips it, at
    run time and in the published schema; inference and llm_serving do not."""
    broken = {"workloads": [INFER, other], "latency_target": {"time_per_output_token_ms": 20}}
    with pytest.raises(msgspec.ValidationError, match="a latency target applies"):
        msgspec.convert(broken, FitRequest)
    assert not validators["FitRequest"].is_valid(broken)
    fine = {"workloads": [INFER], "latency_target": {"time_per_output_token_ms": 20}}
    msgspec.convert(fine, FitRequest)
    assert validators["FitRequest"].is_valid(fine)


@pytest.mark.parametrize("key", sorted(CASES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_rule_runtime_and_schema_agree(key: tuple[str, int], validators: dict[str, Any]) -> None:
    name, index = key
    type_, broken, fixed = CASES[key]
    rule = RULES[name][index]
    with pytest.raises(msgspec.ValidationError, match=rule.message.split("(")[0][:40]):
        msgspec.convert(broken, type_)
    msgspec.convert(fixed, type_)
    validator = validators[type_.__name__]
    assert not validator.is_valid(broken), f"the schema accepts a request breaking {key}"
    assert validator.is_valid(fixed), f"the schema refuses a request satisfying {key}"


def test_the_schema_rules_are_the_published_ones() -> None:
    document = openapi_document(create_app())
    for name, rules in {**SCHEMA_RULES, **PROBE_RULES}.items():
        assert document["components"]["schemas"][name]["allOf"] == rules
