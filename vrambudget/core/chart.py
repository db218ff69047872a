"""An SVG picture of a comparison: each tier's estimate against the measurement, per quantity.

Hand-written SVG 1.1 (standard library only, no external resources, :mod:`.svg`),
deterministic for a given comparison. One row per measured quantity; in each row one bar per
tier estimate and one for the measurement. The rows form two groups, the quantities and (last,
below a thin rule) the totals that sum them (``allocated_peak``, ``device_used_peak``); the
bars of a group share one scale, its largest value at :data:`BAR_WIDTH` px, drawn as an axis
under the group (942 MiB of weights and 3.2 MiB of KV cache look as different as they are).
Values are in MiB; each estimate bar ends with its difference and verdict. Quantities the
report cannot measure, and those zero on both sides, are named in footnotes.

    vrambudget chart comparison.json -o comparison.svg     # a Comparison or a probe resource
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from xml.sax.saxutils import escape

import msgspec

from .comparison import Comparison, QuantityComparison, quantity_label
from .svg import MUTED, document, num, percent, text, ticks

__all__ = [
    "BAR_WIDTH",
    "TOTALS",
    "ChartInputError",
    "default_title",
    "load_comparison",
    "render_comparison_svg",
    "run_chart",
]

TOTALS = ("allocated_peak", "device_used_peak")
"""The quantities that sum the others: drawn last, below a rule."""

WIDTH = 900
BAR_X = 190
"""Where the bars start (the quantity names are right-aligned before it)."""
BAR_WIDTH = 480
"""The length of a group's largest bar."""
VERDICT_X = 740
BAR_H = 14
BAR_GAP = 3
ROW_PAD = 12
TOP = 104
AXIS_H = 30
"""Below each group: its axis, tick labels and the space to the next group."""
MEASURED = "measured"

SERIES_COLOURS = {"analytic": "#4e79a7", "trace": "#b07aa1", MEASURED: "#8c8c8c"}
VERDICT_COLOURS = {"within": "#2e7d32", "over": "#b26a00", "under": "#c62828"}
_MUTED = MUTED
_MIB = 1 << 20


class ChartInputError(ValueError):
    """The input is not a comparison (or a probe resource holding one)."""


@dataclass(frozen=True, slots=True)
class _Bar:
    series: str
    value: int
    quantity: QuantityComparison | None
    """The tier's comparison for an estimate bar (None for the measured bar)."""


@dataclass(frozen=True, slots=True)
class _Row:
    name: str
    bars: tuple[_Bar, ...]


def _mib(value: int) -> str:
    """One decimal; a non-zero value that would print as 0.0 prints as <0.1."""
    s = f"{value / _MIB:.1f}"
    if value and s.lstrip("-") == "0.0":
        return "<0.1" if value > 0 else ">-0.1"
    return s


def _comparable(q: QuantityComparison) -> bool:
    return q.estimate_bytes is not None and q.measured_bytes is not None


def _rows(comparison: Comparison) -> tuple[list[_Row], list[str], list[str]]:
    """The rows to draw (totals last), the names of the quantities no tier can compare, and
    those that are zero in every estimate and in the measurement (nothing to draw)."""
    names: list[str] = []
    by_tier: list[tuple[str, dict[str, QuantityComparison]]] = []
    for tier in comparison.tiers:
        qs = {q.name: q for q in tier.quantities}
        by_tier.append((tier.method, qs))
        names.extend(n for n in qs if n not in names)
    rows: list[_Row] = []
    skipped: list[str] = []
    zeros: list[str] = []
    for name in names:
        bars: list[_Bar] = []
        measured: int | None = None
        for method, qs in by_tier:
            q = qs.get(name)
            if q is None or not _comparable(q):
                continue
            assert q.estimate_bytes is not None
            bars.append(_Bar(method, q.estimate_bytes, q))
            measured = q.measured_bytes if measured is None else measured
        if measured is None:
            skipped.append(name)
            continue
        bars.append(_Bar(MEASURED, measured, None))
        if all(b.value == 0 for b in bars):
            zeros.append(name)
            continue
        rows.append(_Row(name, tuple(bars)))
    rows.sort(key=lambda r: r.name in TOTALS)  # stable: the vocabulary order otherwise
    return rows, skipped, zeros


