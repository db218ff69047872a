"""Wall time of trace-tier requests on this machine (targets: 70B-class inference and a 7B
training step each under 10 s; a repeated request from the service's cache under 5 ms).

Run: .venv/bin/python -m bench.trace_speed [--repeats 3]
Each trace runs in a fresh process (as in the service's worker pool) after torch is imported;
the median of the repeats is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = {
    "llama-3.1-70b inference (batch 8, prompt 4096, 256 generated)": {
        "method": "trace",
        "workloads": [
            {
                "kind": "inference",
                "model": {"source": "preset", "id": "llama-3.1-70b"},
                "batch_size": 8,
                "prompt_tokens": 4096,
            }
        ],
    },
    "llama-2-7b training step (seq 2048, AdamW foreach, 2 iterations)": {
        "method": "trace",
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": "llama-2-7b"},
                "sequence_length": 2048,
            }
        ],
    },
}

_CHILD = """
import sys, time, msgspec
import torch  # imported before timing, as the service's warm workers do
from vrambudget.core.spec import BudgetRequest
from vrambudget.trace.engine import trace_budget
req = msgspec.json.decode(sys.argv[1], type=BudgetRequest)
t = time.perf_counter(); b = trace_budget(req); dt = time.perf_counter() - t
print(dt, b.trace.num_events, b.trace.peak_reserved_bytes)
"""


def _cache_hit_ms(repeats: int) -> list[float]:
    """A repeated trace request through the service's whole ASGI stack (TestClient), after
    the first answer is cached: milliseconds per request."""
    import logging

    from litestar.testing import TestClient

    logging.getLogger("httpx").setLevel(logging.WARNING)

    from vrambudget.service.app import Settings, create_app

    body = CASES["llama-2-7b training step (seq 2048, AdamW foreach, 2 iterations)"]
    with TestClient(create_app(Settings(trace_time_limit_s=120))) as client:
        assert client.post("/v1/budgets", json=body).status_code == 200
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            assert client.post("/v1/budgets", json=body).status_code == 200
            out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for name, body in CASES.items():
        times = []
        for _ in range(args.repeats):
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, json.dumps(body)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            times.append(float(out[0]))
        print(
            f"{name}: median {statistics.median(times):.2f} s over {args.repeats} "
            f"(min {min(times):.2f}, max {max(times):.2f}); {out[1]} events, "
            f"peak reserved {int(out[2]) / 2**30:.2f} GiB"
        )
    hits = _cache_hit_ms(200)
    print(
        f"repeated request from the answer cache (TestClient, whole ASGI stack): median "
        f"{statistics.median(hits):.2f} ms over {len(hits)} (p95 "
        f"{sorted(hits)[int(0.95 * len(hits))]:.2f} ms)"
    )


if __name__ == "__main__":
    main()
