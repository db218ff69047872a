"""The comparison chart (vrambudget/core/chart.py): a CPU probe's real comparison, and a hand-built
CUDA-like one with two tiers and every verdict."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tests.support.comparisons import MIB, SVG, cuda_comparison, parse_svg, svg_texts
from vrambudget.core.chart import BAR_WIDTH, TOTALS, VERDICT_COLOURS, render_comparison_svg
from vrambudget.core.comparison import Comparison, quantity_label


def _bars(root: ET.Element) -> dict[str, float]:
    return {
        r.get("id", ""): float(r.get("width", "nan"))
        for r in root.iter(f"{SVG}rect")
        if r.get("class") == "bar"
    }


def _check_bars(c: Comparison, root: ET.Element) -> None:
    """One bar per (row, series), each as long as its value over the largest of its group
    (the quantities; the totals)."""
    bars = _bars(root)
    expected: dict[str, float] = {}
    rows: dict[str, dict[str, int]] = {}
    for tier in c.tiers:
        for q in tier.quantities:
            if (
                q.estimate_bytes is None
                or q.measured_bytes is None
                or not (q.estimate_bytes or q.measured_bytes)
            ):
                continue
            row = rows.setdefault(q.name, {})
            row[tier.method] = q.estimate_bytes
            row["measured"] = q.measured_bytes
    tops = {
        group: max(
            v for n, values in rows.items() if (n in TOTALS) == group for v in values.values()
        )
        for group in {n in TOTALS for n in rows}
    }
    for name, values in rows.items():
        top = tops[name in TOTALS]
        for s, v in values.items():
            expected[f"bar-{name}-{s}"] = v / top * BAR_WIDTH if top else 0.0
    assert bars.keys() == expected.keys()
    for k, w in expected.items():
        assert bars[k] == pytest.approx(w, abs=0.006), k


def test_cpu_comparison_chart(cpu_comparison: Comparison) -> None:
    c = cpu_comparison
    svg = render_comparison_svg(c)
    root = parse_svg(svg)
    _check_bars(c, root)
    # CPU: resident, KV cache, working set and allocated peak are measured.
    names = ["resident_after_load", "kv_cache", "working_set_peak", "allocated_peak"]
    assert svg_texts(root, "quantity") == [
        "Resident after load",
        "KV cache",
        "Working set peak",
        "Allocated peak",
    ]
    assert len(_bars(root)) == 8
    values = svg_texts(root, "value")
    q = {x.name: x for x in c.tiers[0].quantities}
    for name in names:
        assert f"{q[name].measured_bytes / MIB:.1f}" in values  # type: ignore[operator]
    # One scale per group: the KV cache's bar is as much shorter than the weights' as it is
    # smaller (not scaled to its own row, where every bar would be full length).
    bars = _bars(root)
    resident, kv = q["resident_after_load"], q["kv_cache"]
    assert kv.measured_bytes and resident.measured_bytes
    assert bars["bar-kv_cache-measured"] == pytest.approx(
        BAR_WIDTH * kv.measured_bytes / resident.measured_bytes, abs=0.006
    )
    assert bars["bar-kv_cache-measured"] < BAR_WIDTH / 10
    verdicts = svg_texts(root, "verdict")
    assert len(verdicts) == 4 and all(v.endswith(" within") for v in verdicts)
    foot = " ".join(svg_texts(root, "footnote"))
    assert foot.startswith("not measured: ")
    for name in (
        "runtime_workspace",
        "cuda_context",
        "allocator_overhead",
        "device_used_peak",
        "unexplained",
    ):
        assert quantity_label(name) in foot and name not in foot
    assert "_" not in " ".join(svg_texts(root, "quantity") + svg_texts(root, "footnote"))
    assert c.model == "custom"  # the estimate's workload name for a model given by dimensions
    assert svg_texts(root, "title") == ["Estimate vs measured: custom on cpu (probe p1)"]
    sub = svg_texts(root, "subtitle")[0]
    assert "tolerance 10%" in sub and "one scale per group" in sub
    assert f"advised headroom {c.headroom.fraction * 100:.0f}%" in sub
    assert render_comparison_svg(c) == svg  # deterministic


def test_cuda_like_chart_colours_order_and_escaping() -> None:
    c = cuda_comparison()
    svg = render_comparison_svg(c)
    root = parse_svg(svg)
    _check_bars(c, root)
    assert len(_bars(root)) == 6 * 3  # six measured rows x (analytic, trace, measured)
    # Totals last, below the rule, whatever their order in the comparison.
    assert svg_texts(root, "quantity") == [
        "Resident after load",
        "KV cache",
        "Working set peak",
        "Unexplained",
        "Allocated peak",
        "Device used peak",
    ]
    assert len([e for e in root.iter(f"{SVG}line") if e.get("class") == "rule"]) == 1
    # One scale per group: the quantities' largest value is resident_after_load's 1000 MiB,
    # so kv_cache's analytic 300 MiB is 0.3 x 480 = 144 px and its measured 200 MiB 96 px;
    # the totals' largest is device_used_peak's measured 3300 MiB: allocated_peak's
    # measured 2100 MiB is 2100 / 3300 x 480 = 305.45 px.
    bars = _bars(root)
    assert bars["bar-resident_after_load-measured"] == BAR_WIDTH
    assert bars["bar-kv_cache-analytic"] == 144
    assert bars["bar-kv_cache-measured"] == 96
    assert bars["bar-unexplained-measured"] == 24  # 50 / 1000 x 480
    assert bars["bar-device_used_peak-measured"] == BAR_WIDTH
    assert bars["bar-allocated_peak-measured"] == 305.45
    assert bars["bar-unexplained-analytic"] == 0
    # Each group has its axis: ticks in MiB from 0 to the group's largest value.
    ticks = svg_texts(root, "tick")
    assert ticks == ["0", "200", "400", "600", "800", "1000", "0", "1000", "2000", "3000"]
    verdicts = {
        "".join(t.itertext()): t.get("fill")
        for t in root.iter(f"{SVG}text")
        if (t.get("class") or "").startswith("verdict")
    }
    assert verdicts["+50.0% over"] == VERDICT_COLOURS["over"]
    assert verdicts["-33.3% under"] == VERDICT_COLOURS["under"]
    assert verdicts["+6.7% within"] == VERDICT_COLOURS["within"]
    assert verdicts["-100.0% under"] == VERDICT_COLOURS["under"]
    assert verdicts["0.0% within"] == VERDICT_COLOURS["within"]  # 0, never "+0.0%"
    assert len(set(VERDICT_COLOURS.values())) == 3
    values = svg_texts(root, "value")
    assert "300.0" in values and "2100.0" in values and "3300.0" in values
    assert "MiB" not in " ".join(values)  # the unit is at the edge only
    assert svg_texts(root, "footnote") == ["not measured: Communication buffers"]
    # A quantity zero on both sides (a 0-byte workspace) gets no bars, only a footnote.
    assert "bar-runtime_workspace-measured" not in bars
    zeros = "zero in the estimate and the measurement: Runtime workspace"
    assert svg_texts(root, "zeros") == [zeros]
    # Escaping: the device name and probe id come back as written.
    assert svg_texts(root, "title") == [
        "Estimate vs measured: qwen<2> on NVIDIA <H100> & co (probe p<2>)"
    ]
    assert "&lt;H100&gt; &amp; co" in svg
    assert "advised headroom 7% (210.0 MiB)" in svg_texts(root, "subtitle")[0]
    # Legend: one entry per tier and the measurement, distinct colours.
    legend = [r.get("fill") for r in root.iter(f"{SVG}rect") if r.get("class") == "legend"]
    assert len(legend) == 3 == len(set(legend))
    assert svg_texts(root, "legend") == ["analytic estimate", "trace estimate", "measured"]
    assert render_comparison_svg(c, title="a & b") != svg
    assert svg_texts(parse_svg(render_comparison_svg(c, title="a & b")), "title") == ["a & b"]
    assert render_comparison_svg(cuda_comparison()) == svg
