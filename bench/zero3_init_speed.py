"""Cost of the DeepSpeed ZeRO-3 whole-model init replay
(:mod:`vrambudget.core.allocator.zero3_init`) in a training budget: the same ZeRO-3 request over
8 ranks with ``software.zero_init`` false (the replay runs, its memo cleared before every run)
and true (no replay), side by side in one run.

Run: .venv/bin/python -m bench.zero3_init_speed [--repeats 5]
Medians of the repeats and their ratio. Target: the largest preset's replay well under the
compute pool's default time limit (``VRAMBUDGET_COMPUTE_TIME_LIMIT_S``, 10 s); the replay is
memoized by the model's tensor sizes, so a repeated model pays it once per worker.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bench.replay_speed import main
from vrambudget.core.allocator import zero3_init
from vrambudget.core.spec import BudgetRequest


def _request(preset: str, zero_init: bool) -> BudgetRequest:
    req: dict[str, Any] = {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": preset},
                "precision": {"weights": "bf16"},
                "micro_batch_size": 1,
                "sequence_length": 4096,
                "checkpointing": "full",
                "method": {"kind": "full"},
                "parallelism": {"data": 8, "zero_stage": 3, "offload_optimizer": True},
            }
        ],
        "device": {"source": "catalog", "id": "h200-sxm-141gb"},
        "software": {"framework": "deepspeed", "zero_init": zero_init},
    }
    return msgspec.convert(req, BudgetRequest)


if __name__ == "__main__":
    main(
        ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"),
        lambda preset, replay: _request(preset, not replay),
        ("without (zero_init true)", "with (zero_init false)"),
        zero3_init.replay_zero3_module_init.cache_clear,
    )
