"""On a CUDA host: three probes through the agent's own measuring code (an inference, a training
step, an inference at high concurrency), each in a fresh spawned child, printed next to the
analytic and trace estimates per component that a probe can see.

Run (GPU host, repository root; < 5 minutes on an H100/H200):
    .venv/bin/python -m bench.gpu_probe_check
"""

from __future__ import annotations

import msgspec

from agent.runner import ProbeProcess
from agent.spec import ProbeRequest, ProbeResult
from service.budget.estimate import estimate
from service.budget.spec import BudgetRequest, Workload
from service.trace.engine import trace_budget

PROBES = {
    "qwen2.5-0.5b inference, batch 8, prompt 1024, 128 generated": {
        "workload": {"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                     "batch_size": 8, "prompt_tokens": 1024, "generated_tokens": 128},
        "iterations": 2},
    "qwen2.5-0.5b training step, sequence 1024, AdamW foreach": {
        "workload": {"kind": "training", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                     "sequence_length": 1024}, "iterations": 3},
    "qwen2.5-0.5b inference, 16 concurrent streams of batch 1, prompt 512": {
        "workload": {"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                     "batch_size": 1, "prompt_tokens": 512, "generated_tokens": 32},
        "iterations": 2, "concurrency": 16},
}


def _gib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**30:.3f}"


def main() -> None:
    print("| probe | view | analytic | trace | measured |")
    print("|---|---|---:|---:|---:|")
    for name, body in PROBES.items():
        req = msgspec.convert(body, ProbeRequest)
        w = req.workload
        if req.concurrency > 1:  # the estimate's concurrency is the probe's streams
            w = msgspec.structs.replace(w, concurrent_requests=req.concurrency)
        workload = msgspec.convert(msgspec.to_builtins(w), Workload)
        analytic = estimate((workload,))
        traced = trace_budget(BudgetRequest(workloads=(workload,), method="trace"))
        process = ProbeProcess(msgspec.json.encode(req), {}, 600)
        process.start()
        out = process.wait()
        if out.result_json is None:
            print(f"| {name} | {out.status}: {out.error} | | | |")
            continue
        m = msgspec.json.decode(out.result_json, type=ProbeResult)
        lines = {line.component: line.bytes for line in analytic.devices[0].lines}
        t = traced.trace
        assert t is not None
        torch_total = sum(v for c, v in lines.items() if c not in (
            "cuda_context", "communication_buffers", "headroom"))
        print(f"| {name} | weights | {_gib(lines['weights'])} | — | "
              f"{_gib(m.torch.weights_bytes)} |")
        print(f"| | peak allocated | — | {_gib(t.peak_allocated_bytes)} | "
              f"{_gib(m.torch.allocated_peak_bytes)} |")
        print(f"| | peak reserved | {_gib(torch_total)} | {_gib(t.peak_reserved_bytes)} | "
              f"{_gib(m.torch.reserved_peak_bytes)} |")
        if m.nvml is not None:
            print(f"| | CUDA context | {_gib(lines['cuda_context'])} | — | "
                  f"{_gib(m.nvml.cuda_context_bytes)} |")
            print(f"| | device used (NVML peak − baseline) | {_gib(analytic.total_bytes)} "
                  f"(with headroom) | — | "
                  f"{_gib(m.nvml.peak_used_bytes - m.nvml.baseline_used_bytes)} |")
        print(f"| | status / p50 iteration | | | {out.status} / {m.iterations.p50_s:.3f} s |")


if __name__ == "__main__":
    main()
