"""An SVG picture of a budget: one stacked bar per device, every component a segment.

Hand-written SVG 1.1 (standard library only, no external resources, :mod:`.svg`),
deterministic for a given budget. All rows share one scale, so devices compare at a glance:

- each device's bar stacks its components in vocabulary order (weights first, headroom last,
  hatched: a margin, not an allocation); a component of 0 bytes has no segment and is named
  in a footnote;
- with a device, its capacity is a dashed vertical line, the free space a dashed box after the
  bar, and the part of a bar beyond the capacity outlined in red (the right column says
  ``fits`` / ``does not fit`` and by how much);
- the error band of a device's subtotal (:mod:`.bands`: the range the real peak falls in for
  ``coverage`` of the published measurements) is a whisker under its bar, around the point
  where the subtotal (the bar without its headroom) ends;
- below the axis, each device's components with their sizes and shares, so a segment too
  small to see is still named and sized.

The geometry (what the tests check by hand):

- the scale: the bar area is :data:`BAR_WIDTH` px wide and ends at ``end`` bytes, the largest
  of the capacity, the devices' totals and their bands' high ends, but at most
  :data:`BAND_REACH` x the larger of the capacity and the totals (a wide band is clipped
  there, drawn with an arrow, and its high end stays in its label);
- a segment is ``bytes x BAR_WIDTH / end`` px wide, except that a non-zero segment narrower
  than :data:`MIN_SEGMENT` px is drawn that wide and the device's widest segment gives up the
  difference (so every bar still ends exactly at its total);
- coordinates are written with two decimals.

    vrambudget estimate --model llama-3.1-8b --gpu l4-24gb --svg budget.svg
    curl -X POST 'http://127.0.0.1:8000/v1/budgets?format=svg' -d @request.json
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from xml.sax.saxutils import escape

from .bands import class_label
from .components import Component
from .result import Budget, DeviceBudget, ErrorBand
from .svg import MUTED, document, human_bytes, num, text, text_width, ticks
from .units import GiB, MiB

__all__ = [
    "BAND_REACH",
    "BAR_WIDTH",
    "BAR_X",
    "COLOURS",
    "MIN_SEGMENT",
    "render_budget_svg",
]

WIDTH = 1000
LABEL_RIGHT = 186
"""Where the device labels end (right-aligned before the bars)."""
BAR_X = 196
"""Where every bar starts (0 bytes)."""
BAR_WIDTH = 580
"""The length of the scale's end (``end`` bytes)."""
VERDICT_X = BAR_X + BAR_WIDTH + 16
BAR_H = 26
ROW_H = 58
"""A device's row: the bar, its band's whisker, the space to the next bar."""
MIN_SEGMENT = 2.0
"""The narrowest a non-zero segment is drawn (px), so that it stays visible."""
BAND_REACH = 3, 2
"""The scale ends at most at 3/2 of the larger of the capacity and the totals."""
KEY_COLUMNS = 3
KEY_COLUMN_W = 310
KEY_ROW_H = 17
LABEL_LEFT = 16
"""Where the left column starts: a longer label is shortened with an ellipsis to fit."""
_WRAP_GLYPH = 0.5
"""The average glyph advance (ems) long text lines are wrapped at: a line of mixed text runs
0.45 .. 0.5 em a character in DejaVu Sans and Helvetica."""
_KINDS = {
    "llm_serving": "LLM serving",
    "image_generation": "image generation",
    "speech_to_text": "speech to text",
}
_ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "llama_cpp": "llama.cpp", "ollama": "Ollama"}

COLOURS: dict[Component, str] = {
    Component.WEIGHTS: "#4e79a7",
    Component.QUANTIZATION_METADATA: "#a0cbe8",
    Component.ADAPTERS: "#9c755f",
    Component.KV_CACHE: "#f28e2b",
    Component.ACTIVATIONS: "#59a14f",
    Component.LOGITS: "#8cd17d",
    Component.GRADIENTS: "#e15759",
    Component.OPTIMIZER_STATE: "#b07aa1",
    Component.MASTER_WEIGHTS: "#ff9da7",
    Component.CUDA_CONTEXT: "#79706e",
    Component.RUNTIME_WORKSPACE: "#edc948",
    Component.COMMUNICATION_BUFFERS: "#76b7b2",
    Component.ALLOCATOR_OVERHEAD: "#d4a6c8",
    Component.HEADROOM: "url(#headroom-hatch)",
}
"""One colour per component (Tableau 10 and its lighter companions); headroom is hatched."""

