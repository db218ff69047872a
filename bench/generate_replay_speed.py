"""Cost of ``"allocator_replay": true`` (the transformers ``generate`` replay behind
``DeviceBudget.allocator_cache``) against the same budget without it, side by side in one run.

Run: .venv/bin/python -m bench.generate_replay_speed [--repeats 5]
Each case: the analytic budget without the replay, then with it (the replay's memo cleared
before every run, so each run pays both replays: the default allocator and expandable
segments); medians of the repeats, the ratio, and the large-pool requests replayed per second.
Target: both replays of the largest generation allowed (``MAX_EVENTS`` requests each) under
5 s, half the compute pool's default time limit (``VRAMBUDGET_COMPUTE_TIME_LIMIT_S``, 10 s).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import msgspec

from vrambudget.core.allocator import generate as replay_module
from vrambudget.core.allocator.generate import MAX_EVENTS
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

OLD = {"framework": "transformers", "framework_version": "4.35.2"}
CASES: dict[str, dict[str, Any]] = {
    "llama-2-7b fp16, batch 8, 256 + 512 tokens, eager, transformers 4.35.2": {
        "workloads": [
            {
                "kind": "inference",
                "model": {"source": "preset", "id": "llama-2-7b"},
                "batch_size": 8,
                "prompt_tokens": 256,
                "generated_tokens": 512,
                "attention": "eager",
            }
        ],
        "software": OLD,
        "device": {"source": "catalog", "id": "a100-sxm4-80gb"},
    },
    "llama-3.1-8b bf16, batch 8, 1024 + 1024 tokens, sdpa, current transformers": {
        "workloads": [
            {
                "kind": "inference",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "batch_size": 8,
                "prompt_tokens": 1024,
                "generated_tokens": 1024,
            }
        ],
        "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
    },
    "llama-3.1-70b bf16, batch 32, 512 + 512 tokens, sdpa (near MAX_EVENTS)": {
        "workloads": [
            {
                "kind": "inference",
                "model": {"source": "preset", "id": "llama-3.1-70b"},
                "batch_size": 32,
                "prompt_tokens": 512,
                "generated_tokens": 512,
            }
        ],
    },
}


def _run(body: dict[str, Any], replay: bool) -> float:
    r = msgspec.convert({**body, "allocator_replay": replay}, BudgetRequest)
    replay_module._REPLAYS.clear()
    t = time.perf_counter()
    b = estimate(r.workloads, r.device, r.headroom, software=r.software, allocator_replay=replay)
    elapsed = time.perf_counter() - t
    assert (b.devices[0].allocator_cache is not None) == replay, "the replay did not apply"
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"MAX_EVENTS = {MAX_EVENTS:,}")
    print("| case | requests replayed (each replay) | without | with | ratio | requests/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, body in CASES.items():
        without, with_ = [], []
        for _ in range(args.repeats):  # interleaved: both see the same machine state
            without.append(_run(body, False))
            with_.append(_run(body, True))
        events = next(iter(replay_module._REPLAYS.values())).events  # the last run's replay
        a, b = statistics.median(without), statistics.median(with_)
        print(
            f"| {name} | {events:,} | {a * 1e3:.2f} ms | {b * 1e3:.0f} ms | {b / a:,.0f} | "
            f"{2 * events / (b - a):,.0f} |"
        )


if __name__ == "__main__":
    main()
