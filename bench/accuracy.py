"""Accuracy against the corpus of published real measurements (research/data/corpus): the
estimate's error and its band's coverage per split, workload class, framework, GPU and version,
the worst cases, and the issue's targets.

Run from the repository root:
    .venv/bin/python -m bench.accuracy            # markdown tables (docs/ACCURACY.md)
    .venv/bin/python -m bench.accuracy --json     # the held-out summary as JSON
    .venv/bin/python -m bench.accuracy --write-docs   # rewrite the tables in docs/ACCURACY.md
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from research.corpus import Prediction, Record, load, predict, request_of
from vrambudget.core.bands import band_rule, workload_class
from vrambudget.core.stack import resolve_stack

__all__ = ["TARGETS", "Row", "rows", "summarize"]

TARGETS = {
    "peak_median_abs_error": 0.05,
    "serving_kv_tokens_median_abs_error": 0.03,
    "coverage": 0.90,
    "band_median_half_width": 0.10,
}


@dataclass(frozen=True, slots=True)
class Row:
    prediction: Prediction
    workload_class: str
    low: float
    high: float
    """The band's ends, bytes (peaks) or the prediction itself (other quantities)."""

    @property
    def record(self) -> Record:
        return self.prediction.record

    @property
    def inside(self) -> bool:
        return self.low <= self.record.measured <= self.high

    @property
    def half_width(self) -> float:
        """Half the band's width relative to the estimate."""
        return (self.high - self.low) / 2 / self.prediction.predicted

    @property
    def says_fits_but_exceeded(self) -> bool:
        """On a device one byte smaller than the measured peak (the run would not fit), the
        answer would still say ``fits``: the band's high end is below the measured peak."""
        return self.high < self.record.measured


def rows() -> list[Row]:
    out = []
    for r in load():
        if r.workload is None or r.excluded:
            continue
        p = predict(r)
        req = request_of(r)
        cls = workload_class(req.workloads[0])
        if r.quantity == "peak_device_bytes":
            rule = band_rule((cls,), resolve_stack(req.software))
            # The answer's band: its low end never below the bytes counted from the tensors.
            low = max(p.predicted * rule.low, min(p.counted, p.predicted))
            high = p.predicted * rule.high
        else:
            cls = f"serving_{r.quantity}"
            low = high = p.predicted
        out.append(Row(p, cls, low, high))
    return out


def summarize(rs: Iterable[Row]) -> dict[str, float | int]:
    rs = list(rs)
    errors = [abs(r.prediction.error) for r in rs]
    signed = [r.prediction.error for r in rs]
    return {
        "n": len(rs),
        "median_abs_error": median(errors) if errors else math.nan,
        "max_abs_error": max(errors) if errors else math.nan,
        "median_signed_error": median(signed) if signed else math.nan,
        "under": sum(e < 0 for e in signed),
        "coverage": sum(r.inside for r in rs) / len(rs) if rs else math.nan,
        "median_half_width": median(r.half_width for r in rs) if rs else math.nan,
        "exceeded_but_fits": sum(r.says_fits_but_exceeded for r in rs),
    }


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _table(title: str, groups: dict[str, list[Row]], band: bool) -> None:
    print(f"\n#### {title}\n")
    cols = "| group | n | median abs. error | max | median signed | under"
    cols += " | inside band | band median half-width | high end below measured |" if band else " |"
    print(cols)
    print("|---" * (cols.count("|") - 1) + "|")
    for name, rs in sorted(groups.items()):
        s = summarize(rs)
        line = (
            f"| {name} | {s['n']} | {_pct(s['median_abs_error'])} | {_pct(s['max_abs_error'])} "
            f"| {_pct(s['median_signed_error'])} | {s['under']}"
        )
        if band:
            line += (
                f" | {_pct(s['coverage'])} | {_pct(s['median_half_width'])} "
                f"| {s['exceeded_but_fits']} |"
            )
        else:
            line += " |"
        print(line)