_FITS = "#2e7d32"
_SHORT = "#c62828"
_IF_LOW = "#a15c00"
"""Amber: the estimate fits but the error band's high end does not."""
_CAPACITY = "#333333"
_BAND = "#1a1a1a"
_GRID = "#e3e3e3"
_DEFS = (
    "<defs>"
    '<pattern id="headroom-hatch" patternUnits="userSpaceOnUse" width="6" height="6" '
    'patternTransform="rotate(45)">'
    '<rect x="0" y="0" width="6" height="6" fill="#f2f2f2"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#9a9a9a" stroke-width="2"/>'
    "</pattern>"
    "</defs>"
)


@dataclass(frozen=True, slots=True)
class _Segment:
    component: Component
    bytes: int
    x: float
    width: float


@dataclass(frozen=True, slots=True)
class _Scale:
    end: int
    """The bytes at the end of the bar area."""

    def x(self, b: int) -> float:
        return BAR_X + b * BAR_WIDTH / self.end


def _capacity(budget: Budget) -> int | None:
    """The device's memory less what other processes hold (the fit's capacity)."""
    return budget.device.capacity_bytes if budget.device is not None else None


def _scale_end(budget: Budget) -> int:
    """The bytes at the end of the bar area (see the module's docstring)."""
    capacity = _capacity(budget) or 0
    base = max([capacity, *(d.total_bytes for d in budget.devices)])
    highs = [d.band.high_bytes for d in budget.devices if d.band is not None]
    reach = base * BAND_REACH[0] // BAND_REACH[1]
    return max(1, base, min(max(highs, default=0), reach))


def _segments(device: DeviceBudget, end: int) -> list[_Segment]:
    """The device's non-zero components as segments, widened to :data:`MIN_SEGMENT` where
    needed at the expense of its widest segment."""
    lines = [ln for ln in device.lines if ln.bytes > 0]
    widths = [ln.bytes * BAR_WIDTH / end for ln in lines]
    extra = sum(MIN_SEGMENT - w for w in widths if w < MIN_SEGMENT)
    if extra and lines:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        widths = [max(w, MIN_SEGMENT) for w in widths]
        widths[widest] -= extra
    segments = []
    x = float(BAR_X)
    for ln, w in zip(lines, widths, strict=True):
        segments.append(_Segment(ln.component, ln.bytes, x, w))
        x += w
    return segments


def _words(name: str) -> str:
    """A phase or label as words: ``optimizer step`` for ``optimizer_step``."""
    return name.replace("_", " ")


def _label(device: DeviceBudget) -> str:
    words = _words(device.label)
    return words[:1].upper() + words[1:]


def _total_words(device: DeviceBudget) -> str:
    """``26.84 GiB at prefill`` under a device's label (``at its peak`` where the phase is too
    long for the column: the key below names it)."""
    words = f"{human_bytes(device.total_bytes)} at {_words(device.peak_phase)}"
    if text_width(words, 11) <= LABEL_RIGHT - LABEL_LEFT:
        return words
    return f"{human_bytes(device.total_bytes)} at its peak"


def _wrap(body: str, size: int) -> list[str]:
    """``body`` in lines that fit the picture's width at ``size`` px."""
    return textwrap.wrap(body, int((WIDTH - 40) / (size * _WRAP_GLYPH)))


def _fit(body: str, size: int, width: float) -> str:
    """``body``, shortened with an ellipsis until it is about ``width`` px wide at ``size``."""
    if text_width(body, size) <= width:
        return body
    while body and text_width(body + "…", size) > width:
        body = body[:-1]
    return body.rstrip() + "…"


def _models(budget: Budget) -> str:
    names: list[str] = []
    for w in budget.workloads:
        if w.name not in names:
            names.append(w.name)
    return " + ".join(names)


def default_title(budget: Budget) -> str:
    """``Memory budget: llama-3.1-8b on NVIDIA L4 24GB`` (the models, and the device or that
    none was given)."""
    device = budget.device.name if budget.device is not None else "no device given"
    joiner = " on " if budget.device is not None else ", "
    return f"Memory budget: {_models(budget)}{joiner}{device}"


