"""The side-by-side timing both model-init replay benchmarks share (``bench.nf4_init_speed``,
``bench.zero3_init_speed``): per model, the same budget without the replay and with it (the
replay's memo cleared before every run), interleaved, medians of the repeats and their ratio."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest


def time_budget(r: BudgetRequest, clear: Callable[[], None] | None = None) -> float:
    """Seconds of one budget, after ``clear`` (the replay's memo) if given."""
    if clear is not None:
        clear()
    t = time.perf_counter()
    estimate(r.workloads, r.device, r.headroom, software=r.software)
    return time.perf_counter() - t


def print_table(
    rows: Sequence[tuple[str, BudgetRequest, BudgetRequest]],
    labels: tuple[str, str],
    clear: Callable[[], None],
    repeats: int,
) -> None:
    """A Markdown table of ``(model, request without the replay, request with it)``."""
    print(f"| model | {labels[0]} | {labels[1]} | ratio |")
    print("|---|---:|---:|---:|")
    for name, without_req, with_req in rows:
        time_budget(without_req)  # warm the statics and the imports
        without, with_ = [], []
        for _ in range(repeats):
            without.append(time_budget(without_req))
            with_.append(time_budget(with_req, clear))
        w, o = statistics.median(with_), statistics.median(without)
        print(f"| {name} | {o * 1e3:.2f} ms | {w * 1e3:.2f} ms | {w / o:,.0f} |")


def main(
    presets: Sequence[str],
    request: Callable[[str, bool], BudgetRequest],
    labels: tuple[str, str],
    clear: Callable[[], None],
) -> None:
    """``--repeats N`` (default 5): the table of ``request(preset, replay)`` for each preset."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rows = [(p, request(p, False), request(p, True)) for p in presets]
    print_table(rows, labels, clear, args.repeats)
