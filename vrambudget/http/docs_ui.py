"""The API's interactive documentation at ``/schema``, served entirely by the app itself.

Swagger UI's browser bundle is vendored in ``static/swagger-ui/`` (npm package
``swagger-ui-dist`` at the exact version of :data:`SWAGGER_UI_VERSION`, with its Apache-2.0
``LICENSE`` and ``NOTICE``; ``VENDORED.md`` there says how it was fetched and how to update it),
so the page works with no network: no CDN, no ``@latest``, no web fonts, no validator badge.
Both apps use :class:`SwaggerUI`: the page at ``/schema`` (and ``/schema/swagger``) loads its
script and stylesheet from ``/schema/swagger-ui/<version>/`` and the document from
``/schema/openapi.json``, all same-origin."""

from __future__ import annotations

import html
import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from litestar import Response, get
from litestar.exceptions import NotFoundException
from litestar.openapi.plugins import OpenAPIRenderPlugin
from litestar.params import FromPath

if TYPE_CHECKING:
    from litestar import Request
    from litestar.router import Router

__all__ = ["ASSETS", "SWAGGER_UI_VERSION", "SwaggerUI", "asset_base"]

ASSETS = Path(__file__).parent / "static" / "swagger-ui"
"""The vendored files of ``swagger-ui-dist``."""

SWAGGER_UI_VERSION: str = json.loads((ASSETS / "package.json").read_text(encoding="utf-8"))[
    "version"
]
"""The vendored release (its ``package.json``); part of every asset URL, so a new release is a
new URL and browsers may cache each one for good."""

_MEDIA_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
    "LICENSE": "text/plain; charset=utf-8",
    "NOTICE": "text/plain; charset=utf-8",
    "swagger-ui-bundle.js.LICENSE.txt": "text/plain; charset=utf-8",
}
"""The files served, and their types (nothing else under ``static/`` is reachable)."""

_IMMUTABLE = "public, max-age=31536000, immutable"  # the URL carries the version


@cache
def _asset(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


def asset_base(openapi_json_route: str) -> str:
    """``/schema/openapi.json`` -> ``/schema/swagger-ui/5.35.0``: where the page's assets are."""
    return f"{openapi_json_route.rsplit('/', 1)[0]}/swagger-ui/{SWAGGER_UI_VERSION}"


@get("/swagger-ui/{version:str}/{name:str}", include_in_schema=False, sync_to_thread=False)
def _serve_asset(version: FromPath[str], name: FromPath[str]) -> Response[bytes]:
    media_type = _MEDIA_TYPES.get(name)
    if version != SWAGGER_UI_VERSION or media_type is None:
        raise NotFoundException(
            detail=f"no such documentation asset: {version}/{name} (this server has Swagger UI "
            f"{SWAGGER_UI_VERSION}: {', '.join(sorted(_MEDIA_TYPES))})"
        )
    return Response(
        _asset(name),
        media_type=media_type,
        headers={"Cache-Control": _IMMUTABLE, "X-Content-Type-Options": "nosniff"},
    )


class SwaggerUI(OpenAPIRenderPlugin):
    """Swagger UI from the vendored assets (Litestar's own plugins load theirs from CDNs).

    The request examples of each operation (``requestBody.content.*.examples``) appear in its
    "Examples" menu, and "Try it out" sends the chosen one."""

    def __init__(self, *, path: str | list[str] | None = None) -> None:
        super().__init__(path=path or ["/", "/swagger"])

    def receive_router(self, router: Router) -> None:
        router.register(_serve_asset)

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        spec_url = self.get_openapi_json_route(request)
        base = asset_base(spec_url)
        title = html.escape(str(openapi_schema.get("info", {}).get("title", "API")))
        config = json.dumps(
            {
                "url": spec_url,
                "dom_id": "#swagger-ui",
                "deepLinking": True,
                "validatorUrl": None,  # the default posts the document to swagger.io
                "displayRequestDuration": True,
                "defaultModelsExpandDepth": 0,
                "layout": "BaseLayout",
            }
        )
        return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" type="image/png" href="{base}/favicon-32x32.png">
<link rel="stylesheet" href="{base}/swagger-ui.css">
<style>body {{ margin: 0 }}</style>
</head>
<body>
<noscript>This page is Swagger UI and needs JavaScript; the document itself is
<a href="{spec_url}">{spec_url}</a>.</noscript>
<div id="swagger-ui"></div>
<script src="{base}/swagger-ui-bundle.js"></script>
<script>
const config = {config};
config.presets = [SwaggerUIBundle.presets.apis];
window.ui = SwaggerUIBundle(config);
</script>
</body>
</html>
""".encode()
