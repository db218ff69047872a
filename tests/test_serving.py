"""llm_serving (vLLM): golden KV arithmetic against hand computation, the engine's start check,
the wire rules (4xx tables), the fits questions, and accuracy against published vLLM runs --
calibrate and held-out splits reported separately, each with its measured tolerance."""

from __future__ import annotations

from statistics import median

import msgspec
import pytest
from litestar.testing import TestClient

from vrambudget.service.app import Settings, create_app
from vrambudget.core.catalog import preset_arch
from vrambudget.core.fit import FitRequest, fit
from vrambudget.core.resolve import resolve_model
from vrambudget.core.serving import kv
from research.vllm_runs import compare, load_runs, run_request, summary
from vrambudget.core.serving.vllm import account
from vrambudget.core.spec import BudgetRequest, DimensionsModel, LLMServingWorkload
from vrambudget.core.units import GiB

H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}


def serving(model: str, **fields: object) -> LLMServingWorkload:
    return msgspec.convert({"kind": "llm_serving", "model": {"source": "preset", "id": model},
                            **fields}, LLMServingWorkload)


# ----------------------------------------------------------------- golden KV arithmetic --


def test_gqa_llama3_8b_is_131072_bytes_per_token():
    # 32 layers x 2 (K, V) x 8 KV heads x 128 head_dim x 2 bytes.
    specs = kv.layer_specs(preset_arch("llama-3.1-8b"), 1, 2)
    assert kv.per_token_bytes(specs) == 32 * 2 * 8 * 128 * 2 == 131_072
    assert kv.page_size_bytes(specs[0], 16) == 2 * 16 * 8 * 128 * 2 == 65_536
    # TP 2 halves the KV heads; TP 16 > 8 KV heads keeps one (replicated) head per rank.
    assert kv.per_token_bytes(kv.layer_specs(preset_arch("llama-3.1-8b"), 2, 2)) == 65_536
    assert kv.per_token_bytes(kv.layer_specs(preset_arch("llama-3.1-8b"), 16, 2)) == 16_384


def test_mqa_one_kv_head():
    arch = resolve_model(DimensionsModel(hidden_size=4096, num_layers=10, num_attention_heads=32,
                                         num_key_value_heads=1, intermediate_size=11008,
                                         vocab_size=32000))
    # 10 layers x 2 x 1 head x 128 x 2 bytes; any TP keeps the one head on every rank.
    assert kv.per_token_bytes(kv.layer_specs(arch, 1, 2)) == 10 * 2 * 1 * 128 * 2 == 5_120
    assert kv.per_token_bytes(kv.layer_specs(arch, 4, 2)) == 5_120


@pytest.mark.parametrize(("model", "layers"), [("deepseek-v2-lite", 27), ("deepseek-v3", 61)])
def test_mla_caches_the_latent_not_split_by_tp(model, layers):
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes per layer, one "head", any TP.
    arch = preset_arch(model)
    for t in (1, 4):
        assert kv.per_token_bytes(kv.layer_specs(arch, t, 2)) == (512 + 64) * 2 * layers
    assert kv.page_size_bytes(kv.layer_specs(arch, 1, 2)[0], 16) == 16 * 576 * 2 == 18_432


def test_sliding_window_gemma2_groups_and_blocks():
    # Gemma 2 9B: 21 sliding (4096) + 21 full layers, 8 KV heads x 256: page 16 x 2 x 8 x 256 x
    # 2 = 131,072 B. Equal counts: group_size 21, two groups.
    g = kv.kv_groups(preset_arch("gemma-2-9b"), 1, 1, 2, 16, True)
    assert g.num_groups == 2 and g.stage_group_size(0) == 21 and g.page_bytes == 131_072
    # A request of 8,192 tokens: full 8192/16 = 512 blocks; sliding min(4095 + 8192, 8192)/16
    # + 1 = 513 blocks.
    assert kv.blocks_per_request(g, 8192, 8192) == 512 + 513
    # The hybrid manager off caches the sliding layers as full attention: one group.
    assert kv.kv_groups(preset_arch("gemma-2-9b"), 1, 1, 2, 16, False).num_groups == 1


