"""Cost of torchtune 0.1's QLoRA model-init replay (:mod:`vrambudget.core.allocator.nf4_init`)
in a training budget: the same QLoRA request under torchtune 0.1.1 (the replay runs, its memo
cleared before every run) and 0.2.0 (no replay), side by side in one run.

Run: .venv/bin/python -m bench.nf4_init_speed [--repeats 5]
Medians of the repeats and their ratio (``Nf4Init.events`` counts a replay's events).
Target: the largest preset's replay well under the compute pool's default time limit
(``VRAMBUDGET_COMPUTE_TIME_LIMIT_S``, 10 s); the replay is memoized by shape, so a repeated
model pays it once per worker.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import msgspec

from vrambudget.core.allocator import nf4_init
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj"]


def _request(preset: str, version: str) -> BudgetRequest:
    req: dict[str, Any] = {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": preset},
                "precision": {"weights": "bf16"},
                "micro_batch_size": 2,
                "sequence_length": 512,
                "checkpointing": "full",
                "method": {"kind": "qlora", "rank": 8, "target_modules": TARGETS},
            }
        ],
        "device": {"source": "catalog", "id": "a100-sxm4-80gb"},
        "software": {"framework": "torchtune", "framework_version": version},
    }
    return msgspec.convert(req, BudgetRequest)


def _time(r: BudgetRequest, clear: bool) -> float:
    if clear:
        nf4_init.replay_nf4_init.cache_clear()
    t = time.perf_counter()
    estimate(r.workloads, r.device, r.headroom, software=r.software)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print("| model | without (0.2.0) | with (0.1.1) | ratio |")
    print("|---|---:|---:|---:|")
    for preset in ("llama-2-7b", "llama-3.1-8b", "llama-2-70b"):
        old, new = _request(preset, "0.1.1"), _request(preset, "0.2.0")
        _time(new, False)  # warm the statics and the imports
        without, with_ = [], []
        for _ in range(args.repeats):
            without.append(_time(new, False))
            with_.append(_time(old, True))
        w, o = statistics.median(with_), statistics.median(without)
        print(f"| {preset} | {o * 1e3:.2f} ms | {w * 1e3:.1f} ms | {w / o:,.0f} |")


if __name__ == "__main__":
    main()
