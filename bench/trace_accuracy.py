"""Print the oracle grid (analytic vs trace, per component) as the markdown table of
docs/ACCURACY.md.  Run: .venv/bin/python -m bench.trace_accuracy"""

from __future__ import annotations

import sys
import time

from tests.support.trace_grid import GRID, compare


def main() -> None:
    print("| workload | component | analytic (MiB) | trace (MiB) | trace vs analytic | tolerance |")
    print("|---|---|---:|---:|---:|---:|")
    worst = 0.0
    start = time.perf_counter()
    for name, spec in GRID:
        for r in compare(name, spec):
            if r.analytic == 0 and r.traced == 0:
                continue
            flag = "" if abs(r.error) <= r.tolerance else " **out**"
            worst = max(worst, abs(r.error) / r.tolerance)
            print(
                f"| {r.name} | {r.component} | {r.analytic / 2**20:,.1f} | "
                f"{r.traced / 2**20:,.1f} | {r.error * 100:+.2f}%{flag} | "
                f"{r.tolerance * 100:g}% |"
            )
    print(
        f"\n{len(GRID)} workloads in {time.perf_counter() - start:.1f} s; worst error / "
        f"tolerance = {worst:.2f}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