def _subtitle(budget: Budget) -> list[str]:
    """The workloads (named when there are several), their formats and layouts, the engine,
    the method and the unit, wrapped into lines."""
    parts = []
    for w in budget.workloads:
        words = [_KINDS.get(w.kind, _words(w.kind))]
        if w.format is not None:
            quant = w.format.quantization
            words.append(
                f"{w.format.weights} weights" + (f" ({quant.split(',')[0]})" if quant else "")
            )
        if w.devices_per_instance > 1:
            words.append(f"{w.devices_per_instance} devices per instance")
        if w.instances > 1:
            words.append(f"{w.instances} instances")
        name = f"{w.name}: " if len(budget.workloads) > 1 else ""
        parts.append(name + ", ".join(words))
    if budget.serving is not None:
        sv = budget.serving
        parts.append(f"{_ENGINES.get(sv.engine, sv.engine)} {sv.engine_version}")
    unit = "GiB (2^30 bytes)" if _scale_unit(_scale_end(budget))[1] == "GiB" else "MiB (2^20 bytes)"
    line = (
        f"{'; '.join(parts)}. {budget.method.capitalize()} estimate at each device's peak; "
        f"one scale, {unit}"
    )
    if len(budget.workloads) == 1:  # it starts with the kind, not a model's name
        line = line[:1].upper() + line[1:]
    return _wrap(line, 12)


def _scale_unit(end: int) -> tuple[int, str]:
    return (GiB, "GiB") if end >= 2 * GiB else (MiB, "MiB")


def _share(part: int, whole: int) -> str:
    if whole <= 0:
        return ""
    p = 100 * part / whole
    return f"{p:.1f}%" if p >= 0.05 else "<0.1%"


def _band_words(band: ErrorBand, subtotal: int) -> str:
    floor = (
        " (its low end raised to the model's own tensors, which the device must hold)"
        if band.counted_bytes and band.low_bytes == band.counted_bytes
        else ""
    )
    return (
        f"Error band: the real peak lay within {human_bytes(band.low_bytes)} to "
        f"{human_bytes(band.high_bytes)} for {band.coverage * 100:.0f}% of "
        f"{band.measurements} published measurements of {class_label(band.workload_class)}, "
        f"around the {human_bytes(subtotal)} estimated before headroom{floor}"
    )


def _verdict(budget: Budget, device: DeviceBudget) -> tuple[str, str, str]:
    """(the right column's first line, its second, its colour): the device's free or missing
    bytes, and a serving engine that would refuse to start whatever they are."""
    capacity = _capacity(budget)
    if capacity is None:
        return "no device given", human_bytes(device.total_bytes), MUTED
    # The answer's own verdict (``Budget.fit``, counted as /v1/fits counts it) where it has
    # this device; capacity - total otherwise.
    own = (
        next((d for d in budget.fit.devices if d.label == device.label), None)
        if budget.fit
        else None
    )
    free = own.free_bytes if own is not None else capacity - device.total_bytes
    fits = own.fits if own is not None else free >= 0
    amount = f"{human_bytes(free)} free" if free >= 0 else f"{human_bytes(-free)} missing"
    if budget.serving is not None and not budget.serving.would_start:
        return "would not start", amount, _SHORT
    if fits and own is not None and own.verdict == "fits_if_low":  # the band's high end does not
        return "fits only if low", amount, _IF_LOW
    return ("fits", amount, _FITS) if fits else ("does not fit", amount, _SHORT)


def _headroom(device: DeviceBudget) -> int:
    return next((ln.bytes for ln in device.lines if ln.component is Component.HEADROOM), 0)


