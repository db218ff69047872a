"""Where the CUDA driver puts a new cudaMalloc segment, checked against the GPU campaigns.

The caching allocator's best fit breaks ties between free blocks of equal size by address
(``BlockComparatorSize``: size, then pointer). Which of two equal blocks a request takes
decides which segment it splits, and so later merges and whether the next large request finds
room in the cache or needs a new segment. The addresses are the driver's. This replays the
trace tier's recording of every measured single-stream run of the committed H100 campaign
(``research/data/gpu/gpu_campaign_2026-12-05T*_h100-sxm5-80gb.json``; the H200 campaign's
inference runs measured the same bytes) through the allocator model twice -- new segments
placed above the last one (``rising``) and below it (``falling``) -- and prints each against the
measured ``max_memory_reserved`` and inactive-split peak.

The replay is the trace tier's (:func:`vrambudget.trace.engine.record_workload_code` with the
GEMM workspaces of the campaign's device, two iterations), on fake CPU tensors: it needs torch
and transformers, and takes a few minutes.

Run from the repository root:
    python -m research.allocator_addresses [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from research.gpu_campaign import GPU_DATA
from vrambudget.core.spec import BudgetRequest, TraceOptions, Workload
from vrambudget.core.spec.requests import CatalogDevice
from vrambudget.trace.engine import record_workload_code, request_workspaces
from vrambudget.trace.replay import replay

__all__ = ["Row", "main", "rows"]

CAMPAIGNS = "gpu_campaign_2026-12-05T*_h100-sxm5-80gb.json"
EXCLUDED = {
    # 16 threads on 16 streams: the model replays one stream.
    "framework-generate-16-streams": "16 CUDA streams; the model replays one",
}


@dataclass(frozen=True)
class Row:
    name: str
    measured_reserved: int
    measured_inactive: int
    rising_reserved: int
    falling_reserved: int
    rising_inactive: int
    falling_inactive: int

    def error(self, order: str) -> float:
        got = self.falling_reserved if order == "falling" else self.rising_reserved
        return got / self.measured_reserved - 1


def _results(path: Path) -> list[tuple[dict[str, Any], str | None]]:
    doc = json.loads(path.read_text())
    gpu = (doc.get("device") or {}).get("gpu_id")
    return [(r, gpu) for r in doc["results"]]


def rows(only: set[str] | None = None) -> list[Row]:
    out: list[Row] = []
    for path in sorted(GPU_DATA.glob(CAMPAIGNS)):
        for r, gpu in _results(path):
            m = r.get("measured") or {}
            if not m.get("torch_max_memory_reserved") or r["name"] in EXCLUDED:
                continue
            if only and r["name"] not in only:
                continue
            w = msgspec.convert(r.get("estimated_workload") or r["workload"], Workload)
            request = BudgetRequest(
                method="trace",
                workloads=(w,),
                device=CatalogDevice(id=gpu) if gpu else None,
                trace=TraceOptions(code=r["code"]),
            )
            trace, _ = record_workload_code(
                w, workspaces=request_workspaces(request), code=r["code"]
            )
            rise, fall = (replay(trace, segment_order=o) for o in ("rising", "falling"))
            out.append(
                Row(
                    name=r["name"],
                    measured_reserved=m["torch_max_memory_reserved"],
                    measured_inactive=m["torch_inactive_split_peak"],
                    rising_reserved=rise.peak_reserved_bytes,
                    falling_reserved=fall.peak_reserved_bytes,
                    rising_inactive=rise.peak_inactive_split_bytes,
                    falling_inactive=fall.peak_inactive_split_bytes,
                )
            )
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}"


def table(found: list[Row]) -> str:
    lines = [
        "| run | reserved peak, MiB | rising | falling | inactive-split peak, MiB "
        "| rising | falling |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in found:
        lines.append(
            f"| {r.name} | {_mib(r.measured_reserved)} | {r.error('rising'):+.2%} "
            f"| {r.error('falling'):+.2%} | {_mib(r.measured_inactive)} "
            f"| {_mib(r.rising_inactive)} | {_mib(r.falling_inactive)} |"
        )
    for order in ("rising", "falling"):
        errs = [abs(r.error(order)) for r in found]
        lines.append(
            f"\n{order}: median |error| {statistics.median(errs):.2%}, "
            f"largest {max(errs):.2%} over {len(errs)} runs"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", help="a run's name (repeatable)")
    args = p.parse_args(argv)
    print(table(rows(set(args.only) if args.only else None)))


if __name__ == "__main__":
    main()