def _verdict_label(q: QuantityComparison) -> str:
    """``+19.1% over``; a difference that rounds to nothing is ``0.0%``, never ``-0.0%``."""
    p = q.difference_percent
    pct = "" if p is None else f"{percent(p)} "
    return f"{pct}{q.verdict}"


def _row_height(row: _Row) -> int:
    return len(row.bars) * (BAR_H + BAR_GAP) - BAR_GAP + ROW_PAD


def _subtitle(c: Comparison) -> str:
    h = c.headroom
    return (
        f"tolerance {c.tolerance_percent:g}% (or {_mib(c.tolerance_bytes)} MiB); "
        f"advised headroom {h.fraction * 100:.0f}% ({_mib(h.bytes)} MiB); "
        "values in MiB, one scale per group"
    )


def default_title(c: Comparison) -> str:
    """``Estimate vs measured: qwen2.5-0.5b on NVIDIA H100 (probe p1)``: the model (when the
    comparison names it), the device and the probe."""
    model = f"{c.model} on " if c.model else ""
    return f"Estimate vs measured: {model}{c.device_name} (probe {c.probe_id})"


def _groups(rows: list[_Row]) -> list[list[_Row]]:
    """The quantities, then the totals: each group is drawn on its own scale."""
    parts = [r for r in rows if r.name not in TOTALS]
    totals = [r for r in rows if r.name in TOTALS]
    return [g for g in (parts, totals) if g]


def _axis(y: float, top: int) -> list[str]:
    """A group's axis: 0 .. ``top`` bytes over :data:`BAR_WIDTH`, ticks in MiB."""
    out = [
        f'<line class="axis" x1="{BAR_X}" y1="{num(y)}" x2="{BAR_X + BAR_WIDTH}" '
        f'y2="{num(y)}" stroke="#999999" stroke-width="1"/>'
    ]
    for t in ticks(top / _MIB, most=6):
        tx = BAR_X + t * _MIB / top * BAR_WIDTH
        if tx > BAR_X + BAR_WIDTH + 0.5:
            break
        out.append(
            f'<line class="tick" x1="{num(tx)}" y1="{num(y)}" x2="{num(tx)}" '
            f'y2="{num(y + 4)}" stroke="#999999" stroke-width="1"/>'
        )
        out.append(text(tx, y + 15, f"{t:g}", size=10, fill=_MUTED, anchor="middle", cls="tick"))
    return out


