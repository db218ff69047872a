"""bench/replica_capacity.py's arithmetic: wrk's latency units, the process tree it measures,
and the summary across runs (hand-computed medians)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.replica_capacity import _ms, memory, summarize, tree


@pytest.mark.parametrize(
    ("text", "ms"), [("250.00us", 0.25), ("1.50ms", 1.5), ("2.10s", 2100.0), ("1.00m", 60000.0)]
)
def test_wrk_latency_units(text: str, ms: float) -> None:
    assert _ms(text) == pytest.approx(ms)


def test_the_tree_holds_the_children_and_their_memory() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        pids = tree(os.getpid())
        assert pids[0] == os.getpid() and child.pid in pids
        rss, pss = memory([os.getpid()])
        assert rss > 0 and 0 < pss <= rss  # PSS divides the shared pages: never above RSS
    finally:
        child.kill()
        child.wait()


def _run(rps: float, cores: float, main: float, connections: int = 8) -> dict[str, object]:
    return {
        "connections": connections,
        "rps": rps,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "non_2xx": 0,
        "socket_errors": 0,
        "cores": cores,
        "main_cores": main,
    }


def _report(levels: list[tuple[int, float, list[dict[str, object]]]]) -> dict[str, object]:
    return {
        "levels": [
            {"connections": c, "rps": rps, "p50_ms": 1.0, "p99_ms": 2.0, "cores": 1.0, "runs": runs}
            for c, rps, runs in levels
        ],
        "loadavg_before": [1.0, 1.0, 1.0],
        "loadavg_after": [2.0, 2.0, 2.0],
        "peak_rss_bytes": 600 << 20,
        "peak_pss_bytes": 500 << 20,
        "peak_rss_bytes_analytic": 200 << 20,
    }


def test_summary_across_runs(tmp_path: Path) -> None:
    a = _report([(1, 500.0, [_run(500, 1.0, 0.5, 1)]), (8, 800.0, [_run(800, 1.0, 0.5)])])
    b = _report([(8, 600.0, [_run(600, 0.5, 0.3)])])
    c = _report([(8, 900.0, [_run(900, 1.5, 0.6)])])
    paths = []
    for name, report in (("a", a), ("b", b), ("c", c)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(report))
    text = summarize(paths)
    # capacities 800, 600, 900 -> median 800; per core 500, 800, 1200, 600 -> median 700;
    # server share 0.5, 0.5, 0.6, 0.4 -> median 0.5 -> ceiling 700 / 0.5 = 1400 on 2 cores
    assert "capacity, median of 3 runs: 800 req/s" in text
    assert "median of 4 wrk runs: 700" in text
    assert "median: 0.50 -> ceiling (server process at one core): 1400 req/s on 2.00 cores" in text
    assert "600 MiB RSS, 500 MiB PSS; without traces 200 MiB RSS" in text