def test_sliding_window_gemma3_five_to_one():
    # Gemma 3 27B: 52 sliding (1024) + 10 full; group_size 10 -> 6 sliding groups + 1 full.
    g = kv.kv_groups(preset_arch("gemma-3-27b"), 1, 1, 2, 16, True)
    assert g.num_groups == 7 and g.stage_group_size(0) == 10
    # vLLM 0.19.0 logged 15,997 blocks -> 15,997 // 7 x 16 = 36,560 tokens; 15,997 / (512 +
    # 6 x 513) = 4.46x.
    assert kv.num_tokens(15_997, g) == 36_560
    assert round(kv.max_concurrency(15_997, g, 8192, 8192), 2) == 4.46


def test_mistral_all_sliding_is_one_sliding_group():
    g = kv.kv_groups(preset_arch("mistral-7b-v0.1"), 1, 1, 2, 16, True)
    assert g.num_groups == 1
    # min(4095 + 2048, 32768) = 6143 tokens -> cdiv(6143, 16) + 1 = 385 blocks per request.
    assert kv.blocks_per_request(g, 32768, 2048) == 385


def test_block_alignment():
    # get_num_blocks floors to whole blocks of all layers: one byte short of 10 blocks is 9.
    page, layers = 65_536, 32
    assert kv.num_blocks(10 * page * layers - 1, page, layers) == 9
    assert kv.num_blocks(10 * page * layers, page, layers) == 10
    g = kv.kv_groups(preset_arch("llama-3.1-8b"), 1, 1, 2, 16, True)
    assert kv.num_tokens(10, g) == 160  # tokens are whole blocks
    # A request of 8,193 tokens needs 513 blocks, not 512.0625.
    assert kv.blocks_per_request(g, 8193, 8192) == 513


def test_fp8_kv_doubles_tokens_not_bytes():
    a16 = account(serving("llama-3.1-8b", max_model_len=8192), preset_arch("llama-3.1-8b"),
                  80 * GiB, "H100")
    a8 = account(serving("llama-3.1-8b", max_model_len=8192, kv_cache_dtype="fp8"),
                 preset_arch("llama-3.1-8b"), 80 * GiB, "H100")
    assert a8.stages[0].available_bytes == a16.stages[0].available_bytes  # same budget
    assert a8.num_blocks in (2 * a16.num_blocks, 2 * a16.num_blocks + 1)
    assert a8.kv_tokens in (2 * a16.kv_tokens, 2 * a16.kv_tokens + 16)
    assert abs(a8.pool_bytes(a8.stages[0]) - a16.pool_bytes(a16.stages[0])) <= 65_536 * 32


def _hf(model_type: str = "llama", **keys: object):
    from vrambudget.core.families import arch_from_hf_config
    from vrambudget.core.hf_config import HFConfig

    base = {"model_type": model_type, "hidden_size": 1024, "num_hidden_layers": 2,
            "num_attention_heads": 8, "intermediate_size": 2048, "vocab_size": 1000,
            "max_position_embeddings": 4096}
    return arch_from_hf_config(msgspec.convert({**base, **keys}, HFConfig))


@pytest.mark.parametrize(("rope", "rows"), [
    (None, 4096),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 4096),
    ({"rope_type": "linear", "factor": 8.0}, 4096 * 8),
    ({"type": "linear", "factor": 2.5}, 10_240),  # the older key; 4096 x 2.5
    ({"rope_type": "dynamic", "factor": 2.0}, 8192),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 4096),
    ({"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 2048}, 6144),
    ({"rope_type": "longrope", "factor": 32.0, "original_max_position_embeddings": 1024,
      "short_factor": [1.0], "long_factor": [2.0]}, 1024 + 4096),
])
def test_rotary_table_rows_follow_the_rope_type(rope, rows):
    from vrambudget.core.serving.rope import rope_table_positions, rotary_cache_bytes

    arch = _hf(**({} if rope is None else {"rope_scaling": rope}))
    assert rope_table_positions(arch) == rows
    assert rotary_cache_bytes(arch, 2) == rows * 128 * 2  # head_dim 1024 / 8 = 128, bf16