def render_comparison_svg(comparison: Comparison, *, title: str | None = None) -> str:
    """The comparison as an SVG document (text; the same comparison gives the same text)."""
    rows, skipped, zeros = _rows(comparison)
    series = [t.method for t in comparison.tiers] + [MEASURED]
    heading = title if title is not None else default_title(comparison)
    body: list[str] = [
        text(20, 30, heading, size=18, weight="bold", cls="title"),
        text(20, 52, _subtitle(comparison), size=12, fill=_MUTED, cls="subtitle"),
    ]
    # The legend.
    x = 20.0
    for s in series:
        label = MEASURED if s == MEASURED else f"{s} estimate"
        body.append(
            f'<rect class="legend" x="{num(x)}" y="66" width="12" height="12" '
            f'fill="{SERIES_COLOURS.get(s, "#999999")}"/>'
        )
        body.append(text(x + 17, 76, label, size=12, cls="legend"))
        x += 17 + 6.5 * len(label) + 20
    body.append(text(BAR_X - 10, 96, "quantity", size=11, fill=_MUTED, anchor="end"))
    body.append(text(BAR_X, 96, "MiB", size=11, fill=_MUTED))
    body.append(text(VERDICT_X, 96, "estimate - measured", size=11, fill=_MUTED))

    y = float(TOP)
    desc: list[str] = []
    if not rows:
        body.append(
            text(BAR_X, y + 16, "no quantity has both an estimate and a measurement", fill=_MUTED)
        )
        y += 28
    for g, group in enumerate(_groups(rows)):
        if g:
            body.append(
                f'<line class="rule" x1="20" y1="{num(y - ROW_PAD / 2)}" '
                f'x2="{WIDTH - 20}" y2="{num(y - ROW_PAD / 2)}" '
                f'stroke="#bbbbbb" stroke-width="1"/>'
            )
        top = max(b.value for row in group for b in row.bars)
        for row in group:
            label = quantity_label(row.name)
            height = _row_height(row) - ROW_PAD
            body.append(
                text(BAR_X - 10, y + height / 2 + 4, label, size=12, anchor="end", cls="quantity")
            )
            for i, bar in enumerate(row.bars):
                by = y + i * (BAR_H + BAR_GAP)
                w = bar.value / top * BAR_WIDTH if top > 0 else 0.0
                colour = SERIES_COLOURS.get(bar.series, "#999999")
                tip = f"{label}, {bar.series}: {bar.value:,} B"
                body.append(
                    f'<rect class="bar" id="bar-{row.name}-{bar.series}" '
                    f'x="{BAR_X}" y="{num(by)}" width="{num(w)}" height="{BAR_H}" '
                    f'fill="{colour}"><title>{escape(tip)}</title></rect>'
                )
                body.append(
                    text(BAR_X + w + 4, by + BAR_H - 3, _mib(bar.value), size=11, cls="value")
                )
                if bar.quantity is not None:
                    v = bar.quantity.verdict
                    body.append(
                        text(
                            VERDICT_X,
                            by + BAR_H - 3,
                            _verdict_label(bar.quantity),
                            size=11,
                            fill=VERDICT_COLOURS.get(v, _MUTED),
                            weight="bold",
                            cls=f"verdict {v}",
                        )
                    )
            desc.append(
                f"{label}: "
                + ", ".join(
                    f"{b.series} {_mib(b.value)} MiB"
                    + (f" ({_verdict_label(b.quantity)})" if b.quantity is not None else "")
                    for b in row.bars
                )
                + "."
            )
            y += _row_height(row)
        body.extend(_axis(y - ROW_PAD + 4, top))
        y += AXIS_H

    # Footnotes: what was not measured, and why the report is degraded.
    notes: list[tuple[str, str]] = []
    if skipped:
        names = ", ".join(quantity_label(n) for n in skipped)
        notes.extend(("footnote", line) for line in textwrap.wrap(f"not measured: {names}", 140))
    if zeros:
        names = ", ".join(quantity_label(n) for n in zeros)
        notes.extend(
            ("zeros", line)
            for line in textwrap.wrap(f"zero in the estimate and the measurement: {names}", 140)
        )
    for d in comparison.degraded:
        notes.extend(("degraded", line) for line in textwrap.wrap(d, 140))
    if not rows:
        y += 8
    for cls, line in notes:
        y += 15
        body.append(text(20, y, line, size=10, fill=_MUTED, cls=cls))
    height = int(y + 16)
    summary = (
        f"{heading}. Bars per measured quantity: each tier's estimate and the measurement, "
        "one scale per group. " + " ".join(desc)
    )
    return document(WIDTH, height, heading, summary, body)


def load_comparison(raw: bytes) -> Comparison:
    """A Comparison from JSON: the comparison itself, or an object (a probe resource) with a
    ``comparison`` key holding it. Raises ChartInputError with what is wrong."""
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ChartInputError(f"not JSON: {exc}") from None
    if isinstance(data, dict) and "comparison" in data:
        data = data["comparison"]
        if data is None:
            raise ChartInputError("the probe resource has no comparison (null)")
    try:
        return msgspec.convert(data, Comparison)
    except msgspec.ValidationError as exc:
        raise ChartInputError(f"not a comparison: {exc}") from None


def run_chart(file: str, out: str | None = None, title: str | None = None) -> int:
    """``vrambudget chart``: read ``file`` ('-': stdin), write the SVG to ``out`` or stdout.
    Returns the exit status (2, with a message on stderr, for bad input)."""
    try:
        if file == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(file, "rb") as f:
                raw = f.read()
        svg = render_comparison_svg(load_comparison(raw), title=title)
    except (OSError, ChartInputError) as exc:
        print(f"error: {file}: {exc}", file=sys.stderr)
        return 2
    if out is None:
        sys.stdout.write(svg)
        return 0
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(svg)
    except OSError as exc:
        print(f"error: {out}: {exc}", file=sys.stderr)
        return 2
    return 0
