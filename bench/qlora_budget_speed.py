"""In-process speed of QLoRA training budgets (the model-init phase of the start-up upcast),
side by side with another tree.

    .venv/bin/python bench/qlora_budget_speed.py [TREE]
        (TREE: a checkout, default this one; run two trees alternately and compare medians)

One round = 200 distinct budgets (Llama 3.1 8B QLoRA, micro-batch 1 .. 200 x 2,048 tokens, full
checkpointing, TRL 0.24: every phase, the model-init one included); prints the median over 7
rounds of the time per budget.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = (
    Path(sys.argv[1]).resolve()
    if len(sys.argv) > 1 and sys.argv[1] != "."
    else Path(__file__).resolve().parents[1]
)
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from vrambudget.core.estimate import estimate  # noqa: E402
from vrambudget.core.spec import BudgetRequest  # noqa: E402

ROUNDS = 7


def _request(batch: int) -> BudgetRequest:
    return msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "training",
                    "model": {"source": "preset", "id": "llama-3.1-8b"},
                    "precision": {"weights": "bf16"},
                    "micro_batch_size": batch,
                    "sequence_length": 2048,
                    "checkpointing": "full",
                    "method": {"kind": "qlora", "rank": 16},
                }
            ],
            "software": {"libraries": {"trl": "0.24.0"}},
        },
        BudgetRequest,
    )


def main() -> None:
    requests = [_request(b) for b in range(1, 201)]
    first = requests[0]
    estimate(first.workloads, first.device, first.headroom, software=first.software)  # statics
    per_budget = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for r in requests:
            estimate(r.workloads, r.device, r.headroom, software=r.software)
        per_budget.append((time.perf_counter() - t0) / len(requests))
    print(f"median of {ROUNDS}: {statistics.median(per_budget) * 1e6:.1f} us per budget ({ROOT})")


if __name__ == "__main__":
    main()