def test_gemma3_rotary_tables_local_and_linear_global():
    # Two tables: local layers' default rope (131,072 rows) and the global layers' linear x 8
    # (1,048,576 rows), x head_dim 256 x 2 bytes. 27B has head_dim 128.
    from vrambudget.core.serving.rope import rotary_cache_bytes

    assert rotary_cache_bytes(preset_arch("gemma-3-4b"), 2) == (131_072 + 1_048_576) * 256 * 2
    assert rotary_cache_bytes(preset_arch("gemma-3-4b"), 2) == 603_979_776
    assert rotary_cache_bytes(preset_arch("gemma-3-27b"), 2) == (131_072 + 1_048_576) * 128 * 2


def test_load_rounding_gemma2_2b_is_27_mib():
    # vLLM's weights memory counts caching-allocator blocks. Gemma 2 2B: each fused gate_up_proj
    # is 2 x 9216 x 2304 x 2 B = 81 MiB exactly; its segment rounds to 82 MiB and the 1 MiB
    # remainder is not split (should_split: remaining > 1 MiB), so +1 MiB x 26 layers; the
    # embedding, 256000 x 2304 x 2 B = 1125 MiB, gets 1126 MiB: +1 MiB. Every other tensor
    # splits or is exact. Measured "Model loading took 4.90 GiB" (the sweep's run).
    from vrambudget.core.serving.load import load_memory

    (lm,) = load_memory(preset_arch("gemma-2-2b"), 2, None, 1, 1, 1)
    assert lm.rounding_bytes == 27 * (1 << 20)
    assert round(lm.allocated_bytes / GiB, 2) == 4.90


def test_load_memory_deepseek_v2_lite_matches_vllm_0_5_and_0_19():
    # Without the MLA import workspace the replay gives 29.3010 GiB at TP1: vLLM 0.5.0 logged
    # "Loading model weights took 29.3010 GB" (GiB) for DeepSeek-V2-Lite (vllm PR #4650), before
    # any MLA backend allocated a workspace at import. 0.19.0 adds FlashInfer-MLA's 128 MiB on
    # every GPU: 29.43 / 14.84 / 7.51 GiB at TP1 / 2 / 4 (logged: 29.43 / 14.83 / 7.51).
    from vrambudget.core.serving.load import MLA_IMPORT_WORKSPACE_BYTES, load_memory

    arch = preset_arch("deepseek-v2-lite")
    (bare,) = load_memory(arch, 2, None, 1, 1, 1)
    assert f"{bare.allocated_bytes / GiB:.4f}" == "29.3010"
    assert MLA_IMPORT_WORKSPACE_BYTES == 128 << 20
    logged = []
    for t in (1, 2, 4):
        w = serving("deepseek-v2-lite", max_model_len=8192, parallelism={"tensor": t})
        a = account(w, arch, 85_045_477_376, "NVIDIA H100 80GB HBM3")
        assert a.stages[0].load_workspace_bytes == MLA_IMPORT_WORKSPACE_BYTES
        logged.append(round(a.stages[0].weights_memory_bytes / GiB, 2))
    assert logged == [29.43, 14.84, 7.51]


@pytest.mark.parametrize(("gpu", "workspaces"), [
    ("NVIDIA H100 80GB HBM3", 1), ("NVIDIA B200 180GB", 2), ("AMD Instinct MI300X 192GB", 0),
    ("my custom GPU", 1)])
def test_mla_import_workspaces_per_platform(gpu, workspaces):
    # FlashInfer-MLA's module allocates on import on any CUDA GPU; CUTLASS-MLA's (sm100 list
    # only) too on compute capability 10.x; ROCm imports neither.
    from vrambudget.core.serving.vllm import mla_import_workspaces

    assert mla_import_workspaces(gpu) == workspaces


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen2.5-7b", "mixtral-8x7b",
                                   "qwen3-30b-a3b", "deepseek-v2-lite", "gemma-3-4b",
                                   "gemma-2-9b", "phi-4", "granite-3.1-8b", "qwen1.5-moe-a2.7b"])
