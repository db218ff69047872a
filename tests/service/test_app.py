"""Comparisons (service/budget/compare.py) and calibration profiles: the measurement-to-
component mapping checked by hand on a CUDA-shaped report, degraded reports, the API, and the
calibration round trip (store -> ``vrambudget calibrate`` -> profile directory -> budget)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from tests.support.reports import cuda_report
from vrambudget.core.catalog import preset
from vrambudget.core.compare import compare, estimate_input
from vrambudget.core.estimate import estimate
from vrambudget.core.probe_report import ProbeResource
from vrambudget.core.spec import Headroom
from vrambudget.service.app import Settings, create_app


def _compare(report: ProbeResource) -> Any:
    inp = estimate_input(report)
    budget = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
    return compare(report, {"analytic": budget}, inp), budget


# ------------------------------------------------------------------------------ the API ----


def test_api_comparison_of_a_report_and_its_errors() -> None:
    report = cuda_report()
    body = msgspec.json.encode(report)
    with TestClient(create_app()) as client:
        r = client.post("/v1/comparisons", content=body)
        assert r.status_code == 200, r.text
        assert r.json() == json.loads(msgspec.json.encode(_compare(report)[0]))
        r = client.post("/v1/comparisons?tolerance_percent=101", content=body)
        assert r.status_code in (400, 422) and "tolerance_percent" in r.text
        r = client.post("/v1/comparisons?gpu=nope", content=body)
        assert r.status_code == 422 and "$.gpu" in r.text
        failed = msgspec.json.encode(msgspec.structs.replace(report, status="failed"))
        r = client.post("/v1/comparisons", content=failed)
        assert r.status_code == 422 and "$.status" in r.text
        r = client.post("/v1/comparisons", content=b'{"id": 1}')
        assert r.status_code == 422


def test_a_bad_profile_directory_stops_the_service(tmp_path: Path) -> None:
    from vrambudget.service.app import SettingsError

    (tmp_path / "x.json").write_text('{"id": "x"}')
    with pytest.raises(SettingsError, match="VRAMBUDGET_PROFILES_DIR"):
        Settings(profiles_dir=str(tmp_path))
    with pytest.raises(SettingsError, match="does not exist"):
        Settings(profiles_dir=str(tmp_path / "missing"))


def test_settings_from_env(monkeypatch):
    from vrambudget.service.app import Settings

    assert Settings.from_env() == Settings()
    monkeypatch.setenv("VRAMBUDGET_PORT", "9001")
    assert Settings.from_env().port == 9001


LLAMA = {"source": "preset", "id": "llama-3.1-8b"}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings(max_body_bytes=256 * 1024))) as c:
        yield c


def post_budget(client, **workload):
    body = {"workloads": [{"kind": "inference", "model": LLAMA, **workload}]}
    return client.post("/v1/budgets", json=body)


def test_budget_has_every_component_once(client):
    r = post_budget(client)
    assert r.status_code == 200
    device = r.json()["devices"][0]
    names = [line["component"] for line in device["lines"]]
    assert names == [
        "weights",
        "quantization_metadata",
        "adapters",
        "kv_cache",
        "activations",
        "logits",
        "gradients",
        "optimizer_state",
        "master_weights",
        "cuda_context",
        "runtime_workspace",
        "communication_buffers",
        "allocator_overhead",
        "headroom",
    ]
    assert all(isinstance(line["bytes"], int) and line["source"] for line in device["lines"])
    assert device["total_bytes"] == sum(line["bytes"] for line in device["lines"])


@pytest.mark.parametrize(
    ("workload", "field", "text"),
    [
        (
            {"batch_size": 0},
            "$.workloads[0].batch_size",
            "Expected `int` >= 1; allowed range: 1 .. 16777216",
        ),
        (
            {"prompt_tokens": 10**15},
            "$.workloads[0].prompt_tokens",
            "Expected `int` <= 1099511627776; allowed range: 1 .. 1099511627776",
        ),
        ({"batch_size": "4"}, "$.workloads[0].batch_size", "Expected `int`, got `str`"),
        ({"batch_szie": 2}, "$.workloads[0]", "unknown field `batch_szie`"),
        (
            {"attention": "fast"},
            "$.workloads[0].attention",
            "Invalid enum value 'fast'; allowed: 'eager', 'flash', 'sdpa'",
        ),
        (
            {"parallelism": {"tensor": 3}},
            "$.workloads[0].parallelism.tensor",
            "3 must divide the model's 32 attention heads",
        ),
        (
            {"parallelism": {"offload_parameters": True}},
            "$.workloads[0].parallelism",
            "offload_parameters needs zero_stage 3",
        ),
        (
            {"parallelism": {"offload_optimizer": True}},
            "$.workloads[0].parallelism",
            "offload_optimizer needs zero_stage >= 1",
        ),
    ],
)
def test_bad_input_is_422_problem_with_field_and_range(client, workload, field, text):
    r = post_budget(client, **workload)
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["status"] == 422
    assert any(e["field"] == field and text in e["message"] for e in problem["errors"]), problem


def test_unknown_model_type_is_named(client):
    body = {
        "workloads": [
            {
                "kind": "inference",
                "model": {"source": "hf_config", "config": {"model_type": "no_such_family"}},
            }
        ]
    }
    r = client.post("/v1/budgets", json=body)
    assert r.status_code == 422
    error = r.json()["errors"][0]
    assert error["field"] == "$.workloads[0].model.config.model_type"
    assert "'no_such_family'" in error["message"] and "transformers" in error["message"]


def test_a_config_transformers_refuses_is_a_422_naming_the_config(client):
    # Falcon's default 71 heads do not divide a hidden size of 4096: FalconConfig refuses it.
    body = {
        "workloads": [
            {
                "kind": "inference",
                "model": {
                    "source": "hf_config",
                    "config": {"model_type": "falcon", "hidden_size": 4096},
                },
            }
        ]
    }
    r = client.post("/v1/budgets", json=body)
    assert r.status_code == 422
    error = r.json()["errors"][0]
    assert error["field"] == "$.workloads[0].model.config"
    assert "transformers" in error["message"]


def test_a_family_without_a_closed_form_is_built_by_the_framework(client):
    # microsoft/phi-2's dimensions (config.json): 2,779,683,840 parameters (PhiForCausalLM).
    config = {
        "model_type": "phi",
        "architectures": ["PhiForCausalLM"],
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "vocab_size": 51200,
        "partial_rotary_factor": 0.4,
        "torch_dtype": "float16",
    }
    r = post_budget(client, model={"source": "hf_config", "config": config})
    assert r.status_code == 200, r.text
    summary = r.json()["workloads"][0]
    assert summary["num_params"] == 2_779_683_840
    assert "PhiForCausalLM" in summary["model"]["source"]
    assert summary["format"]["weights"] == "fp16"
    weights = next(
        line for line in r.json()["devices"][0]["lines"] if line["component"] == "weights"
    )
    # fp16 parameters plus the two fp32 rotary tables of 16 values (inv_freq, original_inv_freq)
    assert weights["bytes"] == 2_779_683_840 * 2 + 2 * 16 * 4


def test_inline_config_equals_preset(client):
    preset = client.get("/v1/models/llama-3.1-8b").json()["preset"]["config"]
    inline = post_budget(client, model={"source": "hf_config", "config": preset}).json()
    from_preset = post_budget(client).json()
    assert inline["devices"] == from_preset["devices"]


def test_huge_but_valid_values_give_exact_numbers(client):
    body = {
        "workloads": [
            {
                "kind": "inference",
                "model": {
                    "source": "dimensions",
                    "hidden_size": 4096,
                    "num_layers": 1024,  # the most layers the schema allows
                    "num_attention_heads": 32,
                    "intermediate_size": 11008,
                    "vocab_size": 32000,
                },
                "prompt_tokens": 2**40,
                "generated_tokens": 0,
                "batch_size": 2**24,
            }
        ]
    }
    r = client.post("/v1/budgets", json=body)
    assert r.status_code == 200
    kv = next(
        line["bytes"] for line in r.json()["devices"][0]["lines"] if line["component"] == "kv_cache"
    )
    assert kv == 1024 * 2 * 32 * 128 * 2 * 2**40 * 2**24


def test_malformed_json_and_oversized_body(client):
    r = client.post("/v1/budgets", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/problem")
    r = client.post(
        "/v1/budgets", content=b" " * (300 * 1024), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413


def test_catalog_endpoints(client):
    gpus = client.get("/v1/gpus").json()
    assert len(gpus) >= 25
    one = client.get(f"/v1/gpus/{gpus[0]['id']}").json()
    assert one == gpus[0]
    assert client.get("/v1/gpus/nope").status_code == 404
    models = client.get("/v1/models").json()
    assert len(models) >= 30
    llama = next(m for m in models if m["id"] == "llama-3.1-8b")
    assert llama["kv_cache_bytes_per_token_bf16"] == 131_072
    assert client.get("/v1/models/nope").status_code == 404


def test_fits_whole_catalog(client):
    body = {"workloads": [{"kind": "inference", "model": LLAMA}], "device_counts": [1, 2]}
    r = client.post("/v1/fits", json=body)
    assert r.status_code == 200
    gpus, excluded = r.json()["gpus"], r.json()["excluded"]
    # Every catalog GPU is either offered or excluded with its reason: under the current
    # releases (torch's CUDA 13 wheels) the Volta V100s are not targeted.
    assert len(gpus) + len(excluded) == len(client.get("/v1/gpus").json())
    assert {e["gpu_id"] for e in excluded} == {"v100-sxm2-32gb", "v100-sxm2-16gb"}
    assert all(e["compatibility"]["checks"][0]["rule"] == "cuda.architecture" for e in excluded)
    for g in gpus:
        for layout in g["layouts"]:
            assert layout["fits"] == (layout["total_bytes"] <= layout["capacity_bytes"])
            assert layout["free_bytes"] == layout["capacity_bytes"] - layout["total_bytes"]


def test_ops_endpoints(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    post_budget(client)
    metrics = client.get("/metrics").text
    assert "vrambudget_requests_total" in metrics
    assert client.get("/schema").status_code == 200


def test_repeated_request_same_answer_and_errors_not_cached(client):
    first = post_budget(client, batch_size=7).content
    assert post_budget(client, batch_size=7).content == first
    assert post_budget(client, batch_size=0).status_code == 422
    assert post_budget(client, batch_size=0).status_code == 422


def test_fit_reports_models_too_large_for_any_layout(client):
    body = {
        "workloads": [{"kind": "inference", "model": {"source": "preset", "id": "deepseek-v3"}}],
        # An fp8 checkpoint: an sm89+ GPU (transformers dequantizes fp8 below 8.9).
        "devices": [{"source": "catalog", "id": "h100-pcie-80gb"}],
        "max_device_count": 8,
    }
    gpu = client.post("/v1/fits", json=body).json()["gpus"][0]
    assert gpu["min_device_count"] is None
    assert "does not fit on any layout of up to 8 devices" in gpu["warnings"][0]
    layout = gpu["layouts"][0]
    assert not layout["fits"] and layout["limiting_component"] == "weights"
    assert layout["maxima"]["batch_size"] == 0


def test_dtype_the_device_cannot_run_natively_is_warned(client):
    r = post_budget(client, precision={"weights": "bf16"})
    assert r.json()["warnings"] == []
    body = {
        "workloads": [{"kind": "inference", "model": LLAMA}],
        "device": {"source": "catalog", "id": "v100-sxm2-32gb"},
        # A CUDA 12.8 build still targets Volta (CUDA 13 does not): bf16 runs, emulated.
        "software": {"torch_version": "2.10.0"},
    }
    warnings = client.post("/v1/budgets", json=body).json()["warnings"]
    assert any("no native bf16 support" in w for w in warnings)
    fit_body = {
        "workloads": body["workloads"],
        "devices": [body["device"]],
        "software": body["software"],
    }
    gpu = client.post("/v1/fits", json=fit_body).json()["gpus"][0]
    assert any("no native bf16 support" in w for w in gpu["warnings"])


def test_colocated_parts_name_each_workload_that_holds_bytes(client):
    body = {
        "workloads": [
            {"kind": "inference", "model": LLAMA, "name": "chat"},
            {
                "kind": "inference",
                "model": {"source": "preset", "id": "bert-base-uncased"},
                "name": "embedder",
                "generated_tokens": 0,
            },
            {
                "kind": "generic",
                "name": "renderer",
                "assets": [{"name": "textures", "bytes": 10**9}],
            },
        ]
    }
    device = client.post("/v1/budgets", json=body).json()["devices"][0]
    by_component = {line["component"]: line for line in device["lines"]}
    weights = by_component["weights"]
    assert [p["name"] for p in weights["parts"]] == ["chat", "embedder", "renderer"]
    assert sum(p["bytes"] for p in weights["parts"]) == weights["bytes"]
    assert "parts" not in by_component["gradients"]  # nobody trains here
    # each workload is its own process with its own context, and the kernel images its ops
    # load after it (lazy module loading on NVIDIA): two parts per workload
    contexts = by_component["cuda_context"]["parts"]
    assert [p["name"] for p in contexts] == [
        f"{w}: {part}"
        for w in ("chat", "embedder", "renderer")
        for part in ("CUDA context", "kernel images loaded after the context")
    ]
    assert sum(p["bytes"] for p in contexts) == by_component["cuda_context"]["bytes"]


def test_presets_never_await_the_model_resolver(client, monkeypatch):
    """A request whose models need no resolution (presets, closed-form configs) goes to the
    compute workers with no resolutions, without the resolver: a budget, a fit and a
    comparison."""
    models = client.app.state.models
    compute = client.app.state.compute
    sent: list[tuple[str, Any]] = []
    run = compute.run

    async def resolve(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the resolver was awaited for presets")

    async def spy(task: str, payload: bytes, *args: Any) -> bytes:
        sent.append((task, args[-1]))
        return await run(task, payload, *args)

    monkeypatch.setattr(models, "resolve", resolve)
    monkeypatch.setattr(compute, "run", spy)
    inline = {"source": "hf_config", "config": dict(preset("llama-3.1-8b").config or {})}
    for model in (LLAMA, inline):
        body = {"workloads": [{"kind": "inference", "model": model, "batch_size": 3}]}
        assert client.post("/v1/budgets", json=body).status_code == 200
        assert client.post("/v1/fits", json={**body, "device_counts": [1]}).status_code == 200
    r = client.post("/v1/comparisons", content=msgspec.json.encode(cuda_report()))
    assert r.status_code == 200, r.text
    assert [task for task, _ in sent] == ["budget", "fit"] * 2 + ["comparison"]
    assert all(resolutions == () for _, resolutions in sent)


@pytest.mark.parametrize(
    ("device", "field", "text"),
    [
        (
            {"source": "catalog", "id": "rtx-4090-24gb", "memory_in_use_bytes": 25_386_352_640},
            "$.device.memory_in_use_bytes",
            "must be below the NVIDIA GeForce RTX 4090 24GB's 25386352640 bytes",
        ),
        (
            {"source": "catalog", "id": "rtx-4090-24gb", "memory_in_use_bytes": -1},
            "$.device.memory_in_use_bytes",
            "allowed range: 0 .. 1125899906842624",
        ),
        (
            {"source": "custom", "memory_total_bytes": 1000, "memory_in_use_bytes": 1000},
            "$.device.memory_in_use_bytes",
            "must be below the custom's 1000 bytes (got 1000)",
        ),
    ],
)
def test_memory_in_use_beyond_the_device_is_a_422_naming_it(client, device, field, text):
    body = {"workloads": [{"kind": "inference", "model": LLAMA}], "device": device}
    r = client.post("/v1/budgets", json=body)
    assert r.status_code == 422, r.text
    assert any(e["field"] == field and text in e["message"] for e in r.json()["errors"]), r.text
