"""Request ids, access and error logs for both apps, and the checks every request passes before
its handler: the Content-Type of a body, and the flag on answers holding integers a JavaScript
client cannot read exactly.

* Every response carries ``X-Request-ID``: the caller's own when it is sane (1-128 characters of
  ``A-Z a-z 0-9 . _ : -``), a fresh one otherwise; a 5xx problem body carries it as
  ``request_id`` and its log line (with the traceback) names it.
* One access line per request on the ``vrambudget.access`` logger: method, path (never the query
  string), status, duration, request id. ``VRAMBUDGET_LOG_FORMAT=json`` makes every log line one
  JSON object (``text``, the default, is Litestar's line format). Both formats redact bearer
  tokens, ``Authorization`` / token / secret / password values and URL query strings.
* A body sent with a Content-Type other than JSON (``application/json`` or ``*/*+json``) is
  refused with 415 before any handler reads it, so a cross-origin "simple" POST (``text/plain``,
  form encodings) cannot reach one; a body without a Content-Type is read as JSON.
* An ``application/json`` answer holding an integer above 2^53 (where JavaScript's numbers stop
  being exact) carries ``X-Unsafe-Integers: <count>``; its body is unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import uuid
from contextvars import ContextVar
from typing import Any

import msgspec
from litestar.enums import ScopeType
from litestar.logging.config import LoggingConfig
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, HTTPResponseStartEvent, Message, Receive, Scope, Send

__all__ = [
    "LOG_FORMAT_ENV",
    "REQUEST_ID_HEADER",
    "UNSAFE_INTEGERS_HEADER",
    "JsonFormatter",
    "RequestContext",
    "TextFormatter",
    "logging_config",
    "redact",
    "request_id",
    "unsafe_integers",
]

LOG_FORMAT_ENV = "VRAMBUDGET_LOG_FORMAT"
REQUEST_ID_HEADER = "X-Request-ID"
UNSAFE_INTEGERS_HEADER = "X-Unsafe-Integers"
MAX_SAFE_INTEGER = 2**53

_request_id: ContextVar[str | None] = ContextVar("vrambudget_request_id", default=None)
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
access_log = logging.getLogger("vrambudget.access")


def request_id() -> str | None:
    """The id of the request being handled (``None`` outside one)."""
    return _request_id.get()


# ------------------------------------------------------------------------------ redaction --

_REDACTIONS = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 <redacted>"),
    (
        re.compile(
            r"(?i)([\"']?\b(?:authorization|x-api-key|api[_-]?key|[a-z_-]*token[s]?|"
            r"[a-z_-]*secret|password|signature)[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&}]+"
        ),
        r"\1<redacted>",
    ),
    (re.compile(r"((?:https?|wss?)://[^\s?#\"'<>]*)\?[^\s#\"'<>]*"), r"\1?<redacted>"),
)


def redact(text: str) -> str:
    """``text`` without bearer tokens, secret-looking values and URL query strings."""
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


class TextFormatter(logging.Formatter):
    """Litestar's line format, redacted."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s - %(asctime)s - %(name)s - %(module)s - %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the record's extra fields
    (``request_id``, ``status``, ...) and the traceback as ``exc``; every string redacted."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                entry[key] = value if isinstance(value, int | float | bool | None) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(
            {k: redact(v) if isinstance(v, str) else v for k, v in entry.items()},
            ensure_ascii=False,
        )


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes to whatever ``sys.stderr`` is when a line is emitted.
    Litestar's default handler binds the ``sys.stderr`` of the moment the app was created; a
    process that replaces it (a test runner capturing output, a daemon redirecting it) then
    logged into a closed file ("I/O operation on closed file")."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ and setStream assign it
        pass


def _handlers() -> dict[str, dict[str, Any]]:
    """Litestar's two handlers with the console one writing to the current ``sys.stderr``.
    Before Python 3.12 the queue handler formats and its listener's console handler prints the
    formatted line as it is; from 3.12 the queue handler passes records and the console
    handler formats them (Litestar's own arrangement, kept)."""
    console: dict[str, Any] = {"class": f"{__name__}.StderrHandler", "level": "DEBUG"}
    if sys.version_info >= (3, 12):
        console["formatter"] = "standard"
        return {"console": console}
    return {
        "console": console,
        "queue_listener": {
            "class": "litestar.logging.standard.QueueListenerHandler",
            "level": "DEBUG",
            "formatter": "standard",
            "handlers": ["cfg://handlers.console"],
        },
    }


