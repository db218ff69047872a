"""Write ``vrambudget/core/data/vllm_releases.json`` (what the code reads per vLLM minor
release) from ``research/data/vllm_versions.json`` (what was read from each release's source,
with file and line; research/vllm_versions.md quotes the lines).

    .venv/bin/python -m research.vllm_releases          # rewrite
    .venv/bin/python -m research.vllm_releases --check  # exit 1 when the file is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "research" / "data" / "vllm_versions.json"
TARGET = ROOT / "vrambudget" / "core" / "data" / "vllm_releases.json"
GiB = 1 << 30


def _defaults(v: dict[str, Any]) -> dict[str, Any]:
    b = v["batch_defaults"]
    seqs, tokens = b["max_num_seqs"], b["max_num_batched_tokens"]
    out: dict[str, Any] = {
        "large_gpu_min_bytes": int(b["large_gpu_min_gib"] * GiB),
        # "gb10 (cc 12.1)" -> the catalog name's token
        "large_gpu_excluded": [x.split(" ")[0] for x in b["large_gpu_excluded"]],
        "max_num_seqs_large": seqs["api_server"]["large"],
        "max_num_seqs_small": seqs["api_server"]["small"],
        "max_num_batched_tokens_large": {
            k: tokens[k]["large"] for k in ("api_server", "llm_class")
        },
        "max_num_batched_tokens_small": {
            k: tokens[k]["small"] for k in ("api_server", "llm_class")
        },
        "block_size": v["block_size_default"],
        "source": "vllm/engine/arg_utils.py get_batch_defaults / _set_default_args "
        f"({v['version']}); research/vllm_versions.md",
    }
    if b.get("xlarge_gpu_min_gib"):
        out["xlarge_gpu_min_bytes"] = int(b["xlarge_gpu_min_gib"] * GiB)
        out["max_num_seqs_xlarge"] = seqs["api_server"]["xlarge"]
        out["max_num_batched_tokens_xlarge"] = {
            k: tokens[k]["xlarge"] for k in ("api_server", "llm_class")
        }
    return out


def summary(v: dict[str, Any], extensible: bool) -> str:
    """The release's memory rules in one line (the answer's ``calibration`` quotes it)."""
    util = v["gpu_memory_utilization_default"]
    parts = [
        "requested = ceil(total x util)"
        if str(v["requested"]).startswith("ceil")
        else "requested = total x util (unrounded)",
        f"util default {util}" if util is not None else "util default 1.0",
        {
            "outside": "CUDA graphs outside the KV budget",
            "estimated_logged": "CUDA-graph estimate logged, not subtracted",
            "estimated_subtracted": "CUDA-graph estimate subtracted",
        }[v["cudagraph"]],
        f"block {v['block_size_default']}",
    ]
    if not v["init_snapshot_after_nccl"]:
        parts.append("NCCL buffers inside the budget (snapshot before NCCL init)")
    if extensible:
        parts.append("extensible KV cache sized after warm-up and graph capture")
    parts.append(
        {
            "flashinfer_if_installed": "sampler warm-up sorts the vocabulary unless flashinfer "
            "is installed",
            "torch_sort": "sampler warm-up sorts the vocabulary",
            "triton": "sampler warm-up without a sort (Triton top-k/top-p)",
        }[v["top_k_top_p"]]
    )
    if v["batch_defaults"].get("xlarge_gpu_min_gib"):
        parts.append(f">= {v['batch_defaults']['xlarge_gpu_min_gib']} GiB batch tier")
    return "; ".join(parts)


def release(v: dict[str, Any]) -> dict[str, Any]:
    util = v["gpu_memory_utilization_default"]
    extensible = v["version"] >= "0.34" and util is None
    return {
        "version": v["version"],
        "released": v["released"],
        "cudagraph": v["cudagraph"],
        "kv_cache_memory_flag": v["kv_cache_memory_flag"],
        "hybrid_kv_cache_manager": bool(v["hybrid_kv_cache_manager_default"]),
        "defaults": _defaults(v),
        "summary": summary(v, extensible),
        "sources": [f"{s['file']}:{s['line']} ({s['rule']})" for s in v["sources"]],
        "gpu_memory_utilization_default": util if util is not None else 0.92,
        "requested_ceil": str(v["requested"]).startswith("ceil"),
        "nccl_in_budget": not v["init_snapshot_after_nccl"],
        "extensible_kv_cache": extensible,
        "top_k_top_p": v["top_k_top_p"],
        "moe_workspace_persistent": v["moe_workspace_persistent"],
        "cudagraph_steps": v["cudagraph_capture"]["steps"],
        "cudagraph_largest_blackwell": v["cudagraph_capture"]["largest_blackwell"],
        "full_decode_graphs": v["cudagraph_capture"]["full_decode_graphs"],
        "cudagraph_appends_batched_tokens": v["cudagraph_capture"][
            "appends_max_num_batched_tokens"
        ],
        "cudagraph_appends_max_num_seqs": v["cudagraph_capture"]["appends_max_num_seqs"],
    }


def build() -> str:
    data = json.loads(SOURCE.read_text())
    releases = sorted(
        (release(v) for v in data["versions"]),
        key=lambda r: tuple(int(x) for x in r["version"].split(".")),
    )
    doc = {
        "schema": "vrambudget.vllm_releases/1",
        "note": "Generated by research/vllm_releases.py from research/data/vllm_versions.json; "
        "do not edit by hand.",
        "releases": releases,
    }
    return json.dumps(doc, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = build()
    if "--check" in args:
        return 0 if TARGET.read_text() == text else 1
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