def _by(rs: list[Row], key: Callable[[Row], str]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = defaultdict(list)
    for r in rs:
        out[key(r)].append(r)
    return out


def report(rs: list[Row]) -> dict[str, dict[str, float | int]]:
    """The markdown tables; returns the held-out summaries the targets are judged on."""
    peaks = [r for r in rs if r.record.quantity == "peak_device_bytes"]
    serving = [r for r in rs if r.record.quantity != "peak_device_bytes"]
    for split in ("held_out", "calibrate"):
        ps = [r for r in peaks if r.prediction.split == split]
        ss = [r for r in serving if r.prediction.split == split]
        print(f"\n### {split.replace('_', '-')} split\n")
        _table("Device peaks by workload class", _by(ps, lambda r: r.workload_class), True)
        _table("Device peaks by framework", _by(ps, lambda r: r.record.framework), True)
        _table("Device peaks by GPU", _by(ps, lambda r: r.record.gpu_id or r.record.gpu), True)
        _table("Device peaks by memory view", _by(ps, lambda r: r.record.view), True)
        _table(
            "Weights, KV cache and serving quantities by framework and version",
            _by(
                ss,
                lambda r: f"{r.record.framework} {_version_asked(r)} {r.record.quantity}",
            ),
            False,
        )
    held = [r for r in peaks if r.prediction.split == "held_out"]
    print("\n### Worst held-out peaks\n")
    print("| record | class | view | measured GB | estimate GB | error | band |")
    print("|---|---|---|---:|---:|---:|---|")
    for r in sorted(held, key=lambda r: -abs(r.prediction.error))[:12]:
        print(
            f"| {r.record.id} | {r.workload_class} | {r.record.view} | "
            f"{r.record.measured / 1e9:.2f} | {r.prediction.predicted / 1e9:.2f} | "
            f"{100 * r.prediction.error:+.1f}% | {r.low / 1e9:.2f} .. {r.high / 1e9:.2f} |"
        )
    kv = [
        r
        for r in serving
        if r.prediction.split == "held_out" and r.record.quantity == "kv_cache_tokens"
    ]
    return {
        "peaks_held_out": summarize(held),
        "peaks_calibrate": summarize([r for r in peaks if r.prediction.split == "calibrate"]),
        "serving_kv_tokens_held_out": summarize(kv),
        **{
            f"class_{k}_held_out": summarize(v)
            for k, v in _by(held, lambda r: r.workload_class).items()
        },
    }


def _engine_log_kv() -> list[tuple[str, int, float, tuple[str, float, int] | None]]:
    """KV tokens against the published startup logs (research/engine_logs.py, all held out):
    per engine, the median |error| and for vLLM the worst minor release's median."""
    from research.engine_logs import checks, kv_errors_by_release

    out: list[tuple[str, int, float, tuple[str, float, int] | None]] = []
    rows = [c for c in checks() if c.quantity == "KV tokens"]
    for engine, label in (("vllm", "vLLM"), ("sglang", "SGLang")):
        errs = [c for c in rows if c.engine == engine]
        if not errs:
            continue
        worst = None
        if engine == "vllm":
            medians = {
                v: (statistics.median(abs(x) for x in e), len(e))
                for v, e in kv_errors_by_release(errs).items()
            }
            release = max(medians, key=lambda v: medians[v][0])
            worst = (release, *medians[release])
        out.append((label, len(errs), statistics.median(abs(c.error) for c in errs), worst))
    return out


DOCS = Path(__file__).parents[1] / "docs" / "ACCURACY.md"
_BLOCK = re.compile(r"(<!-- accuracy-tables -->\n).*?(<!-- /accuracy-tables -->)", re.S)


def docs_with_tables(doc: str, rs: list[Row]) -> str:
    """``doc`` with its accuracy-tables block replaced by the tables of ``rs``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_all(rs)
    text = out.getvalue().strip()
    return _BLOCK.sub(lambda m: m.group(1) + text + "\n" + m.group(2), doc)


def main(argv: list[str]) -> int:
    rs = rows()
    if "--write-docs" in argv:
        DOCS.write_text(docs_with_tables(DOCS.read_text(), rs))
        return 0
    if "--json" in argv:
        with contextlib.redirect_stdout(io.StringIO()):
            summary = report(rs)
        print(json.dumps(summary, indent=1))
        return 0
    _print_all(rs)
    return 0


def _version_asked(r: Row) -> str:
    """The release a row's request named: a serving workload's ``engine_version`` (the run's
    release, dated where the source does not print it), else the record's framework version."""
    w = r.record.workload or {}
    return w.get("engine_version") or r.record.framework_version or "?"


def _print_all(rs: list[Row]) -> None:
    out = report(rs)
    s = out["peaks_held_out"]
    kv = out["serving_kv_tokens_held_out"]
    print("\n### Targets (held-out split)\n")
    print("| target | goal | measured |")
    print("|---|---:|---:|")
    print(f"| device peak median abs. error | <= 5% | {_pct(s['median_abs_error'])} |")
    print(
        "| serving KV tokens median abs. error, corpus records "
        f"({kv['n']}) | <= 3% | {_pct(kv['median_abs_error'])} |"
    )
    for engine, n, med, worst in _engine_log_kv():
        print(f"| {engine} KV tokens median abs. error, startup logs ({n}) | <= 3% | {_pct(med)} |")
        if worst is not None:
            release, m, k = worst
            print(
                f"| {engine} KV tokens, the worst release's median ({release}, {k} logs) "
                f"| <= 3% | {_pct(m)} |"
            )
    print(f"| peaks inside their band | >= 90% | {_pct(s['coverage'])} |")
    # two decimals: a width just above the goal must not print as the goal
    print(f"| band median half-width | <= 10% | {100 * s['median_half_width']:.2f}% |")
    print(f"| 'fits' for a run that exceeded its device | 0 | {s['exceeded_but_fits']} |")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