def logging_config(log_format: str | None = None) -> LoggingConfig:
    """Litestar's logging for an app: ``text`` or ``json`` lines (``VRAMBUDGET_LOG_FORMAT``),
    the ``vrambudget`` loggers at INFO, httpx's per-request lines (full URLs) off. Litestar's
    own exception logging stays off: the problem handlers log every 5xx with its traceback and
    request id (:mod:`vrambudget.http.problems`), and a 4xx is the caller's, not a log line."""
    chosen = (log_format or os.environ.get(LOG_FORMAT_ENV) or "text").strip().lower()
    if chosen not in ("text", "json"):
        raise ValueError(f"{LOG_FORMAT_ENV} must be 'text' or 'json', not {chosen!r}")
    formatter = JsonFormatter if chosen == "json" else TextFormatter
    return LoggingConfig(
        formatters={"standard": {"()": f"{__name__}.{formatter.__name__}"}},
        handlers=_handlers(),
        loggers={
            "vrambudget": {"level": "INFO", "propagate": True},
            "httpx": {"level": "WARNING", "propagate": True},
        },
        log_exceptions="never",
    )


# ----------------------------------------------------------------------------- middleware --

_JSON_TYPE = re.compile(r"^application/(?:[a-z0-9.+-]+\+)?json$")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# An integer value (not inside a float, not a string's digits in practice): 16+ digits after
# a JSON value position, as msgspec writes them (no whitespace).
_LONG_INT = re.compile(rb"(?<=[:\[,])-?(\d{16,})(?=[,\]}])")


def unsafe_integers(body: bytes) -> int:
    """How many integers of a compact JSON document lie beyond +-2^53."""
    return sum(1 for m in _LONG_INT.finditer(body) if int(m.group(1)) > MAX_SAFE_INTEGER)


class RequestContext(ASGIMiddleware):
    """Request id, access line, Content-Type check and the unsafe-integer flag (see the module
    docstring). Listed first in an app's ``middleware`` so that it wraps every other one."""

    scopes = (ScopeType.HTTP,)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        rid = given if _SANE_ID.fullmatch(given) else uuid.uuid4().hex
        token = _request_id.set(rid)
        started = time.perf_counter()
        status = 500
        start: HTTPResponseStartEvent | None = None

        async def send_wrapper(message: Message) -> None:
            nonlocal status, start
            if message["type"] == "http.response.start":
                start = message
                status = start["status"]
                start["headers"] = [*start.get("headers", ()), (b"x-request-id", rid.encode())]
                return  # held until the body: the flag header goes with it
            if message["type"] == "http.response.body" and start is not None:
                held, start = start, None
                body = message.get("body", b"")
                if not message.get("more_body", False) and _is_json(held) and body:
                    count = unsafe_integers(body)
                    if count:
                        held["headers"] = [
                            *held["headers"],
                            (b"x-unsafe-integers", str(count).encode()),
                        ]
                await send(held)
            await send(message)

        try:
            method = scope.get("method", "GET")
            if method in _BODY_METHODS:
                media = headers.get(b"content-type", b"").decode("latin-1")
                media = media.split(";", 1)[0].strip().lower()
                if media and not _JSON_TYPE.match(media):
                    await _unsupported(scope, media, send_wrapper)
                    return
            await next_app(scope, receive, send_wrapper)
        finally:
            access_log.info(
                "%s %s %s %.1f ms",
                scope.get("method", "-"),
                scope.get("path", "-"),
                status,
                (time.perf_counter() - started) * 1e3,
                extra={
                    "request_id": rid,
                    "method": scope.get("method", "-"),
                    "path": scope.get("path", "-"),
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1e3, 3),
                },
            )
            _request_id.reset(token)


async def _unsupported(scope: Scope, media: str, send: Send) -> None:
    """415 as problem+json (the shape of :class:`vrambudget.http.problems.Problem`), sent
    before any handler or body read."""
    body = msgspec.json.encode(
        {
            "title": "Unsupported Media Type",
            "status": 415,
            "detail": f"the body must be application/json, not {media!r}",
            "instance": scope.get("path", ""),
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": 415,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _is_json(start: HTTPResponseStartEvent) -> bool:
    for key, value in start.get("headers", ()):
        if bytes(key).lower() == b"content-type":
            return bool(bytes(value).split(b";", 1)[0].strip().lower() == b"application/json")
    return False
