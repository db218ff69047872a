"""The measured overheads in vrambudget/core/formulas/cuda_context.py and
vrambudget/core/compare/tiers.py, recomputed from the kept results of the GPU runs they come
from (research/data/gpu/): one H200 (2026-12-04) and one H100 SXM (2026-12-05), both torch
2.11.0+cu130, driver 580.159.04, 132 SMs. The two cards measured the same bytes outside the
allocator, so each constant holds on both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vrambudget.core.compare.tiers import STREAM_OUTSIDE_BYTES
from vrambudget.core.formulas.cuda_context import (
    CUDA_CONTEXT_EAGER_CURRENT_BYTES,
    EAGER_LIBRARY_IMAGES_BYTES,
    KERNEL_IMAGES_INFERENCE_BYTES,
    KERNEL_IMAGES_TRAINING_BYTES,
)

GPU = Path(__file__).resolve().parents[2] / "research" / "data" / "gpu"
CAMPAIGNS = {
    "h200": ("gpu_campaign_2026-12-04T164803_h200-sxm-141gb.json",),
    "h100": (
        "gpu_campaign_2026-12-05T192540_h100-sxm5-80gb.json",
        "gpu_campaign_2026-12-05T193345_h100-sxm5-80gb.json",
    ),
}
STACKS = {
    "h200": "stack_overheads_2026-12-04_h200-sxm-141gb.json",
    "h100": "stack_overheads_2026-12-05_h100-sxm5-80gb.json",
}
GPUS = pytest.mark.parametrize("gpu", sorted(CAMPAIGNS))


def _outside(gpu: str) -> dict[str, tuple[str, int, int]]:
    """Per workload: (kind, load threads, NVML per-process peak - max_memory_reserved() - the
    bare context), the basis of the comparison's ``unexplained`` quantity."""
    out = {}
    for name in CAMPAIGNS[gpu]:
        out |= _outside_in(json.loads((GPU / name).read_text()))
    return out


def _outside_in(doc: dict[str, Any]) -> dict[str, tuple[str, int, int]]:
    out = {}
    for entry in doc["reports"]:
        report: dict[str, Any] = entry["report"]
        res, req = report["result"], report["request"]
        if res is None or res["torch"] is None:
            continue
        nv, t = res["nvml"], res["torch"]
        outside = (
            nv["process_peak_used_bytes"] - t["reserved_peak_bytes"] - nv["cuda_context_bytes"]
        )
        out[entry["name"]] = (req["workload"]["kind"], req["concurrency"], outside)
    return out


@GPUS
def test_kernel_images_are_the_largest_measured_per_kind(gpu: str) -> None:
    runs = _outside(gpu)
    one = [(kind, b) for kind, threads, b in runs.values() if threads == 1]
    assert len([k for k, _ in one if k == "inference"]) == 6
    assert len([k for k, _ in one if k == "training"]) == {"h200": 7, "h100": 8}[gpu]
    assert max(b for k, b in one if k == "inference") == KERNEL_IMAGES_INFERENCE_BYTES
    assert max(b for k, b in one if k == "training") == KERNEL_IMAGES_TRAINING_BYTES


@GPUS
def test_each_further_load_thread_is_the_16_thread_excess_over_one(gpu: str) -> None:
    runs = _outside(gpu)
    kind, threads, sixteen = runs["framework-generate-16-streams"]
    assert (kind, threads) == ("inference", 16)
    single = runs["framework-generate"][2]
    assert round((sixteen - single) / 15) == STREAM_OUTSIDE_BYTES


@GPUS
def test_eager_context_and_cublas_images_from_the_eager_run(gpu: str) -> None:
    """Outside the allocator (NVML delta - reserved) after the context step, then after the
    first bf16 GEMM, under CUDA_MODULE_LOADING=EAGER."""
    eager = next(
        r for r in json.loads((GPU / STACKS[gpu]).read_text())["runs"] if r["mode"] == "EAGER"
    )
    steps = {s["step"]: s["nvml_delta"] - s["reserved"] for s in eager["steps"]}
    assert steps["context+first tensor"] == CUDA_CONTEXT_EAGER_CURRENT_BYTES
    gemm = steps["bf16 gemm"] - steps["context+first tensor"]
    assert gemm == EAGER_LIBRARY_IMAGES_BYTES
