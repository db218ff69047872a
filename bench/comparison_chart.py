"""Run the CPU probe for a tiny inference, a tiny training step and a Qwen2.5-0.5B inference,
compare each with its analytic and its trace estimate, and draw the comparisons as the SVGs of
the docs (docs/img/).

    .venv/bin/python -m bench.comparison_chart [OUT_DIR]     # default docs/img
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec

from vrambudget.agent.child import ChildSettings
from vrambudget.agent.examples import TINY_MODEL
from vrambudget.agent.probe import measure
from vrambudget.agent.spec import ProbeRequest, ProbeResource
from vrambudget.core.chart import render_comparison_svg
from vrambudget.core.compare import compare, estimate_input
from vrambudget.core.comparison import Comparison
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest, Headroom
from vrambudget.trace.engine import trace_budget

TINY = TINY_MODEL
FP32 = {"weights": "fp32", "compute": "fp32"}
SPECS: dict[str, dict[str, Any]] = {
    "inference": {
        "kind": "inference",
        "model": TINY,
        "batch_size": 2,
        "prompt_tokens": 32,
        "generated_tokens": 4,
        "precision": FP32,
    },
    "training": {
        "kind": "training",
        "model": TINY,
        "sequence_length": 32,
        "precision": FP32,
        "mixed_precision": "pure",
        "optimizer": {"name": "adamw", "implementation": "for_loop"},
    },
    "qwen2.5-0.5b-inference": {
        "kind": "inference",
        "model": {"source": "preset", "id": "qwen2.5-0.5b"},
        "batch_size": 2,
        "prompt_tokens": 128,
        "generated_tokens": 8,
        "precision": {"weights": "bf16", "compute": "bf16"},
    },
}
TITLES = {
    "inference": "tiny inference workload on the CPU probe (fp32)",
    "training": "tiny training step on the CPU probe (fp32, AdamW)",
    "qwen2.5-0.5b-inference": "Qwen2.5-0.5B, 2 x (128 + 8) tokens, bf16, on the CPU probe",
}


def cpu_comparison(name: str, spec: dict[str, Any]) -> Comparison:
    """The CPU probe of ``spec`` (in this process) compared with its analytic and trace
    estimates."""
    req = msgspec.convert({"workload": spec, "iterations": 2}, ProbeRequest)
    out = measure(req, ChildSettings())
    rep = ProbeResource(
        id=f"cpu-{name}",
        status=out.status,
        created_at=0,
        updated_at=0,
        request=req,
        result=out.result,
    )
    inp = estimate_input(rep)
    budget = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
    traced = trace_budget(
        BudgetRequest(
            method="trace",
            workloads=(inp.workload,),
            device=inp.device,
            headroom=Headroom(fraction=0.0),
        )
    )
    return compare(rep, {"analytic": budget, "trace": traced}, inp)


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else Path("docs/img")
    out.mkdir(parents=True, exist_ok=True)
    for name, spec in SPECS.items():
        c = cpu_comparison(name, spec)
        path = out / f"comparison-cpu-{name}.svg"
        title = f"Estimate vs measured: {TITLES[name]}"
        path.write_text(render_comparison_svg(c, title=title), encoding="utf-8")
        for tier in c.tiers:
            verdicts = ", ".join(
                f"{q.name} {q.difference_percent}% {q.verdict}"
                for q in tier.quantities
                if q.measured_bytes is not None
            )
            print(f"{path} [{tier.method}]: {verdicts}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
