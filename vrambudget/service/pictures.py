"""Pictures as answers: ``POST /v1/budgets`` and ``POST /v1/comparisons`` answer SVG when asked
(``format=svg``, or ``Accept: image/svg+xml`` preferred to JSON), JSON otherwise.

The picture is drawn from the JSON answer (the same cached bytes), so the two never disagree;
drawing one takes about a millisecond (:mod:`vrambudget.core.budget_chart`,
:mod:`vrambudget.core.chart`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Request, Response
from litestar.params import QueryParameter

from vrambudget.core.budget_chart import render_budget_svg
from vrambudget.core.chart import render_comparison_svg
from vrambudget.core.comparison import Comparison
from vrambudget.core.result import Budget

__all__ = [
    "FORMAT_PARAMETER",
    "SVG",
    "PictureFormat",
    "budget_picture",
    "comparison_picture",
    "document_pictures",
    "wants_svg",
]

SVG = "image/svg+xml"
JSON = "application/json"

PictureFormat = Literal["json", "svg"]

FORMAT_PARAMETER = QueryParameter(
    description="`svg`: the answer drawn as an SVG picture (`image/svg+xml`, also chosen by "
    "`Accept: image/svg+xml` when it is preferred to JSON); `json`: the JSON answer whatever "
    "`Accept` says. Default: by `Accept`, else JSON."
)

_DESCRIPTIONS = {
    "/v1/budgets": "`format=svg` or `Accept: image/svg+xml`: one stacked bar per device, every "
    "component a segment, on one scale; the device's capacity, the free or missing bytes and "
    "the error band drawn on it (docs/PICTURES.md).",
    "/v1/comparisons": "`format=svg` or `Accept: image/svg+xml`: each measured quantity's "
    "estimates against the measurement, one scale per group (docs/PICTURES.md).",
}


def wants_svg(request: Request[Any, Any, Any], format: PictureFormat | None) -> bool:
    """``format`` when given, else whether ``Accept`` prefers SVG to JSON (JSON on a tie,
    with ``*/*``, or when it names neither)."""
    if format is not None:
        return format == "svg"
    return request.accept.best_match([JSON, SVG], default=JSON) == SVG


def budget_picture(answer: bytes) -> Response[Any]:
    """The picture of an encoded budget answer."""
    svg = render_budget_svg(msgspec.json.decode(answer, type=Budget))
    return Response(content=svg.encode(), media_type=SVG)


def comparison_picture(answer: bytes) -> Response[Any]:
    """The picture of an encoded comparison answer."""
    svg = render_comparison_svg(msgspec.json.decode(answer, type=Comparison))
    return Response(content=svg.encode(), media_type=SVG)


def document_pictures(document: dict[str, Any]) -> None:
    """Publish the SVG answer as a second content type of each picture route's 200."""
    for path, description in _DESCRIPTIONS.items():
        ok = document["paths"][path]["post"]["responses"]["200"]
        ok.setdefault("content", {})[SVG] = {
            "schema": {"type": "string", "description": description}
        }