def test_load_replay_holds_exactly_the_tensors_and_rotary_tables(model):
    # The replay allocates the same bytes the budget's weights line counts: the parameters on
    # each stage (inventory x dtype) plus the rotary tables; only their blocks differ.
    from vrambudget.core.serving.load import load_memory
    from vrambudget.core.serving.rope import rotary_cache_bytes
    from vrambudget.core.serving.vllm import _statics
    from vrambudget.core.spec import Parallelism

    arch = preset_arch(model)
    for t, p in ((1, 1), (2, 2)):
        try:
            statics = _statics(arch, "bf16", None, Parallelism(tensor=t, pipeline=p))
        except Exception:  # noqa: BLE001 - a layout the model cannot take
            continue
        loads = load_memory(arch, 2, None, t, p, 1)
        for st, lm in zip(statics, loads, strict=True):
            assert lm.tensor_bytes == st.weights_bytes + rotary_cache_bytes(arch, 2), (t, p)
            assert 0 <= lm.rounding_bytes < 2 * (1 << 20) * (st.stage.num_layers * 8 + 4)


def test_rope_scaling_as_published_is_read_leniently():
    from vrambudget.core.serving.rope import rope_table_positions

    # A factor that is absent or not above 0 scales nothing (no 422: configs are pasted).
    assert rope_table_positions(_hf(rope_scaling={"rope_type": "linear", "factor": 0})) == 4096
    assert rope_table_positions(_hf(rope_scaling={"rope_type": "linear"})) == 4096
    # yarn without an original length: transformers takes max_position_embeddings.
    assert rope_table_positions(_hf(rope_scaling={"rope_type": "yarn", "factor": 2.0})) == 8192
    # Phi-3 128k: longrope ("su" in older files) with factor lists and the original length at
    # the top level: the short (4096) and long (max) tables.
    for kind in ("longrope", "su"):
        arch = _hf("phi3", max_position_embeddings=131072, original_max_position_embeddings=4096,
                   rope_scaling={"type": kind, "short_factor": [1.0], "long_factor": [1.5]})
        assert rope_table_positions(arch) == 4096 + 131072
    with pytest.raises(msgspec.ValidationError, match="rope_scaling.factor"):
        _hf(rope_scaling={"rope_type": "linear", "factor": "eight"})  # not a number: 422


def test_gemma3_pipeline_stage_builds_only_the_ropes_its_layers_use():
    # Each stage is its own process: a stage with no global layer builds only the local table.
    from vrambudget.core.serving.load import load_memory

    arch = preset_arch("gemma-3-4b")  # 34 layers, global every 6th (indices 5, 11, ...)
    local, scaled = 131_072 * 256 * 2, 1_048_576 * 256 * 2
    stages = load_memory(arch, 2, None, 1, 8, 1)
    held = [lm.rotary_bytes for lm in stages]
    assert set(held) <= {local, local + scaled}
    assert local in held and local + scaled in held
    w = serving("gemma-3-4b", max_model_len=8192, parallelism={"pipeline": 8})
    a = account(w, arch, 85_045_477_376, "NVIDIA H100 SXM5 80GB")
    assert [s.rotary_bytes for s in a.stages] == held


# ---------------------------------------------------------------- engine start and budget --


