"""The embeddable fit table (docs/EMBED.md): the ``<vrambudget-fits>`` custom element's module
and the page ``/ui/fits`` that uses it. Static files of the package (``service/static/``), read
once and served as they are, with ``Cache-Control: no-cache`` (a cache keeps them but
revalidates, so a new release is seen at once); their strong ``ETag`` per content coding, the
304 of ``If-None-Match`` and gzip / brotli are the app's HTTP conventions
(:mod:`vrambudget.http.representation`, docs/HTTP.md). They are a page and its scripts, not the
API: the OpenAPI document leaves them out."""

from __future__ import annotations

from importlib.resources import files
from typing import NamedTuple

from litestar import Response, get
from litestar.handlers import HTTPRouteHandler

from vrambudget.http.representation import Freshness, cacheable

__all__ = ["ASSETS", "Asset", "ui_routes"]


class Asset(NamedTuple):
    body: bytes
    media_type: str


def _asset(name: str, media_type: str) -> Asset:
    return Asset((files(__package__) / "static" / name).read_bytes(), media_type)


_JS = "text/javascript"  # RFC 9239 (Litestar adds "; charset=utf-8" to text types)

#: Path -> the file served there.
ASSETS: dict[str, Asset] = {
    "/ui/fits": _asset("fits.html", "text/html"),
    "/ui/fits-page.js": _asset("fits-page.js", _JS),
    "/ui/vrambudget-fits.js": _asset("vrambudget-fits.js", _JS),
}


def _serve(path: str) -> HTTPRouteHandler:
    asset = ASSETS[path]

    @get(
        path,
        include_in_schema=False,
        name=f"ui:{path}",
        sync_to_thread=False,
        opt=cacheable(Freshness.FIXED),
    )
    def handler() -> Response[bytes]:
        headers = {
            "Cache-Control": "no-cache",
            # A catalog page on any origin may load the element's module (module scripts are
            # fetched with CORS); whether it may then call the API is the service's CORS setting.
            "Access-Control-Allow-Origin": "*",
        }
        return Response(content=asset.body, media_type=asset.media_type, headers=headers)

    return handler


def ui_routes() -> list[HTTPRouteHandler]:
    """The route handlers of the page and its scripts, for the app's ``route_handlers``."""
    return [_serve(path) for path in ASSETS]