def render_budget_svg(budget: Budget, *, title: str | None = None) -> str:
    """The budget as an SVG document (text; the same budget gives the same text)."""
    heading = default_title(budget) if title is None else title
    capacity = _capacity(budget)
    end = _scale_end(budget)
    x_of = _Scale(end).x

    subtitle = _subtitle(budget)
    body: list[str] = [text(20, 30, heading, size=18, weight="bold", cls="title")]
    body.extend(
        text(20, 52 + 15 * k, line, size=12, fill=MUTED, cls="subtitle")
        for k, line in enumerate(subtitle)
    )
    top = 92.0 + 15 * (len(subtitle) - 1)
    plot_top = top - 8
    axis_y = top + ROW_H * len(budget.devices) - 12
    unit, unit_name = _scale_unit(end)
    # The grid and the axis first, so that the bars are drawn over them.
    for t in ticks(end / unit):
        tx = BAR_X + t * unit * BAR_WIDTH / end
        if tx > BAR_X + BAR_WIDTH + 0.5:
            break
        body.append(
            f'<line class="grid" x1="{num(tx)}" y1="{num(plot_top)}" x2="{num(tx)}" '
            f'y2="{num(axis_y)}" stroke="{_GRID}" stroke-width="1"/>'
        )
        body.append(
            text(tx, axis_y + 15, f"{t:g}", size=11, fill=MUTED, anchor="middle", cls="tick")
        )
    body.append(
        f'<line class="axis" x1="{BAR_X}" y1="{num(axis_y)}" x2="{BAR_X + BAR_WIDTH}" '
        f'y2="{num(axis_y)}" stroke="#999999" stroke-width="1"/>'
    )
    body.append(
        text(BAR_X + BAR_WIDTH + 8, axis_y + 15, unit_name, size=11, fill=MUTED, cls="unit")
    )

    desc: list[str] = []
    zero = [c for c in Component if all(_line_bytes(d, c) == 0 for d in budget.devices)]
    for i, device in enumerate(budget.devices):
        y = top + i * ROW_H
        label = _label(device)
        count = f" \u00d7 {device.num_devices}" if device.num_devices > 1 else ""
        body.append(
            text(
                LABEL_RIGHT,
                y + 11,
                _fit(label, 13, LABEL_RIGHT - LABEL_LEFT - text_width(count, 13)) + count,
                size=13,
                weight="bold",
                anchor="end",
                cls="device",
            )
        )
        body.append(
            text(
                LABEL_RIGHT,
                y + 26,
                _total_words(device),
                size=11,
                fill=MUTED,
                anchor="end",
                cls="device-total",
            )
        )
        for seg in _segments(device, end):
            tip = (
                f"{label}: {seg.component.label}, {human_bytes(seg.bytes)} "
                f"({seg.bytes:,} bytes, {_share(seg.bytes, device.total_bytes)})"
            )
            body.append(
                f'<rect class="segment" id="seg-{i}-{seg.component.value}" '
                f'x="{num(seg.x)}" y="{num(y)}" width="{num(seg.width)}" height="{BAR_H}" '
                f'fill="{COLOURS[seg.component]}"><title>{escape(tip)}</title></rect>'
            )
        total_x = x_of(device.total_bytes)
        if capacity is not None and capacity >= device.total_bytes:
            cap_x = x_of(capacity)
            body.append(
                f'<rect class="free" id="free-{i}" x="{num(total_x)}" y="{num(y)}" '
                f'width="{num(cap_x - total_x)}" height="{BAR_H}" fill="#eef7ee" '
                f'stroke="{_FITS}" stroke-width="1" stroke-dasharray="3 2"/>'
            )
            words = f"free {human_bytes(capacity - device.total_bytes)}"
            if cap_x - total_x >= text_width(words, 11) + 8:
                body.append(
                    text(
                        (total_x + cap_x) / 2,
                        y + BAR_H / 2 + 4,
                        words,
                        size=11,
                        fill=_FITS,
                        anchor="middle",
                        cls="free-label",
                    )
                )
        elif capacity is not None:
            cap_x = x_of(capacity)
            body.append(
                f'<rect class="missing" id="missing-{i}" x="{num(cap_x)}" y="{num(y - 1)}" '
                f'width="{num(total_x - cap_x)}" height="{BAR_H + 2}" fill="none" '
                f'stroke="{_SHORT}" stroke-width="2"/>'
            )
        first, second, colour = _verdict(budget, device)
        body.append(
            text(VERDICT_X, y + 11, first, size=13, weight="bold", fill=colour, cls="verdict")
        )
        body.append(text(VERDICT_X, y + 26, second, size=11, fill=colour, cls="verdict-bytes"))
        if device.band is not None:
            body.extend(_whisker(i, device.band, device, y + BAR_H + 9, _Scale(end)))
        desc.append(_device_desc(label, budget, device))

    if capacity is not None:
        cap_x = x_of(capacity)
        body.append(
            f'<line class="capacity" x1="{num(cap_x)}" y1="{num(plot_top)}" x2="{num(cap_x)}" '
            f'y2="{num(axis_y)}" stroke="{_CAPACITY}" stroke-width="1.5" '
            'stroke-dasharray="6 3"/>'
        )
        words = f"capacity {human_bytes(capacity)}"
        anchor = "end" if cap_x + text_width(words, 11) / 2 > WIDTH - 4 else "middle"
        body.append(
            text(
                cap_x,
                plot_top - 5,
                words,
                size=11,
                fill=_CAPACITY,
                anchor=anchor,
                cls="capacity-label",
            )
        )

    y = axis_y + 40
    for i, device in enumerate(budget.devices):
        body.append(
            text(
                20,
                y,
                _fit(
                    f"{_label(device)}{_most_loaded(budget, i)}: "
                    f"{human_bytes(device.total_bytes)} at its peak ({_words(device.peak_phase)})"
                    + (
                        f" on each of {device.num_devices} devices"
                        if device.num_devices > 1
                        else ""
                    ),
                    12,
                    WIDTH - 40,
                ),
                size=12,
                weight="bold",
                cls="key-heading",
            )
        )
        y += 8
        nonzero = [ln for ln in device.lines if ln.bytes > 0]
        for k, ln in enumerate(nonzero):
            col, row = k % KEY_COLUMNS, k // KEY_COLUMNS
            kx = 20 + col * KEY_COLUMN_W
            ky = y + row * KEY_ROW_H
            body.append(
                f'<rect class="key" id="key-{i}-{ln.component.value}" x="{kx}" '
                f'y="{num(ky + 4)}" width="11" height="11" fill="{COLOURS[ln.component]}" '
                'stroke="#555555" stroke-width="0.5"/>'
            )
            body.append(
                text(
                    kx + 16,
                    ky + 14,
                    f"{ln.component.label} {human_bytes(ln.bytes)} "
                    f"({_share(ln.bytes, device.total_bytes)})",
                    size=12,
                    cls="key-label",
                )
            )
        y += ((len(nonzero) + KEY_COLUMNS - 1) // KEY_COLUMNS) * KEY_ROW_H + 6
        if device.band is not None:
            band = _band_words(device.band, device.total_bytes - _headroom(device))
            for line in _wrap(band, 11):
                y += 14
                body.append(text(20, y, line, size=11, fill=MUTED, cls="band-label"))
        y += 22
    notes = []
    if zero:
        notes.append("0 bytes in this budget: " + ", ".join(c.label for c in zero))
    if any(d.band is None for d in budget.devices):
        notes.append("No error band: none is calibrated for this answer")
    sv = budget.serving
    if sv is not None and not sv.would_start and sv.reason:
        engine = _ENGINES.get(sv.engine, sv.engine)
        notes.append(f"{engine} would not start: {sv.reason}")
    for line in (ln for note in notes for ln in _wrap(note, 11)):
        body.append(text(20, y, line, size=11, fill=MUTED, cls="footnote"))
        y += 15
    height = int(y + 4)
    summary = f"{heading}. One stacked bar per device, one scale. " + " ".join(desc)
    return document(WIDTH, height, heading, summary, body, defs=_DEFS)


def _most_loaded(budget: Budget, i: int) -> str:
    return " (most loaded)" if i == budget.most_loaded and len(budget.devices) > 1 else ""


def _line_bytes(device: DeviceBudget, component: Component) -> int:
    return next((ln.bytes for ln in device.lines if ln.component is component), 0)


def _whisker(i: int, band: ErrorBand, device: DeviceBudget, wy: float, scale: _Scale) -> list[str]:
    """The band's whisker: a line from its low to its high end (an arrow where the scale
    clips it), end caps, and a dot where the subtotal ends."""
    x_of, end = scale.x, scale.end
    lo = x_of(band.low_bytes)
    clipped = band.high_bytes > end
    hi = x_of(min(band.high_bytes, end))
    sub = x_of(device.total_bytes - _headroom(device))
    out = [
        f'<line class="band" id="band-{i}" x1="{num(lo)}" y1="{num(wy)}" x2="{num(hi)}" '
        f'y2="{num(wy)}" stroke="{_BAND}" stroke-width="1.5"/>',
        f'<line class="band-cap" x1="{num(lo)}" y1="{num(wy - 4)}" x2="{num(lo)}" '
        f'y2="{num(wy + 4)}" stroke="{_BAND}" stroke-width="1.5"/>',
    ]
    if clipped:
        out.append(
            f'<polygon class="band-clipped" points="{num(hi)},{num(wy)} {num(hi - 7)},'
            f'{num(wy - 4)} {num(hi - 7)},{num(wy + 4)}" fill="{_BAND}"/>'
        )
    else:
        out.append(
            f'<line class="band-cap" x1="{num(hi)}" y1="{num(wy - 4)}" x2="{num(hi)}" '
            f'y2="{num(wy + 4)}" stroke="{_BAND}" stroke-width="1.5"/>'
        )
    out.append(
        f'<circle class="subtotal" cx="{num(sub)}" cy="{num(wy)}" r="3" fill="#ffffff" '
        f'stroke="{_BAND}" stroke-width="1.5"/>'
    )
    return out


def _device_desc(label: str, budget: Budget, device: DeviceBudget) -> str:
    parts = ", ".join(
        f"{ln.component.label} {human_bytes(ln.bytes)}" for ln in device.lines if ln.bytes > 0
    )
    capacity = _capacity(budget)
    first, second, _ = _verdict(budget, device)
    verdict = f" of {human_bytes(capacity)}: {first}, {second}" if capacity is not None else ""
    band = ""
    if device.band is not None:
        band = (
            f"; error band {human_bytes(device.band.low_bytes)} to "
            f"{human_bytes(device.band.high_bytes)}"
        )
    return f"{label}: {parts}; total {human_bytes(device.total_bytes)}{verdict}{band}."
