"""llm_serving through the service: the engine's start check and budget lines, and the wire rules
(4xx tables)."""

from __future__ import annotations

import msgspec
import pytest
from litestar.testing import TestClient

from vrambudget.core.spec import LLMServingWorkload
from vrambudget.service.app import Settings, create_app

H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}


def serving(model: str, **fields: object) -> LLMServingWorkload:
    return msgspec.convert(
        {"kind": "llm_serving", "model": {"source": "preset", "id": model}, **fields},
        LLMServingWorkload,
    )


# ---------------------------------------------------------------- engine start and budget --


def budget(**body: object) -> dict:
    with TestClient(create_app(Settings())) as c:
        r = c.post("/v1/budgets", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_budget_lines_sum_to_the_device_and_kv_is_the_pool():
    b = budget(
        workloads=[
            {
                "kind": "llm_serving",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "max_model_len": 8192,
                "gpu_memory_utilization": 0.95,
                "engine_version": "0.19.0",
            }
        ],
        device=H100,
    )
    s = b["serving"]
    dev = b["devices"][0]
    lines = {ln["component"]: ln["bytes"] for ln in dev["lines"]}
    assert len(dev["lines"]) == 14
    assert dev["total_bytes"] == sum(lines.values()) == 85_045_477_376
    assert (
        lines["kv_cache"]
        == s["kv_cache_pool_bytes"]
        == s["details"]["num_gpu_blocks"] * 65_536 * 32
    )
    assert s["kv_cache_tokens"] == s["details"]["num_gpu_blocks"] * 16
    assert s["max_concurrency"] == pytest.approx(s["details"]["num_gpu_blocks"] / 512, abs=1e-4)
    assert s["would_start"] and s["remedies"] == [] and s["engine_version"] == s["modelled_version"]
    assert (
        s["details"]["max_num_seqs"] == 1024 and s["details"]["max_num_batched_tokens"] == 8192
    )  # H100 defaults


def test_refusal_names_the_reason_and_checked_remedies():
    w = {"kind": "llm_serving", "model": {"source": "preset", "id": "llama-3.1-8b"}}
    s = budget(workloads=[w], device={"source": "catalog", "id": "l4-24gb"})["serving"]
    assert not s["would_start"]
    assert "max_model_len 131072 needs 16.00 GiB of KV cache" in s["reason"]
    lowered = next(r for r in s["remedies"] if r.startswith("lower max_model_len to "))
    length = int(lowered.split()[3])
    ok = budget(
        workloads=[{**w, "max_model_len": length}], device={"source": "catalog", "id": "l4-24gb"}
    )["serving"]
    assert ok["would_start"]
    too_long = budget(
        workloads=[{**w, "max_model_len": length + 1}],
        device={"source": "catalog", "id": "l4-24gb"},
    )["serving"]
    assert not too_long["would_start"]  # the remedy is the exact largest
    assert any(r.startswith("tensor parallel 2") for r in s["remedies"])


def test_no_memory_for_weights_is_refused():
    s = budget(
        workloads=[{"kind": "llm_serving", "model": {"source": "preset", "id": "llama-3.1-70b"}}],
        device=H100,
    )["serving"]
    assert not s["would_start"] and s["reason"].startswith("no available memory")
    assert s["kv_cache_tokens"] == 0


def test_pipeline_stages_get_one_budget_each():
    b = budget(
        workloads=[
            {
                "kind": "llm_serving",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "parallelism": {"pipeline": 4},
                "max_model_len": 8192,
            }
        ],
        device=H100,
    )
    assert [d["label"] for d in b["devices"]] == [f"pipeline stage {i}" for i in range(4)]
    weights = [
        next(ln["bytes"] for ln in d["lines"] if ln["component"] == "weights") for d in b["devices"]
    ]
    assert weights[0] > weights[1] and weights[3] > weights[1]  # embeddings / LM head


# --------------------------------------------------------------------------- wire rules --

LLAMA = {"source": "preset", "id": "llama-3.1-8b"}


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        (
            {
                "workloads": [{"kind": "llm_serving", "model": LLAMA, "gpu_memory_utilization": 0}],
                "device": H100,
            },
            "$.workloads[0].gpu_memory_utilization",
            "Expected `float` > 0.0",
        ),
        (
            {
                "workloads": [
                    {"kind": "llm_serving", "model": LLAMA, "gpu_memory_utilization": 1.5}
                ],
                "device": H100,
            },
            "$.workloads[0].gpu_memory_utilization",
            "<= 1.0",
        ),
        (
            {
                "workloads": [{"kind": "llm_serving", "model": LLAMA, "engine_version": "0.1"}],
                "device": H100,
            },
            "$.workloads[0].engine_version",
            "older than modelled: vllm releases 0.10.0 to 0.34.x are modelled",
        ),
        (
            {
                "workloads": [{"kind": "llm_serving", "model": LLAMA, "block_size": 24}],
                "device": H100,
            },
            "$.workloads[0].block_size",
            "allowed",
        ),
        (
            {
                "workloads": [{"kind": "llm_serving", "model": LLAMA, "kv_cache_dtype": "int4"}],
                "device": H100,
            },
            "$.workloads[0].kv_cache_dtype",
            "'fp8'",
        ),
        (
            {
                "workloads": [
                    {
                        "kind": "llm_serving",
                        "model": LLAMA,
                        "quantization": {"method": "gptq", "applied_at_load": True},
                    }
                ],
                "device": H100,
            },
            "$.workloads[0].quantization",
            "applied_at_load needs method 'fp8'",
        ),
        (
            {"workloads": [{"kind": "llm_serving", "model": LLAMA}]},
            "$",
            "an llm_serving workload needs a device",
        ),
        (
            {
                "workloads": [
                    {"kind": "llm_serving", "model": LLAMA},
                    {"kind": "inference", "model": LLAMA},
                ],
                "device": H100,
            },
            "$",
            "must be the only workload",
        ),
        (
            {
                "workloads": [{"kind": "llm_serving", "model": LLAMA}],
                "device": H100,
                "method": "trace",
            },
            "$",
            "method 'analytic' only",
        ),
    ],
)
def test_bad_serving_input_is_422_with_field(body, field, text):
    with TestClient(create_app(Settings())) as c:
        r = c.post("/v1/budgets", json=body)
    assert r.status_code == 422, r.text
    assert any(e["field"] == field and text in e["message"] for e in r.json()["errors"]), r.json()


