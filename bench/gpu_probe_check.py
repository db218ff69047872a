"""On a CUDA host: three probes through the agent's own measuring code (an inference, a training
step, an inference at high concurrency), each in a fresh spawned child, compared with the
analytic and trace estimates exactly as ``POST /v1/comparisons`` does, then built into a
calibration profile as ``vrambudget calibrate`` does.

Run (GPU host, repository root; < 5 minutes on an H100/H200):
    .venv/bin/python -m bench.gpu_probe_check [OUT_DIR]

Prints one markdown table per probe (quantity, analytic, trace, measured, verdicts) and the
profile; with OUT_DIR, also writes each probe report with its comparison (JSON), its chart
(SVG) and the profile (JSON) there.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import msgspec

from vrambudget.agent.child import ChildSettings
from vrambudget.agent.runner import ProbeProcess
from vrambudget.agent.spec import ProbeRequest, ProbeResource, ProbeResult
from vrambudget.core.calibration import build_profiles
from vrambudget.core.chart import render_comparison_svg
from vrambudget.core.compare import compare, estimate_input
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest, Headroom
from vrambudget.trace.engine import trace_budget

PROBES = {
    "qwen2.5-0.5b-inference": {
        "workload": {
            "kind": "inference",
            "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "batch_size": 8,
            "prompt_tokens": 1024,
            "generated_tokens": 128,
        },
        "iterations": 2,
    },
    "qwen2.5-0.5b-training": {
        "workload": {
            "kind": "training",
            "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "sequence_length": 1024,
        },
        "iterations": 3,
    },
    "qwen2.5-0.5b-16-streams": {
        "workload": {
            "kind": "inference",
            "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "batch_size": 1,
            "prompt_tokens": 512,
            "generated_tokens": 32,
        },
        "iterations": 2,
        "concurrency": 16,
    },
}


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.1f}"


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    calibration_inputs = []
    for name, body in PROBES.items():
        req = msgspec.convert(body, ProbeRequest)
        process = ProbeProcess(msgspec.json.encode(req), ChildSettings(), 600)
        process.start()
        done = process.wait()
        if done.result_json is None:
            print(f"## {name}: {done.status}: {done.error}\n")
            continue
        report = ProbeResource(
            id=name,
            status=done.status,
            created_at=time.time(),  # type: ignore[arg-type]
            updated_at=time.time(),
            request=req,
            result=msgspec.json.decode(done.result_json, type=ProbeResult),
        )
        inp = estimate_input(report)
        analytic = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
        traced = trace_budget(
            BudgetRequest(
                method="trace",
                workloads=(inp.workload,),
                device=inp.device,
                headroom=Headroom(fraction=0.0),
            )
        )
        c = compare(report, {"analytic": analytic, "trace": traced}, inp)
        a, t = c.tiers
        print(f"## {name}: {done.status} on {c.device_name} (catalog {c.gpu_id})\n")
        print("| quantity | analytic MiB | trace MiB | measured MiB | analytic | trace |")
        print("|---|---:|---:|---:|---|---|")
        for qa, qt in zip(a.quantities, t.quantities, strict=True):
            print(
                f"| {qa.name} | {_mib(qa.estimate_bytes)} | {_mib(qt.estimate_bytes)} | "
                f"{_mib(qa.measured_bytes)} | {qa.difference_percent}% {qa.verdict} | "
                f"{qt.difference_percent}% {qt.verdict} |"
            )
        print(f"\nheadroom advice: {c.headroom.fraction:.0%}: {'; '.join(c.headroom.reasons)}")
        print(f"degraded: {c.degraded}; notes: {c.notes}\n")
        if out is not None:
            report = msgspec.structs.replace(report, comparison=c)
            (out / f"{name}.json").write_bytes(msgspec.json.encode(report))
            (out / f"{name}.svg").write_text(render_comparison_svg(c), encoding="utf-8")
        if (
            done.status == "succeeded"
            and report.result is not None
            and (report.result.device == "cuda")
        ):
            calibration_inputs.append((report, analytic, inp.gpu_id))
    if calibration_inputs:
        for p in build_profiles(calibration_inputs, time.strftime("%Y-%m-%dT%H:%M:%SZ")):
            text = msgspec.json.format(msgspec.json.encode(p), indent=2)
            print(f"profile {p.id}:\n{text.decode()}")
            if out is not None:
                (out / f"profile-{p.id}.json").write_bytes(text)


if __name__ == "__main__":
    main(sys.argv[1:])
