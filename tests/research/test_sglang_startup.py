"""SGLang's start-up footprint before it loads weights: no NCCL baseline on PCIe-only GPUs
(vrambudget/core/serving/engines_budget.py sglang_nccl_bytes), backed by the published
"Load weight begin. avail mem" lines (research/data/sglang_startup_logs.json)."""

from __future__ import annotations

import json
from pathlib import Path

from vrambudget.core.catalog import gpus
from vrambudget.core.serving.calibration import CALIBRATED_VERSION, calibration
from vrambudget.core.serving.engines_budget import PCIE_DISTRIBUTED_BYTES, sglang_nccl_bytes

DATA = Path(__file__).resolve().parents[2] / "research" / "data" / "sglang_startup_logs.json"
GiB = 1 << 30


def test_the_nccl_baseline_follows_the_fabric() -> None:
    cal = calibration(CALIBRATED_VERSION)
    nccl = round(cal.c("nccl_init_bytes"))
    assert nccl == 1 << 30  # vLLM 0.19's, fitted on H100 launches
    assert sglang_nccl_bytes(cal, 1, "nvlink") == sglang_nccl_bytes(cal, 1, "pcie") == 0
    assert sglang_nccl_bytes(cal, 4, "pcie") == PCIE_DISTRIBUTED_BYTES == 180_664_402
    assert sglang_nccl_bytes(cal, 8, "nvlink") == nccl
    assert sglang_nccl_bytes(cal, 8, "no_p2p") == PCIE_DISTRIBUTED_BYTES  # host-memory NCCL


def test_pcie_tensor_parallel_starts_are_covered_by_the_pcie_term() -> None:
    """Rank 0 of 2 x RTX 3090 (0.5.12; SGLang takes the minimum free memory over ranks):
    25,327,697,920 - 22.91 GiB - the 547,608,330 B context = 180,664,402 B, the PCIe term
    itself; 2 x A100 80GB PCIe (0.5.8): 79.14 - 78.77 = 0.37 GiB in all, under the context.
    Both far under the context plus vLLM's 1.0 GiB NCCL baseline the model kept before."""
    cal = calibration(CALIBRATED_VERSION)
    context = round(cal.c("cuda_context_bytes"))
    logs = {entry["id"]: entry for entry in json.loads(DATA.read_text())["logs"]}
    total = {gpu_id: g.memory_total_bytes for gpu_id, g in gpus().items()}
    cases = {
        "sglang-issue-17680-2xa100-80gb-pcie-tp2": ("a100-pcie-80gb", 78.77),
        "mattbucci-2x3090-gemma4-12b-awq-tp2": ("rtx-3090-24gb", 22.91),
    }
    footprints = {}
    for log_id, (gpu_id, free_gib) in cases.items():
        entry = logs[log_id]
        assert entry["tp"] == 2 and entry["url"].startswith("https://github.com/")
        assert any(f"avail mem={free_gib:.2f} GB" in line for line in entry["lines"]), log_id
        footprints[log_id] = total[gpu_id] - round(free_gib * GiB)
        assert footprints[log_id] < context + (1 << 30)
        assert footprints[log_id] <= context + PCIE_DISTRIBUTED_BYTES, log_id
    assert max(footprints.values()) == context + PCIE_DISTRIBUTED_BYTES