@pytest.mark.parametrize(
    ("workload", "field", "text"),
    [
        ({"parallelism": {"tensor": 3}}, "workloads[0].parallelism.tensor", "must divide"),
        (
            {"max_num_seqs": 512, "max_num_batched_tokens": 256},
            "workloads[0].max_num_batched_tokens",
            "must be >= max_num_seqs (512)",
        ),
        (
            {"model": {"source": "preset", "id": "bert-base-uncased"}},
            "workloads[0].model",
            "needs a decoder",
        ),
    ],
)
def test_semantic_errors_are_invalid_workload(workload, field, text):
    body = {"workloads": [{"kind": "llm_serving", "model": LLAMA, **workload}], "device": H100}
    with TestClient(create_app(Settings())) as c:
        r = c.post("/v1/budgets", json=body)
    assert r.status_code == 422
    problem = r.json()
    assert problem["type"].endswith("invalid-workload")
    assert any(e["field"] == f"$.{field}" and text in e["message"] for e in problem["errors"]), (
        problem
    )


def test_fit_with_colocated_serving_is_422():
    with TestClient(create_app(Settings())) as c:
        r = c.post(
            "/v1/fits",
            json={
                "workloads": [
                    {"kind": "llm_serving", "model": LLAMA},
                    {"kind": "inference", "model": LLAMA},
                ]
            },
        )
    assert r.status_code == 422 and "must be the only workload" in r.text
