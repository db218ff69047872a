"""Draw the sample budget pictures of the docs (docs/img/budget-*.svg, shown in
docs/PICTURES.md): each request below estimated by the analytic tier and drawn by
:func:`vrambudget.core.budget_chart.render_budget_svg`, exactly what ``POST
/v1/budgets?format=svg`` answers to the same body.

    .venv/bin/python -m bench.budget_pictures [OUT_DIR]     # default docs/img
    .venv/bin/python -m bench.budget_pictures --check       # exit 1 if a picture drifted

``tests/core/test_budget_chart.py`` runs the check, so the pictures in the docs are the
product's current answers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec

from vrambudget.core.budget_chart import render_budget_svg
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

_LLAMA_8B_INFERENCE: dict[str, Any] = {
    "kind": "inference",
    "model": {"source": "preset", "id": "llama-3.1-8b"},
    "batch_size": 4,
    "prompt_tokens": 2048,
    "generated_tokens": 512,
}

SAMPLES: dict[str, dict[str, Any]] = {
    "budget-llama-3.1-8b-l4": {
        "workloads": [_LLAMA_8B_INFERENCE],
        "device": {"source": "catalog", "id": "l4-24gb"},
    },
    "budget-llama-3.1-8b-l40s": {
        "workloads": [_LLAMA_8B_INFERENCE],
        "device": {"source": "catalog", "id": "l40s-48gb"},
    },
    "budget-qwen2.5-7b-lora-pp2-a10": {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": "qwen2.5-7b"},
                "micro_batch_size": 2,
                "sequence_length": 2048,
                "checkpointing": "full",
                "method": {"kind": "lora", "rank": 16},
                "parallelism": {"pipeline": 2},
            }
        ],
        "device": {"source": "catalog", "id": "a10-24gb"},
    },
}

OUT = Path(__file__).resolve().parent.parent / "docs" / "img"


def picture(request: dict[str, Any]) -> str:
    req = msgspec.convert(request, BudgetRequest)
    budget = estimate(req.workloads, req.device, req.headroom, software=req.software)
    return render_budget_svg(budget)


def check(out: Path = OUT) -> list[str]:
    """The names of the committed pictures that differ from what the product draws now."""
    return [
        name
        for name, request in SAMPLES.items()
        if not (out / f"{name}.svg").is_file()
        or (out / f"{name}.svg").read_text(encoding="utf-8") != picture(request)
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        drifted = check()
        for name in drifted:
            print(f"drifted: docs/img/{name}.svg (run python -m bench.budget_pictures)")
        return 1 if drifted else 0
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    for name, request in SAMPLES.items():
        path = out / f"{name}.svg"
        path.write_text(picture(request), encoding="utf-8")
        print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
