"""The engine-log parsers against real startup logs (research/data/engine_logs.json): every value
a log's ``measured`` holds is read back from its ``lines``, exactly (the log's rounded number
times its unit)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vrambudget.agent.engine.logs import GiB, MiB, parse_startup, rank_zero

LOGS = json.loads(
    (Path(__file__).parents[2] / "research" / "data" / "engine_logs.json").read_text()
)["logs"]
ENGINE_LOGS = [x for x in LOGS if x["engine"] in ("vllm", "sglang", "llama_cpp")]


def _device_mib(table: dict[str, Any]) -> float:
    total = 0.0
    for name, value in table.items():
        if name.startswith("CPU") or name.endswith("_Host"):
            continue
        total += sum(value) if isinstance(value, list) else value
    return total


def _expected(entry: dict[str, Any]) -> dict[str, Any]:
    m, out = entry["measured"], {}
    if entry["engine"] == "vllm":
        for key, field in (
            ("weights_gib", "weights_bytes"),
            ("kv_cache_gib", "kv_cache_bytes"),
            ("cuda_graph_gib", "cuda_graph_bytes"),
        ):
            if key in m:
                out[field] = round(m[key] * GiB)
        if "kv_cache_tokens" in m:
            out["kv_cache_tokens"] = m["kv_cache_tokens"]
        if "max_concurrency" in m:
            out["max_concurrency"] = m["max_concurrency"]
    elif entry["engine"] == "sglang":
        if "weights_gb" in m:
            out["weights_bytes"] = round(m["weights_gb"] * GiB)
        if "k_size_gb" in m:
            out["kv_cache_bytes"] = round((m["k_size_gb"] + m["v_size_gb"]) * GiB)
        if "kv_pools_gb" in m:  # the target's pools: those before the first "Memory pool end"
            pools = m["kv_pools_gb"][:2]
            out["kv_cache_bytes"] = round(sum(p["k_gb"] + p["v_gb"] for p in pools) * GiB)
        tokens = m.get("max_total_num_tokens", m.get("kv_cache_tokens"))
        if tokens is not None:
            out["kv_cache_tokens"] = tokens
        if "max_running_requests" in m:
            out["max_concurrency"] = m["max_running_requests"]
        graphs = m.get("cuda_graph_gb")
        if graphs is not None:
            total = sum(graphs.values()) if isinstance(graphs, dict) else graphs
            out["cuda_graph_bytes"] = round(total * GiB)
    else:
        out["weights_bytes"] = round(_device_mib(m["model_buffer_mib"]) * MiB)
        out["kv_cache_bytes"] = round(_device_mib(m["kv_buffer_mib"]) * MiB)
    return out


@pytest.mark.parametrize("entry", ENGINE_LOGS, ids=[x["id"] for x in ENGINE_LOGS])
def test_every_measured_value_is_read_back(entry: dict[str, Any]) -> None:
    got = parse_startup(entry["engine"], entry["lines"])
    want = _expected(entry)
    assert want, "each engine log measures something"
    for field, value in want.items():
        actual = getattr(got, field)
        if field in ("kv_cache_bytes", "cuda_graph_bytes", "weights_bytes"):
            # sums of two-decimal figures: the sum's float rounding, not the parser's
            assert actual == pytest.approx(value, abs=2), field
        else:
            assert actual == value, field
    assert all(line in entry["lines"] for line in got.lines)


def test_a_vllm_log_in_full() -> None:
    (entry,) = [x for x in LOGS if x["id"] == "vllm-demoenvl4-llama31-8b-32k-l4"]
    s = parse_startup("vllm", entry["lines"])
    assert s.weights_bytes == round(14.9889 * GiB) == 16_094_208_826
    assert s.kv_cache_bytes == round(4.75 * GiB)
    assert s.kv_cache_tokens == 38_944
    assert s.max_concurrency == 1.22
    assert s.cuda_graph_bytes == round(0.38 * GiB)
    assert len(s.lines) == 5


def test_llama_cpp_counts_device_buffers_only_and_the_slots() -> None:
    (entry,) = [x for x in LOGS if x["id"].startswith("llamacpp-ghghang2-v11-b7772")]
    s = parse_startup("llama_cpp", entry["lines"])
    assert s.weights_bytes == round(12036.68 * MiB)  # CUDA_Host's 1104.61 MiB left out
    assert s.kv_cache_bytes == round((1314.0 + 24.0) * MiB)
    assert s.kv_cache_tokens == 56064  # n_ctx, not n_ctx_seq nor n_ctx_train
    assert s.max_concurrency == 4.0  # n_seq_max


def test_llama_cpp_with_no_layer_on_the_gpu_reads_zero_device_bytes() -> None:
    """Builds of 2025 print ``llama_kv_cache_unified:``; with -ngl 0 only host buffers appear,
    so the device holds 0 bytes of weights and KV cache (known), not None (unread)."""
    s = parse_startup(
        "llama_cpp",
        [
            "load_tensors:   CPU_Mapped model buffer size =  3147.42 MiB",
            "llama_kv_cache_unified:        CPU KV buffer size =   576.00 MiB",
            "llama_context:      CUDA0 compute buffer size =   606.03 MiB",
        ],
    )
    assert s.weights_bytes == 0 and s.kv_cache_bytes == 0
    s = parse_startup(
        "llama_cpp", ["llama_kv_cache_unified:      CUDA0 KV buffer size =   576.00 MiB"]
    )
    assert s.kv_cache_bytes == round(576.0 * MiB) and s.weights_bytes is None


def test_other_ranks_lines_are_skipped() -> None:
    assert rank_zero("(Worker_TP0 pid=1) INFO [gpu_worker.py:1] Available KV cache memory: 1 GiB")
    assert not rank_zero("(Worker_TP1 pid=2) INFO Available KV cache memory: 2 GiB")
    assert not rank_zero("[2026-09-12 00:22:48 TP1] KV Cache is allocated.")
    assert not rank_zero("(EngineCore_DP1 pid=3) INFO GPU KV cache size: 5 tokens")
    s = parse_startup(
        "vllm",
        [
            "(Worker_TP1 pid=2) INFO 01-01 [gpu_worker.py:1] Available KV cache memory: 2.00 GiB",
            "(Worker_TP0 pid=1) INFO 01-01 [gpu_worker.py:1] Available KV cache memory: 1.00 GiB",
        ],
    )
    assert s.kv_cache_bytes == GiB


def test_nothing_logged_is_null_and_colours_are_ignored() -> None:
    s = parse_startup("sglang", ["\x1b[32mINFO\x1b[0m starting", "nothing here"])
    assert s.weights_bytes is None and s.kv_cache_tokens is None and s.lines == ()
    v = parse_startup(
        "vllm", ["\x1b[1;36m(EngineCore pid=1)\x1b[0m GPU KV cache size: 1,024 tokens"]
    )
    assert v.kv_cache_tokens == 1024
