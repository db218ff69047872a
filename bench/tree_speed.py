"""Analytic budget and fit speed of two checkouts, side by side in one run (alternating
subprocesses, medians), to show a refactor costs no speed.

    .venv/bin/python bench/tree_speed.py OLD_TREE [NEW_TREE]     (NEW_TREE: default this one)

Each round runs every tree once, in turn: 20,000 inference budgets with distinct batch sizes
(Llama 3.1 8B on an H100; only the per-model statics are cached, as in the service) and 20
whole-catalog fits. Prints per-tree medians over 5 rounds and the ratio NEW / OLD.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROUNDS = 5
CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import msgspec
from pathlib import Path
if (Path(sys.argv[1]) / "vrambudget").is_dir():
    from vrambudget.core.estimate import estimate
    from vrambudget.core.fit import fit
    from vrambudget.core.spec import CatalogDevice, FitRequest, Workload
else:
    from service.budget.estimate import estimate
    from service.budget.fit import FitRequest, fit
    from service.budget.spec import CatalogDevice, Workload
base = {"kind": "inference", "model": {"source": "preset", "id": "llama-3.1-8b"},
        "prompt_tokens": 4096, "generated_tokens": 512}
ws = [msgspec.convert({**base, "batch_size": b}, Workload) for b in range(1, 20001)]
dev = CatalogDevice(id="h100-sxm5-80gb")
estimate((ws[0],), dev)
t = time.perf_counter()
for w in ws:
    estimate((w,), dev)
budget_us = (time.perf_counter() - t) / len(ws) * 1e6
req = msgspec.convert({"workloads": [base], "device_counts": [1, 2, 4, 8]}, FitRequest)
fit(req)
t = time.perf_counter()
for i in range(20):
    fit(msgspec.convert({"workloads": [{**base, "batch_size": i + 1}],
                         "device_counts": [1, 2, 4, 8]}, FitRequest))
fit_ms = (time.perf_counter() - t) / 20 * 1e3
print(json.dumps({"budget_us": budget_us, "fit_ms": fit_ms}))
"""


def main() -> None:
    old = Path(sys.argv[1]).resolve()
    new = Path(sys.argv[2]).resolve() if len(sys.argv) > 2 else Path(__file__).resolve().parents[1]
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for _ in range(ROUNDS):
        for name, tree in (("old", old), ("new", new)):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(tree)],
                check=True,
                capture_output=True,
                text=True,
                cwd=tree,
            ).stdout
            runs[name].append(json.loads(out))
    for key, unit in (("budget_us", "us per budget"), ("fit_ms", "ms per whole-catalog fit")):
        o = statistics.median(r[key] for r in runs["old"])
        n = statistics.median(r[key] for r in runs["new"])
        print(f"{unit:26}  old {o:8.2f}  new {n:8.2f}  new/old {n / o:.3f}")


if __name__ == "__main__":
    main()
