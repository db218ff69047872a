"""What the project's SVG pictures share (:mod:`~vrambudget.core.chart`, the comparison;
:mod:`~vrambudget.core.budget_chart`, the budget): stable number text, text elements, byte
sizes in words, scale ticks and the accessible document around a picture.

Hand-written SVG 1.1, standard library only: no scripts, no external fonts, stylesheets or
images, so a picture renders the same offline and in an ``<img>`` tag.
"""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

from .units import GiB, KiB, MiB

__all__ = [
    "FONT",
    "MUTED",
    "TEXT",
    "document",
    "human_bytes",
    "num",
    "percent",
    "text",
    "text_width",
    "ticks",
]

FONT = "sans-serif"
TEXT = "#222222"
MUTED = "#666666"

_AVERAGE_GLYPH = 0.56
"""Average advance of a sans-serif glyph in ems (DejaVu Sans / Helvetica digits and lower
case run 0.5 .. 0.63): used only to keep labels apart, never for a quantity."""


def num(x: float) -> str:
    """A coordinate with two decimals at most, without trailing zeros (stable text; never
    ``-0``)."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s == "-0" else s


def text_width(body: str, size: float) -> float:
    """About how wide ``body`` renders at ``size`` px (for placing labels, not measuring)."""
    return len(body) * size * _AVERAGE_GLYPH


def human_bytes(n: int) -> str:
    """Bytes in binary units for a reader: ``14.96 GiB``, ``928.0 MiB``, ``12.0 KiB``,
    ``512 B``. The unit is the largest that leaves at least 1, so a non-zero value never
    prints as 0 (and a negative one never as -0)."""
    sign = "-" if n < 0 else ""
    a = abs(n)
    if a >= GiB:
        return f"{sign}{a / GiB:.2f} GiB"
    if a >= MiB:
        return f"{sign}{a / MiB:.1f} MiB"
    if a >= KiB:
        return f"{sign}{a / KiB:.1f} KiB"
    return f"{sign}{a} B"


def percent(p: float) -> str:
    """A signed percent with one decimal (two when one would round a non-zero value to 0):
    ``+19.1%``, ``-0.04%``, ``0.0%``; never ``-0.0%``."""
    for digits in (1, 2):
        s = f"{p:+.{digits}f}"
        if float(s) != 0:
            return f"{s}%"
    return f"{0:.1f}%"


def ticks(top: float, *, most: int = 8) -> list[float]:
    """Axis ticks from 0 to at least ``top`` at a step of 1, 2 or 5 x 10^k, with at most
    ``most`` intervals: 0, 5, 10, 15, 20, 25 for 21.95."""
    if top <= 0:
        return [0.0]
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def text(
    x: float,
    y: float,
    body: str,
    *,
    size: int = 12,
    fill: str = TEXT,
    anchor: str = "start",
    weight: str | None = None,
    cls: str | None = None,
) -> str:
    """One ``<text>`` element (its body escaped)."""
    attrs = [f'x="{num(x)}"', f'y="{num(y)}"', f'font-size="{size}"', f'fill="{fill}"']
    if anchor != "start":
        attrs.append(f'text-anchor="{anchor}"')
    if weight:
        attrs.append(f'font-weight="{weight}"')
    if cls:
        attrs.append(f'class="{cls}"')
    return f"<text {' '.join(attrs)}>{escape(body)}</text>"


def document(
    width: int, height: int, title: str, desc: str, body: list[str], *, defs: str = ""
) -> str:
    """The SVG document: an image to assistive technology (``role="img"``), named by its
    ``<title>`` and described by its ``<desc>``, on a white background."""
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" font-family="{FONT}" '
        'role="img" aria-labelledby="svg-title svg-desc">'
    )
    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            head,
            f'<title id="svg-title">{escape(title)}</title>',
            f'<desc id="svg-desc">{escape(desc)}</desc>',
            *([defs] if defs else []),
            (
                f'<rect class="background" x="0" y="0" width="{width}" height="{height}" '
                'fill="#ffffff"/>'
            ),
            *body,
            "</svg>",
            "",
        ]
    )
