"""The embeddable fit table (docs/EMBED.md): the ``<vrambudget-fits>`` custom element's module
and the page ``/ui/fits`` that uses it. Static files of the package (``service/static/``), read
once and served as they are, each with a strong ``ETag`` (``If-None-Match`` answers 304) and
``Cache-Control: no-cache`` (a cache keeps them but revalidates, so a new release is seen at
once). They are a page and its scripts, not the API: the OpenAPI document leaves them out."""

from __future__ import annotations

import hashlib
from importlib.resources import files
from typing import Any, NamedTuple

from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler

__all__ = ["ASSETS", "Asset", "ui_routes"]


class Asset(NamedTuple):
    body: bytes
    media_type: str
    etag: str
    """A strong validator: the quoted SHA-256 of the body (hex, first 32 digits)."""


def _asset(name: str, media_type: str) -> Asset:
    body = (files(__package__) / "static" / name).read_bytes()
    return Asset(body, media_type, f'"{hashlib.sha256(body).hexdigest()[:32]}"')


_JS = "text/javascript"  # RFC 9239 (Litestar adds "; charset=utf-8" to text types)

#: Path -> the file served there.
ASSETS: dict[str, Asset] = {
    "/ui/fits": _asset("fits.html", "text/html"),
    "/ui/fits-page.js": _asset("fits-page.js", _JS),
    "/ui/vrambudget-fits.js": _asset("vrambudget-fits.js", _JS),
}


def _matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 13.1.2: ``If-None-Match`` uses the weak comparison (``W/`` is ignored); ``*``
    matches any current representation."""
    if if_none_match is None:
        return False
    tags = [t.strip() for t in if_none_match.split(",")]
    return any(t == "*" or t.removeprefix("W/") == etag for t in tags)


def _serve(path: str) -> HTTPRouteHandler:
    asset = ASSETS[path]

    @get(path, include_in_schema=False, name=f"ui:{path}", sync_to_thread=False)
    def handler(request: Request[Any, Any, Any]) -> Response[bytes]:
        headers = {
            "ETag": asset.etag,
            "Cache-Control": "no-cache",
            # A catalog page on any origin may load the element's module (module scripts are
            # fetched with CORS); whether it may then call the API is the service's CORS setting.
            "Access-Control-Allow-Origin": "*",
        }
        if _matches(request.headers.get("if-none-match"), asset.etag):
            return Response(content=b"", status_code=304, headers=headers)
        return Response(content=asset.body, media_type=asset.media_type, headers=headers)

    return handler


def ui_routes() -> list[HTTPRouteHandler]:
    """The route handlers of the page and its scripts, for the app's ``route_handlers``."""
    return [_serve(path) for path in ASSETS]