def budget(**body: object) -> dict:
    with TestClient(create_app(Settings())) as c:
        r = c.post("/v1/budgets", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_budget_lines_sum_to_the_device_and_kv_is_the_pool():
    b = budget(workloads=[{"kind": "llm_serving", "model": {"source": "preset",
                                                            "id": "llama-3.1-8b"},
                           "max_model_len": 8192, "gpu_memory_utilization": 0.95}], device=H100)
    s = b["serving"]
    dev = b["devices"][0]
    lines = {ln["component"]: ln["bytes"] for ln in dev["lines"]}
    assert len(dev["lines"]) == 14
    assert dev["total_bytes"] == sum(lines.values()) == 85_045_477_376
    assert lines["kv_cache"] == s["kv_cache_pool_bytes"] == s["num_gpu_blocks"] * 65_536 * 32
    assert s["kv_cache_tokens"] == s["num_gpu_blocks"] * 16
    assert s["max_concurrency"] == pytest.approx(s["num_gpu_blocks"] / 512, abs=1e-4)
    assert s["would_start"] and s["remedies"] == [] and s["engine_version"] == "0.19.0"
    assert s["max_num_seqs"] == 1024 and s["max_num_batched_tokens"] == 8192  # H100 defaults


def test_refusal_names_the_reason_and_checked_remedies():
    w = {"kind": "llm_serving", "model": {"source": "preset", "id": "llama-3.1-8b"}}
    s = budget(workloads=[w], device={"source": "catalog", "id": "l4-24gb"})["serving"]
    assert not s["would_start"]
    assert "max_model_len 131072 needs 16.00 GiB of KV cache" in s["reason"]
    lowered = next(r for r in s["remedies"] if r.startswith("lower max_model_len to "))
    length = int(lowered.split()[3])
    ok = budget(workloads=[{**w, "max_model_len": length}],
                device={"source": "catalog", "id": "l4-24gb"})["serving"]
    assert ok["would_start"]
    too_long = budget(workloads=[{**w, "max_model_len": length + 1}],
                      device={"source": "catalog", "id": "l4-24gb"})["serving"]
    assert not too_long["would_start"]  # the remedy is the exact largest
    assert any(r.startswith("tensor parallel 2") for r in s["remedies"])


def test_no_memory_for_weights_is_refused():
    s = budget(workloads=[{"kind": "llm_serving", "model": {"source": "preset",
                                                            "id": "llama-3.1-70b"}}],
               device=H100)["serving"]
    assert not s["would_start"] and s["reason"].startswith("no available memory")
    assert s["kv_cache_tokens"] == 0


def test_pipeline_stages_get_one_budget_each():
    b = budget(workloads=[{"kind": "llm_serving", "model": {"source": "preset",
                                                            "id": "llama-3.1-8b"},
                           "parallelism": {"pipeline": 4}, "max_model_len": 8192}], device=H100)
    assert [d["label"] for d in b["devices"]] == [f"pipeline stage {i}" for i in range(4)]
    weights = [next(ln["bytes"] for ln in d["lines"] if ln["component"] == "weights")
               for d in b["devices"]]
    assert weights[0] > weights[1] and weights[3] > weights[1]  # embeddings / LM head


# --------------------------------------------------------------------------- wire rules --

LLAMA = {"source": "preset", "id": "llama-3.1-8b"}


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA, "gpu_memory_utilization": 0}],
          "device": H100}, "$.workloads[0].gpu_memory_utilization", "Expected `float` > 0.0"),
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA, "gpu_memory_utilization": 1.5}],
          "device": H100}, "$.workloads[0].gpu_memory_utilization", "<= 1.0"),
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA, "engine_version": "0.1"}],
          "device": H100}, "$.workloads[0].engine_version", "'0.19.0'"),
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA, "block_size": 24}],
          "device": H100}, "$.workloads[0].block_size", "allowed"),
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA, "kv_cache_dtype": "int4"}],
          "device": H100}, "$.workloads[0].kv_cache_dtype", "'fp8'"),
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA,
                         "quantization": {"method": "gptq", "applied_at_load": True}}],
          "device": H100}, "$.workloads[0].quantization", "applied_at_load needs method 'fp8'"),
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA}]}, "$",
         "an llm_serving workload needs a device"),
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA},
                        {"kind": "inference", "model": LLAMA}], "device": H100}, "$",
         "must be the only workload"),
        ({"workloads": [{"kind": "llm_serving", "model": LLAMA}], "device": H100,
          "method": "trace"}, "$", "method 'analytic' only"),
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
        ({"max_num_seqs": 512, "max_num_batched_tokens": 256},
         "workloads[0].max_num_batched_tokens", "must be >= max_num_seqs (512)"),
        ({"model": {"source": "preset", "id": "bert-base-uncased"}}, "workloads[0].model",
         "needs a decoder"),
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
        problem)


# --------------------------------------------------------------------------------- fits --


def fit_request(**body: object) -> FitRequest:
    return msgspec.convert(body, FitRequest)


def test_smallest_gpu_count_and_largest_max_model_len_are_exact():
    w = {"kind": "llm_serving", "model": {"source": "preset", "id": "llama-3.1-70b"},
         "max_model_len": 32768}
    req = fit_request(workloads=[w], devices=[H100], device_counts=[2, 4],
                      solve=["device_count", "max_model_len", "concurrency"],
                      target_concurrency=8)
    g = fit(req).gpus[0]
    by_n = {lay.device_count: lay for lay in g.layouts}
    assert not by_n[2].fits and by_n[4].fits and g.min_device_count == 4
    h100 = 85_045_477_376
    arch = preset_arch("llama-3.1-70b")
    best = by_n[4].maxima.max_model_len
    four = {"tensor": 4}

    def conc(length: int) -> float:
        a = account(serving("llama-3.1-70b", parallelism=four, max_model_len=length), arch,
                    h100, "NVIDIA H100 SXM5 80GB")
        return a.max_concurrency if a.would_start else 0.0

    assert conc(best) >= 8 > conc(best + 1)
    assert by_n[4].maxima.concurrent_requests == int(by_n[4].maxima.max_concurrency)


