"""What an answer carries for caches and for the wire: ``ETag`` and ``Cache-Control`` on the
routes that declare how long their answers hold, ``If-None-Match`` answered with 304 (GET) or
412 (any other method, RFC 9110 13.1.2), ``Vary``, and gzip or brotli for large textual answers
(:mod:`~vrambudget.http.encoding`). Errors, those of routing (404, 405) included, are marked
``Cache-Control: no-store`` by :func:`no_store_errors`, an app's ``before_send`` hook.

A route opts in with ``opt=cacheable(...)``:

* :attr:`Freshness.FIXED` -- the answer is fixed for a deployment (the catalogs, the OpenAPI
  document): ``Cache-Control: public, max-age=<max_age_s>``;
* :attr:`Freshness.REQUEST` -- a pure function of the request (method, path, query, body):
  ``Cache-Control: max-age=<max_age_s>``. No HTTP cache reuses an answer to a POST for another
  request (RFC 9110 9.3.3, RFC 9111 2: the cache key is the method and URI, not the body); the
  directive tells a client's own cache how long the answer holds. A handler whose answer read
  something that can change (a Hub branch) sets its own ``Cache-Control`` (``no-cache``).

Either way the answer carries a strong ``ETag`` per coding (:mod:`~vrambudget.http.validators`),
its compressed forms are kept by that tag (a bounded LRU, :data:`PACKED_CACHE_BYTES`) and the
digest of a repeated answer by its bytes object (:class:`~vrambudget.http.validators.DigestMemo`),
so that a catalog page asking for the same answer again costs look-ups, not a hash and a
compression; and it carries
``Vary: Accept-Encoding`` (plus what the route names, e.g. ``Accept`` where the media type
follows ``Accept``). A 304 carries the ``ETag``, ``Cache-Control`` and ``Vary`` the 200 would
have (RFC 9110 15.4.5). The middleware wraps an app's other middleware: it sees the answer as
the handler and the request context wrote it, computes the tag over those bytes and compresses
last.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import msgspec
from litestar.concurrency import sync_to_thread
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, HTTPResponseStartEvent, Message, Receive, Scope, Send

from .cache import AnswerCache
from .encoding import (
    MIN_BYTES,
    THREAD_MIN_BYTES,
    Coding,
    compress,
    compressible,
    is_text,
    negotiate,
)
from .problems import PROBLEM_MEDIA_TYPE, Problem
from .validators import DigestMemo, entity_tag, none_match

__all__ = [
    "CACHE_OPT",
    "Freshness",
    "Representation",
    "cache_control",
    "cacheable",
    "merge_vary",
    "no_store_errors",
]

CACHE_OPT = "vrambudget_cache"
"""The key of a route handler's ``opt`` holding its (:class:`Freshness`, extra Vary names)."""

NOT_MODIFIED_TYPE = "https://vrambudget.dev/problems/not-modified"

PACKED_CACHE_BYTES = 16 << 20
"""Compressed forms of cacheable answers kept (at most 1,024): a whole-catalog fit is about 7 KiB
in br, so this holds a thousand of the answers a catalog page repeats, for 16 MiB per process."""

# What a 304 keeps of the 200 it stands for (RFC 9110 15.4.5), and the request id.
_KEPT_ON_304 = frozenset(
    {b"cache-control", b"content-location", b"date", b"etag", b"expires", b"vary", b"x-request-id"}
)
_CONDITIONAL_SAFE = frozenset({"GET", "HEAD"})


class Freshness(Enum):
    """How long a route's successful answers hold."""

    FIXED = "fixed"
    """Fixed for a deployment (its build and settings): catalogs, the OpenAPI document."""
    REQUEST = "request"
    """A pure function of the request: the same request gets the same bytes."""


def cacheable(freshness: Freshness, *vary: str) -> dict[str, Any]:
    """A route handler's ``opt``: its answers' freshness and the request headers (beyond
    ``Accept-Encoding``) that select their representation, e.g. ``"Accept"``."""
    return {CACHE_OPT: (freshness, vary)}


