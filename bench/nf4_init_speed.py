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

from typing import Any

import msgspec

from bench.replay_speed import main
from vrambudget.core.allocator import nf4_init
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


if __name__ == "__main__":
    main(
        ("llama-2-7b", "llama-3.1-8b", "llama-2-70b"),
        lambda preset, replay: _request(preset, "0.1.1" if replay else "0.2.0"),
        ("without (0.2.0)", "with (0.1.1)"),
        nf4_init.replay_nf4_init.cache_clear,
    )
