"""SGLang's start-up footprint before it loads weights: no NCCL baseline on PCIe-only GPUs
(vrambudget/core/serving/engines_budget.py sglang_nccl_bytes), backed by the published
"Load weight begin. avail mem" lines (research/data/sglang_startup_logs.json)."""

from __future__ import annotations

import json
from pathlib import Path

from vrambudget.core.catalog import gpus
from vrambudget.core.serving.calibration import CALIBRATED_VERSION, calibration
from vrambudget.core.serving.engines_budget import sglang_nccl_bytes

DATA = Path(__file__).resolve().parents[2] / "research" / "data" / "sglang_startup_logs.json"
GiB = 1 << 30


def test_the_nccl_baseline_follows_the_fabric() -> None:
    cal = calibration(CALIBRATED_VERSION)
    nccl = round(cal.c("nccl_init_bytes"))
    assert nccl == 1 << 30  # vLLM 0.19's, fitted on H100 launches
    assert sglang_nccl_bytes(cal, 1, "nvlink") == sglang_nccl_bytes(cal, 1, "pcie") == 0
    assert sglang_nccl_bytes(cal, 4, "pcie") == 0
    assert sglang_nccl_bytes(cal, 8, "nvlink") == nccl


def test_pcie_tensor_parallel_starts_take_less_than_a_context_and_that_baseline() -> None:
    """2 x A100 80GB PCIe (0.5.8): 79.14 - 78.77 = 0.37 GiB before weights; 2 x RTX 3090
    (0.5.12, the GPU nothing else held): 23.59 - 23.06 = 0.53 GiB -- each under the 0.51 GiB
    context plus 1.0 GiB of NCCL the model kept before, and within 0.05 GiB of the context
    alone or under it."""
    cal = calibration(CALIBRATED_VERSION)
    context = round(cal.c("cuda_context_bytes"))
    logs = {entry["id"]: entry for entry in json.loads(DATA.read_text())["logs"]}
    total = {gpu_id: g.memory_total_bytes for gpu_id, g in gpus().items()}
    cases = {
        "sglang-issue-17680-2xa100-80gb-pcie-tp2": ("a100-pcie-80gb", 78.77),
        "mattbucci-2x3090-gemma4-12b-awq-tp2": ("rtx-3090-24gb", 23.06),
    }
    for log_id, (gpu_id, free_gib) in cases.items():
        entry = logs[log_id]
        assert entry["tp"] == 2 and entry["url"].startswith("https://github.com/")
        assert any(f"avail mem={free_gib:.2f} GB" in line for line in entry["lines"]), log_id
        footprint = total[gpu_id] - free_gib * GiB
        assert footprint < context + (1 << 30)
        assert footprint <= context + 0.05 * GiB, (log_id, footprint / GiB)
