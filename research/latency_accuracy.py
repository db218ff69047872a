"""The roofline latency estimate (vrambudget/core/roofline.py) against published measurements
(``research/data/latency_measurements.json``): each record is re-created from its conditions
(model dimensions, weights bytes, GPU, tensor parallel degree, batch, lengths) with the
catalog's peak rates and the default efficiencies (MFU 0.5, MBU 0.7) -- nothing is fitted on
these records -- and the estimate is compared with the measured value.

    .venv/bin/python -m research.latency_accuracy        # the table docs/LATENCY.md quotes
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrambudget.core.gpu_perf import gpu_perf
from vrambudget.core.roofline import ModelCost, Rates, decode_step, prefill_step

DATA = Path(__file__).parent / "data" / "latency_measurements.json"


@dataclass(frozen=True, slots=True)
class Compared:
    id: str
    gpu: str
    metric: str
    measured: float
    estimated: float

    @property
    def error(self) -> float:
        """(estimated - measured) / measured, signed."""
        return (self.estimated - self.measured) / self.measured


def records() -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = json.loads(DATA.read_text())["records"]
    return recs


def cost_of(rec: dict[str, Any]) -> ModelCost:
    """Per-device work of the record's model: matmul parameters are all but the input
    embedding (the untied output head multiplies), split over the tensor-parallel degree."""
    m, t = rec["model"], rec["tensor"]
    matmul = m["num_params"] - m["vocab_size"] * m["hidden_size"]
    return ModelCost(
        weight_bytes=rec["weight_bytes"] // t,
        kv_bytes_per_token=2
        * m["num_layers"]
        * m["num_kv_heads"]
        * m["head_dim"]
        * rec["kv_bytes_per_elem"]
        // t,
        linear_flops_per_token=2 * matmul // t,
        attention_flops_per_position=4 * m["num_layers"] * m["num_heads"] * m["head_dim"] // t,
        tensor=t,
    )


def estimate(rec: dict[str, Any]) -> float:
    """The record's metric as the roofline estimates it."""
    perf = gpu_perf()[rec["gpu"]]
    peak = perf.peak_flops(rec["compute_format"])
    assert peak is not None, rec["id"]
    rates = Rates(peak_flops=peak, bandwidth_bytes_per_s=perf.memory_bandwidth_bytes_per_s)
    cost, b = cost_of(rec), rec["batch"]
    p, n = rec["prompt_tokens"], rec["output_tokens"]
    match rec["metric"]:
        case "decode_tokens_per_s":  # llama-bench tg: n tokens generated from an empty cache
            seconds = sum(decode_step(cost, rates, b, p + i).seconds for i in range(n))
            return b * n / seconds
        case "prefill_tokens_per_s":
            return b * p / prefill_step(cost, rates, p, b).seconds
        case "request_latency_ms":  # prefill (the first token), then n - 1 decode steps
            seconds = prefill_step(cost, rates, p, b).seconds
            seconds += sum(decode_step(cost, rates, b, p + i).seconds for i in range(1, n))
            return seconds * 1000.0
    raise ValueError(rec["metric"])


def compared() -> list[Compared]:
    return [
        Compared(r["id"], r["gpu"], r["metric"], float(r["measured"]), estimate(r))
        for r in records()
    ]


def summary(rows: list[Compared]) -> dict[str, float]:
    errs = [abs(c.error) for c in rows]
    return {
        "records": len(rows),
        "median_abs_error": statistics.median(errs),
        "max_abs_error": max(errs),
    }


def main() -> None:
    rows = compared()
    print("| record | GPU | metric | measured | estimated | error |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for c in rows:
        print(
            f"| {c.id} | {c.gpu} | {c.metric} | {c.measured:,.2f} | {c.estimated:,.2f} "
            f"| {c.error * 100:+.1f}% |"
        )
    for metric in sorted({c.metric for c in rows}):
        s = summary([c for c in rows if c.metric == metric])
        print(
            f"\n{metric}: {s['records']:.0f} records, median |error| "
            f"{s['median_abs_error'] * 100:.1f}%, max {s['max_abs_error'] * 100:.1f}%"
        )
    s = summary(rows)
    print(
        f"\nall: {s['records']:.0f} records, median |error| {s['median_abs_error'] * 100:.1f}%, "
        f"max {s['max_abs_error'] * 100:.1f}%"
    )


if __name__ == "__main__":
    main()