def cache_control(freshness: Freshness, max_age_s: int) -> str:
    """The ``Cache-Control`` of a route's successful answer (``no-cache``: store, but
    revalidate every time, when ``max_age_s`` is 0)."""
    if max_age_s <= 0:
        return "no-cache"
    if freshness is Freshness.FIXED:
        return f"public, max-age={max_age_s}"
    return f"max-age={max_age_s}"


class Representation(ASGIMiddleware):
    """Validators, freshness, Vary and compression of every HTTP answer (module docstring).
    ``fixed_prefixes``: paths whose routes the app does not declare itself (the OpenAPI
    document under ``/schema``) treated as :attr:`Freshness.FIXED`."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, max_age_s: int, fixed_prefixes: tuple[str, ...] = ()) -> None:
        self.max_age_s = max_age_s
        self.fixed_prefixes = fixed_prefixes
        self.packed = AnswerCache(1024, PACKED_CACHE_BYTES)
        self.digests = DigestMemo()
        """Digests of the answers the answer cache repeats (the same bytes object)."""
        """Compressed forms by (coding, digest of the answer); shared by the app's routes."""

    def _policy(self, scope: Scope) -> tuple[Freshness, tuple[str, ...]] | None:
        handler = scope.get("route_handler")
        declared = handler.opt.get(CACHE_OPT) if handler is not None else None
        if declared is not None:
            freshness, vary = declared
            return freshness, tuple(vary)
        path = scope.get("path", "")
        if any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.fixed_prefixes):
            return Freshness.FIXED, ()
        return None

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        accept_encoding: str | None = None
        if_none_match: str | None = None
        for key, value in scope["headers"]:
            name = bytes(key).lower()
            if name == b"accept-encoding":
                accept_encoding = bytes(value).decode("latin-1")
            elif name == b"if-none-match":
                if_none_match = bytes(value).decode("latin-1")
        method = str(scope.get("method", "GET"))
        policy = self._policy(scope)
        start: HTTPResponseStartEvent | None = None
        parts: list[bytes] = []

        async def send_wrapper(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                length = _content_length(message)
                if policy is None and (length is None or length < MIN_BYTES):
                    # a stream, or a small answer without freshness: nothing to tag, nothing
                    # worth compressing (the app's before_send hook marks an error no-store)
                    await send(message)
                    return
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            if not parts and message.get("more_body", False) and _content_length(start) is None:
                # a stream on a route with freshness (no route of these apps writes one)
                held, start = start, None
                await send(held)
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            held, start = start, None
            await self._answer(
                held,
                b"".join(parts),
                send,
                policy,
                method,
                accept_encoding,
                if_none_match,
                scope.get("path", ""),
            )

        await next_app(scope, receive, send_wrapper)

    async def _answer(
        self,
        start: HTTPResponseStartEvent,
        body: bytes,
        send: Send,
        policy: tuple[Freshness, tuple[str, ...]] | None,
        method: str,
        accept_encoding: str | None,
        if_none_match: str | None,
        path: str,
    ) -> None:
        status = start["status"]
        raw = list(start.get("headers", ()))
        seen = _read(raw)
        media = seen.get(b"content-type")
        encoded = b"content-encoding" in seen
        coding: Coding | None = None
        if not encoded and compressible(media, len(body)):
            coding = negotiate(accept_encoding)
        updates: dict[bytes, str] = {}
        names = list(policy[1]) if policy is not None and status == 200 else []
        if not encoded and media is not None and is_text(media):
            names.append("Accept-Encoding")
        if names:
            updates[b"vary"] = merge_vary(seen.get(b"vary"), names)
        key: tuple[str, bytes] | None = None
        if policy is not None and status == 200:
            body_digest = self.digests.of(body)
            tag = updates[b"etag"] = entity_tag(body_digest, coding)
            if b"cache-control" not in seen:
                updates[b"cache-control"] = cache_control(policy[0], self.max_age_s)
            if if_none_match is not None and none_match(if_none_match, tag):
                start["headers"] = _updated(raw, updates)
                await _precondition(start, send, method, tag, path)
                return
            if coding is not None:
                key = (coding, body_digest)
        if coding is not None:
            packed = self.packed.get(key) if key is not None else None
            if packed is None:
                if len(body) >= THREAD_MIN_BYTES:
                    packed = await sync_to_thread(compress, body, coding)
                else:
                    packed = compress(body, coding)
                if key is not None:
                    self.packed.put(key, packed)
            body = packed
            updates[b"content-encoding"] = coding
        updates[b"content-length"] = str(len(body))
        start["headers"] = _updated(raw, updates)
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def _precondition(
    start: HTTPResponseStartEvent, send: Send, method: str, tag: str, path: str
) -> None:
    """304 for GET (the headers a 304 keeps), 412 problem+json for any other method."""
    if method in _CONDITIONAL_SAFE:
        kept = [(k, v) for k, v in start["headers"] if bytes(k).lower() in _KEPT_ON_304]
        await send({"type": "http.response.start", "status": 304, "headers": kept})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    body = msgspec.json.encode(
        Problem(
            type=NOT_MODIFIED_TYPE,
            title="Precondition Failed",
            status=412,
            detail=f"the answer is unchanged: its ETag {tag} matches If-None-Match, so it is not "
            f"sent again (RFC 9110 13.1.2: a {method} whose If-None-Match matches answers 412; "
            "drop If-None-Match to receive the answer)",
            instance=path,
        )
    )
    headers = [
        (k, v)
        for k, v in start["headers"]
        if bytes(k).lower() in (b"etag", b"vary", b"x-request-id")
    ]
    headers += [
        (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": 412, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _content_length(start: Message) -> int | None:
    """The answer's Content-Length (every answer this service buffers has one), or ``None``."""
    headers: Any = start.get("headers", ())
    for key, value in headers:
        if bytes(key).lower() == b"content-length":
            try:
                return int(bytes(value))
            except ValueError:
                return None
    return None


async def no_store_errors(message: Message, scope: Scope) -> None:
    """``Cache-Control: no-store`` on every 4xx and 5xx that has none: an error is never reused
    (a 404 is otherwise heuristically cacheable, RFC 9111 4.2.2). A ``before_send`` hook, so it
    sees the answers of routing and of CORS too, which no route middleware wraps. A coroutine:
    Litestar runs a plain function hook in a worker thread, twice per request (measured: 40 %
    fewer ``/healthz`` a second under wrk)."""
    if message["type"] != "http.response.start" or message["status"] < 400:
        return
    headers = list(message.get("headers", ()))
    if b"cache-control" not in _read(headers):
        message["headers"] = [*headers, (b"cache-control", b"no-store")]


def merge_vary(current: str | None, names: list[str] | tuple[str, ...]) -> str:
    """``Vary`` with ``names`` added, each field name once (case-insensitive), order kept."""
    out: list[str] = [n.strip() for n in (current or "").split(",") if n.strip()]
    seen = {n.lower() for n in out}
    for name in names:
        if name.lower() not in seen:
            out.append(name)
            seen.add(name.lower())
    return ", ".join(out)


def _read(headers: Any) -> dict[bytes, str]:
    """The answer's headers by lower-case name (the first of each)."""
    out: dict[bytes, str] = {}
    for key, value in headers:
        out.setdefault(bytes(key).lower(), bytes(value).decode("latin-1"))
    return out


def _updated(headers: Any, updates: dict[bytes, str]) -> list[tuple[bytes, bytes]]:
    """``headers`` with each name of ``updates`` replaced by its one new value."""
    kept = [(bytes(k), bytes(v)) for k, v in headers if bytes(k).lower() not in updates]
    return kept + [(k, v.encode("latin-1")) for k, v in updates.items()]