def test_cheapest_gpu_by_price_or_total_memory():
    w = {"kind": "llm_serving", "model": {"source": "preset", "id": "llama-3.1-8b"},
         "max_model_len": 8192}
    devices = [H100, {"source": "catalog", "id": "l4-24gb"}]
    by_memory = fit(fit_request(workloads=[w], devices=devices, solve=["device_count"],
                                target_concurrency=4)).cheapest
    assert by_memory.basis == "total_memory" and by_memory.gpu_id == "l4-24gb"
    priced = fit(fit_request(workloads=[w], devices=devices, solve=["device_count"],
                             target_concurrency=4,
                             prices={"h100-sxm5-80gb": 1.0, "l4-24gb": 1.5})).cheapest
    assert priced.basis == "price" and priced.gpu_id == "h100-sxm5-80gb" and priced.cost == 1.0


def test_fit_with_colocated_serving_is_422():
    with TestClient(create_app(Settings())) as c:
        r = c.post("/v1/fits", json={"workloads": [
            {"kind": "llm_serving", "model": LLAMA}, {"kind": "inference", "model": LLAMA}]})
    assert r.status_code == 422 and "must be the only workload" in r.text


# ------------------------------------------------------------------------------ accuracy --


def _comparisons():
    out = []
    for run in load_runs():
        out += compare(run)
    return out


COMPARISONS = _comparisons()
H100_RUNS = [c for c in COMPARISONS if "H100" in next(
    r["gpu"] for r in load_runs() if r["id"] == c.run_id)]


def test_every_run_is_compared_or_left_out_with_a_reason():
    for run in load_runs():
        req = run_request(run)
        assert isinstance(req, str) and req or compare(run), run["id"]


@pytest.mark.parametrize("split", ["calibrate", "held_out"])
@pytest.mark.parametrize("quantity", ["kv_cache_tokens", "max_concurrency"])
def test_kv_tokens_and_concurrency_median_within_3_percent(split, quantity):
    s = summary(H100_RUNS, quantity, split)
    assert s["n"] >= 15
    assert s["median"] <= 0.03  # the target; measured: 0.05-0.17% (docs/ACCURACY.md)
    assert s["max"] <= 0.01  # measured tolerance of the worst run (0.93%)


def test_weights_per_gpu_within_half_a_percent():
    # The target, on every run (measured: max 0.13%, median 0.01%; docs/ACCURACY.md).
    weights = [c for c in H100_RUNS if c.quantity == "weights_gib"]
    assert len(weights) >= 40
    for c in weights:
        assert abs(c.error) <= 0.005, (c.run_id, c.predicted, c.measured)
    assert median(abs(c.error) for c in weights) < 0.001


@pytest.mark.parametrize("split", ["calibrate", "held_out"])
def test_activation_peak_median_within_3_percent(split):
    s = summary(H100_RUNS, "activation_peak_gib", split)
    assert s["n"] >= 10 and s["median"] <= 0.03
    assert s["max"] <= 0.12  # float32 Llama (one run), 11.8% under


def test_calibration_file_is_fresh():
    from research.calibrate_vllm import main

    assert main(["--check"]) == 0


def test_request_default_version_is_a_calibrated_one():
    from vrambudget.core.serving.calibration import (
        DEFAULT_ENGINE_VERSION,
        ENGINE_VERSIONS,
    )

    assert DEFAULT_ENGINE_VERSION in ENGINE_VERSIONS
    w = msgspec.convert({"workloads": [{"kind": "llm_serving", "model": LLAMA}],
                         "device": H100}, BudgetRequest).workloads[0]
    assert w.engine_version == DEFAULT_ENGINE_VERSION
