"""Cross-origin calls from browsers (the Fetch standard's CORS protocol) for both apps.

A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered
before routing: 204 with ``Access-Control-Allow-Origin``, ``-Allow-Methods``,
``-Allow-Headers`` and ``-Max-Age`` when the origin, the method and every requested header are
allowed, else 403 problem+json naming what is not and what is. Every other answer to an allowed
``Origin`` carries ``Access-Control-Allow-Origin`` and ``Access-Control-Expose-Headers``; one to
another origin carries neither (the browser then withholds it from the page). Credentials
(cookies, HTTP authentication) are never allowed: neither app uses cookies, and with ``*``
browsers send none.

Why not Litestar's ``CORSConfig``: its wrapper replaces the answer's ``Vary`` with ``Origin``
(losing ``Accept-Encoding``), leaves ``Vary: Origin`` off answers to refused origins (so a cache
can hand a refused origin's answer to an allowed one), answers a refused preflight with
``text/plain``, and treats every ``OPTIONS`` with an ``Origin`` as a preflight. Without any CORS
handling Litestar answers a preflight 204 with ``Allow`` only, which is why browsers refused
every cross-origin call with a JSON body before.

The wrapper goes around the whole app (:func:`with_cors`), outside routing, so that a 404 or
405 reaches the page too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Litestar
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from .origins import parse_origins
from .problems import PROBLEM_MEDIA_TYPE, Problem
from .representation import merge_vary

__all__ = [
    "MAX_AGE_S",
    "Cors",
    "CorsPolicy",
    "parse_origins",
    "with_cors",
]

MAX_AGE_S = 7200
"""How long a browser may reuse a preflight: two hours, the most Chromium (76 and later)
honours; Firefox caps at 24 hours (MDN, "Access-Control-Max-Age":
https://developer.mozilla.org/docs/Web/HTTP/Headers/Access-Control-Max-Age). The allowed
methods and headers change only with a deployment."""

CORS_TYPE = "https://vrambudget.dev/problems/cors"


def _pattern(origins: Iterable[str]) -> re.Pattern[str]:
    alternatives = []
    for origin in origins:
        scheme, rest = origin.split("://", 1)
        if rest.startswith("*."):
            label = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
            alternatives.append(
                re.escape(scheme + "://") + rf"(?:{label}\.)+" + re.escape(rest[2:])
            )
        else:
            alternatives.append(re.escape(origin))
    return re.compile("|".join(alternatives) or r"(?!)")


@dataclass(frozen=True, slots=True)
class CorsPolicy:
    """Who may call an app from a page, with what."""

    origins: tuple[str, ...]
    """``("*",)`` or origins (:func:`parse_origins`)."""
    methods: tuple[str, ...]
    """Methods a page may use beyond the preflight's ``OPTIONS``."""
    request_headers: tuple[str, ...]
    """Request headers (lower case) a page may send, beyond those every browser may."""
    expose_headers: tuple[str, ...]
    """Answer headers a page may read beyond the CORS-safelisted ones (Cache-Control,
    Content-Language, Content-Length, Content-Type, Expires, Last-Modified, Pragma)."""
    setting: str
    """The setting that lists the origins (named in a refusal)."""
    max_age_s: int = MAX_AGE_S
    _match: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_match", _pattern(o for o in self.origins if o != "*"))

    @property
    def any_origin(self) -> bool:
        return self.origins == ("*",)

    def allows(self, origin: str) -> bool:
        return self.any_origin or self._match.fullmatch(origin) is not None

    def allow_origin(self, origin: str) -> str:
        """The ``Access-Control-Allow-Origin`` value for an allowed origin."""
        return "*" if self.any_origin else origin


def with_cors(app: Litestar, policy: CorsPolicy | None) -> Litestar:
    """``app`` with its whole ASGI handler (routing included) wrapped in :class:`Cors`; ``None``:
    unchanged (CORS off: browsers refuse cross-origin calls that need a preflight)."""
    if policy is not None:
        # The attribute Litestar's own cors_config wraps the same way (Litestar.__init__).
        app.asgi_handler = Cors(app.asgi_handler, policy)
    return app


class Cors:
    """The ASGI wrapper enforcing a :class:`CorsPolicy` (module docstring)."""

    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        headers = {bytes(k).lower(): bytes(v).decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get(b"origin")
        method = headers.get(b"access-control-request-method")
        if scope["method"] == "OPTIONS" and origin is not None and method is not None:
            await self._preflight(
                scope, send, origin, method, headers.get(b"access-control-request-headers", "")
            )
            return
        if origin is None and self.policy.any_origin:
            await self.app(scope, receive, send)  # nothing to add: not a page's call, no Vary
            return
        await self.app(scope, receive, self._wrap(send, origin))

    def _wrap(self, send: Send, origin: str | None) -> Send:
        policy = self.policy
        allowed = origin is not None and policy.allows(origin)

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra: list[tuple[bytes, bytes]] = []
                if allowed and origin is not None:
                    extra.append(
                        (b"access-control-allow-origin", policy.allow_origin(origin).encode())
                    )
                    if policy.expose_headers:
                        extra.append(
                            (
                                b"access-control-expose-headers",
                                ", ".join(policy.expose_headers).encode(),
                            )
                        )
                headers = _without(message.get("headers", ()), {n for n, _ in extra})
                if not policy.any_origin:
                    headers = _with_vary_origin(headers)
                message["headers"] = headers + extra
            await send(message)

        return wrapped

    async def _preflight(
        self, scope: Scope, send: Send, origin: str, method: str, requested: str
    ) -> None:
        policy = self.policy
        names = [h.strip().lower() for h in requested.split(",") if h.strip()]
        refused: str | None = None
        if not policy.allows(origin):
            refused = (
                f"origin {origin!r} may not call this service from a page; allowed: "
                f"{', '.join(policy.origins) or 'none'} (the setting {policy.setting})"
            )
        elif method.upper() not in policy.methods:
            refused = (
                f"method {method!r} is not allowed cross-origin; allowed: "
                f"{', '.join(policy.methods)}"
            )
        else:
            unknown = [n for n in names if n not in policy.request_headers]
            if unknown:
                refused = (
                    f"request header(s) {', '.join(unknown)} not allowed cross-origin; allowed: "
                    f"{', '.join(policy.request_headers)}"
                )
        headers: list[tuple[bytes, bytes]] = []
        if not policy.any_origin:
            headers.append((b"vary", b"Origin"))
        if refused is not None:
            body = msgspec.json.encode(
                Problem(
                    type=CORS_TYPE,
                    title="Forbidden",
                    status=403,
                    detail=refused,
                    instance=scope.get("path", ""),
                )
            )
            headers += [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ]
            await _send(send, 403, headers, body)
            return
        headers += [
            (b"access-control-allow-origin", policy.allow_origin(origin).encode()),
            (b"access-control-allow-methods", ", ".join(policy.methods).encode()),
            (b"access-control-allow-headers", ", ".join(policy.request_headers).encode()),
            (b"access-control-max-age", str(policy.max_age_s).encode()),
        ]
        await _send(send, 204, headers, b"")


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _without(headers: Any, names: set[bytes]) -> list[tuple[bytes, bytes]]:
    return [(bytes(k), bytes(v)) for k, v in headers if bytes(k).lower() not in names]


def _with_vary_origin(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    current = [v.decode("latin-1") for k, v in headers if k.lower() == b"vary"]
    merged = merge_vary(", ".join(current) or None, ["Origin"])
    return [(k, v) for k, v in headers if k.lower() != b"vary"] + [(b"vary", merged.encode())]
