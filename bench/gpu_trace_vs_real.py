"""On a CUDA machine: run a handful of the oracle grid's workloads for real and print, per
workload, the trace tier's predicted peak allocated / reserved next to torch.cuda's
max_memory_allocated / max_memory_reserved for the same program.

Run (GPU host, repository root): .venv/bin/python -m bench.gpu_trace_vs_real
Each workload runs in its own spawned process so that every peak starts from an empty
allocator. Weights are uninitialized (synthetic): values are not meaningful, memory is.
"""

from __future__ import annotations

import multiprocessing as mp
import sys

WORKLOADS = [
    "qwen0.5b train foreach",
    "qwen0.5b train fused",
    "qwen0.5b train LoRA",
    "qwen0.5b train full ckpt",
    "qwen0.5b infer",
    "qwen0.5b infer eager",
    "gpt2 train dropout",
    "bert-base train",
]


def _real(spec: dict[str, object], queue: mp.Queue) -> None:  # type: ignore[type-arg]
    import msgspec
    import torch

    from vrambudget.core.resolve import resolve_model
    from vrambudget.core.spec import Workload
    from vrambudget.workloads.marks import Marks
    from vrambudget.workloads.run import prepare

    w = msgspec.convert(spec, Workload)
    try:
        program = prepare(w, resolve_model(w.model), Marks(), torch.device("cuda"))
        program.run(2)
        torch.cuda.synchronize()
        queue.put((torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), None))
    except torch.OutOfMemoryError as exc:
        queue.put(
            (
                torch.cuda.max_memory_allocated(),
                torch.cuda.max_memory_reserved(),
                f"OOM: {exc}"[:200],
            )
        )


def main() -> None:
    import msgspec

    from tests.support.trace_grid import GRID
    from vrambudget.core.spec import BudgetRequest, Workload
    from vrambudget.trace.engine import trace_budget_with_replays

    grid = dict(GRID)
    ctx = mp.get_context("spawn")
    print(
        "| workload | traced allocated | real allocated | error | traced reserved | "
        "real reserved | error |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in WORKLOADS:
        spec = grid[name]
        w = msgspec.convert(spec, Workload)
        _, (r,) = trace_budget_with_replays(BudgetRequest(workloads=(w,), method="trace"))
        q = ctx.Queue()
        p = ctx.Process(target=_real, args=(spec, q))
        p.start()
        p.join(timeout=300)
        if p.exitcode != 0 or q.empty():
            print(f"| {name} | failed (exit {p.exitcode}) |", file=sys.stdout)
            continue
        alloc, reserved, note = q.get()
        print(
            f"| {name} | {r.peak_allocated_bytes:,} | {alloc:,} | "
            f"{(r.peak_allocated_bytes - alloc) / alloc:+.2%} | {r.peak_reserved_bytes:,} | "
            f"{reserved:,} | {(r.peak_reserved_bytes - reserved) / reserved:+.2%} |"
            + (f" {note}" if note else "")
        )


if __name__ == "__main__":
    main()
