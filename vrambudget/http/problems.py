"""The one place where errors become RFC 9457 problem+json responses (both apps): request
validation, the core's domain errors, HTTP errors and anything unexpected. An app adds the
handlers of its own errors (the service's trace tier) with :func:`exception_handlers`."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from vrambudget.core.errors import (
    BudgetError,
    InvalidWorkload,
    UnknownGPU,
    UnknownModel,
)

from .logs import request_id

__all__ = [
    "PROBLEM_MEDIA_TYPE",
    "Problem",
    "ProblemError",
    "exception_handlers",
    "field_error",
    "internal",
    "problem",
]

PROBLEM_MEDIA_TYPE = "application/problem+json"

error_log = logging.getLogger("vrambudget.errors")


class ProblemError(msgspec.Struct, frozen=True, kw_only=True):
    field: str
    """JSON path of the offending field, e.g. ``$.workloads[0].batch_size``."""
    message: str


class Problem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: tuple[ProblemError, ...] = ()
    request_id: str | None = None
    """On a 5xx: the id its log line names (also the response's ``X-Request-ID``)."""


def problem(
    request: Request[Any, Any, Any],
    status: int,
    title: str,
    detail: str,
    errors: tuple[ProblemError, ...] = (),
    type_: str = "about:blank",
    headers: dict[str, str] | None = None,
    exc: BaseException | None = None,
) -> Response[Any]:
    """A problem+json response. A 5xx is logged (with ``exc``'s traceback when given) under
    the request id, which its body carries; a 4xx is the caller's error and is not logged."""
    rid = None
    if status >= 500:
        rid = request_id()
        error_log.error(
            "%s %s -> %s %s: %s [request_id=%s]",
            request.method,
            request.url.path,
            status,
            title,
            detail,
            rid,
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
            extra={
                "request_id": rid,
                "method": request.method,
                "path": request.url.path,
                "status": status,
            },
        )
    body = Problem(
        type=type_,
        title=title,
        status=status,
        detail=detail,
        instance=request.url.path,
        errors=errors,
        request_id=rid,
    )
    return Response(
        content=msgspec.json.encode(body),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


_PATH = re.compile(r" - at `(?P<path>[^`]+)`$")
_INNER = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _split(message: str) -> tuple[str, str]:
    """(JSON path, message) of a msgspec error; a struct's own check that names a path inside
    the struct (``- at `$.config.x``` before msgspec's ``- at `$.workloads[0].model```) gives
    the joined path."""
    match = _PATH.search(message)
    if not match:
        return "$", message
    path, text = match.group("path"), message[: match.start()]
    inner = _INNER.search(text)
    if inner:
        return path + inner.group("path"), text[: inner.start()]
    return path, text


_PATH_TOKEN = re.compile(r"\.(\w+)|\[(\d+)\]")


def _allowed(root: Any, path: str) -> str | None:
    """What the field at a JSON path accepts, read from the msgspec type (the same source the
    schema is generated from): the enum values, or the numeric / length range."""
    from msgspec import inspect as mi

    def strip(t: Any) -> list[Any]:
        if isinstance(t, mi.UnionType):
            return [x for u in t.types for x in strip(u)]
        if isinstance(t, mi.Metadata):
            return strip(t.type)
        return [t]

    def describe(types: list[Any]) -> str | None:
        for t in types:
            if isinstance(t, mi.LiteralType):
                return "allowed: " + ", ".join(repr(v) for v in t.values)
            if isinstance(t, mi.EnumType):
                return "allowed: " + ", ".join(repr(m.value) for m in t.cls)
        for t in types:
            if isinstance(t, mi.IntType | mi.FloatType):
                lo = t.ge if t.ge is not None else t.gt
                hi = t.le if t.le is not None else t.lt
                if lo is not None or hi is not None:
                    return (
                        f"allowed range: {lo if lo is not None else '-inf'} .. "
                        f"{hi if hi is not None else 'inf'}"
                    )
            if isinstance(t, mi.StrType | mi.VarTupleType | mi.ListType):
                lo, hi = t.min_length, t.max_length
                if lo is not None or hi is not None:
                    return f"allowed length: {lo or 0} .. {hi if hi is not None else 'any'}"
        return None

    def walk(types: list[Any], tokens: list[tuple[str, str]]) -> str | None:
        if not tokens:
            return describe(types)
        (name, index), rest = tokens[0], tokens[1:]
        nxt: list[Any] = []
        for t in types:
            if name and isinstance(t, mi.StructType):
                typed = getattr(t.cls, "__typed_dicts__", {}).get(name)
                if typed is not None:  # a JSON object checked against a struct of its own
                    nxt += strip(mi.type_info(typed))
                    continue
                nxt += [x for f in t.fields if f.encode_name == name for x in strip(f.type)]
            elif index and isinstance(t, mi.ListType | mi.VarTupleType):
                nxt += strip(t.item_type)
        return walk(nxt, rest) if nxt else None

    tokens = [(m.group(1) or "", m.group(2) or "") for m in _PATH_TOKEN.finditer(path[1:])]
    try:
        return walk(strip(mi.type_info(root)), tokens)
    except (AttributeError, TypeError):  # a hint only; never fail the error response itself
        return None


def _parameter_type(request: Request[Any, Any, Any], key: str) -> Any | None:
    """The type of the route handler's parameter ``key`` (a query, path or header parameter
    Litestar validated), to name what it allows."""
    try:
        field = request.route_handler.parsed_fn_signature.parameters.get(key)
    except AttributeError:
        return None
    return None if field is None else field.annotation


def field_error(
    message: str, root: Any | None = None, key: str | None = None, where: str | None = None
) -> ProblemError:
    """A msgspec validation message as one problem error: the field's JSON path (``key`` when
    the message names none) and the message, with the values or range the field allows when
    ``root`` (the body's type, or a parameter's type with ``where="$"``) states them. The CLI
    prints its errors with it too."""
    path, text = _split(message)
    if path == "$" and key:
        path = key
    text = text or message
    look = path if where is None else where
    if root is not None and text.startswith(("Invalid enum value", "Expected")):
        allowed = _allowed(root, look) or _allowed(root, look + "[0]")
        if allowed and allowed not in text:
            text += f"; {allowed}"
    return ProblemError(field=path, message=text)


def _validation(
    request: Request[Any, Any, Any], exc: ValidationException, request_types: Mapping[str, Any]
) -> Response[Any]:
    errors: list[ProblemError] = []
    extra = exc.extra if isinstance(exc.extra, list) else []
    for item in extra:
        if isinstance(item, dict):
            key = item.get("key")
            root = request_types.get(request.url.path)
            where = None
            parameter = _parameter_type(request, key) if "source" in item and key else None
            if parameter is not None:  # a query (or path, header) parameter, not the body
                root, where = parameter, "$"
            errors.append(
                field_error(str(item.get("message", "")), root, f"$.{key}" if key else None, where)
            )
    detail = "; ".join(f"{e.field}: {e.message}" for e in errors) or str(exc.detail)
    return problem(
        request,
        422,
        "Invalid request",
        detail,
        tuple(errors),
        "https://vrambudget.dev/problems/validation",
    )


def _budget_error(request: Request[Any, Any, Any], exc: BudgetError) -> Response[Any]:
    match exc:
        case InvalidWorkload():
            field = exc.field if exc.field.startswith("$") else f"$.{exc.field}"
            return problem(
                request,
                422,
                "Workload cannot be realised",
                f"{field}: {exc.message}",
                (ProblemError(field=field, message=exc.message),),
                "https://vrambudget.dev/problems/invalid-workload",
            )
        case UnknownModel() | UnknownGPU():
            return problem(request, 404, "Not found", str(exc))
    return problem(request, 422, "Invalid request", str(exc))


def _http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    # Keep the exception's headers (405 carries ``Allow``, RFC 9110 §15.5.6).
    return problem(
        request,
        exc.status_code,
        _title(exc.status_code),
        str(exc.detail),
        headers=dict(exc.headers or {}),
        exc=exc if exc.status_code >= 500 else None,
    )


def internal(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    return problem(
        request,
        HTTP_500_INTERNAL_SERVER_ERROR,
        "Internal error",
        "the server failed to compute this answer; the error has been logged with its request id",
        exc=exc,
    )


def _title(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _not_found(request: Request[Any, Any, Any], exc: NotFoundException) -> Response[Any]:
    return problem(request, 404, "Not found", str(exc.detail))


Handler = Callable[[Request[Any, Any, Any], Any], Response[Any]]


def exception_handlers(
    request_types: Mapping[str, Any] | None = None,
    extra: Mapping[type[Exception], Handler] | None = None,
) -> dict[Any, Handler]:
    """Litestar's ``exception_handlers`` for an app. ``request_types`` maps a path to the body
    type its handler decodes, so that a validation error can name the allowed values or range
    of the field; ``extra`` adds the app's own error types."""
    types = dict(request_types or {})

    def validation(request: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
        return _validation(request, exc, types)

    return {
        ValidationException: validation,
        BudgetError: _budget_error,
        **(extra or {}),
        NotFoundException: _not_found,
        HTTPException: _http,
        Exception: internal,
    }
