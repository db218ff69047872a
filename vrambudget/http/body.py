"""Strict decoding of a JSON request body into the core's msgspec types.

Before msgspec sees a body: nesting deeper than :data:`MAX_DEPTH` is a 400 (a recursion limit
is never reached, in the decoder or after it), and an object with a duplicate key is a 400
naming the key (JSON leaves duplicates undefined; last-wins would run ``"method": "analytic"``
for ``"method": "trace", "method": "analytic"``)."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any, TypeVar

import msgspec
from litestar.exceptions import ClientException, ValidationException

__all__ = ["MAX_DEPTH", "decode_body"]

T = TypeVar("T")

MAX_DEPTH = 64
"""Most nested arrays / objects a body may hold (real configs nest fewer than 10)."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _depth(body: bytes) -> int:
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKET)
    return max(accumulate(_STEP[c] for c in brackets), default=0)


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen.add(key)


def _check_structure(body: bytes) -> None:
    if _depth(body) > MAX_DEPTH:
        raise ClientException(
            detail=f"JSON nested deeper than {MAX_DEPTH} arrays / objects, the most accepted"
        )
    try:
        json.loads(body, object_pairs_hook=_no_duplicates)
    except _Duplicate as dup:
        raise ClientException(
            detail=f"JSON object has the key {dup.key!r} more than once (duplicate keys are "
            f"refused, not last-wins)"
        ) from None
    except (ValueError, RecursionError):
        # Malformed for Python: say so with msgspec's words, before a typed decode could stop
        # at the first unknown field (``{"a":}`` is malformed, not "unknown field a").
        try:
            msgspec.json.decode(body)
        except msgspec.DecodeError as exc:
            raise ClientException(detail=_malformed(exc)) from None


def decode_body(body: bytes, type_: type[T]) -> T:
    """Strict msgspec decoding of a request body: exactly what the published schema says (no
    coercion of 0 to false or "1" to 1, unlike Litestar's lenient signature model)."""
    _check_structure(body)
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        if "got `float`" in str(exc):
            # JSON Schema counts 2.0 as an integer; msgspec does not. Retry with integral
            # floats made ints (only on this error path, so valid requests pay nothing).
            try:
                return msgspec.convert(_integral(msgspec.json.decode(body)), type_)
            except msgspec.ValidationError as again:
                exc = again
        raise ValidationException(detail="invalid request", extra=[{"message": str(exc)}]) from None
    except msgspec.DecodeError as exc:
        raise ClientException(detail=_malformed(exc)) from None


def _malformed(exc: msgspec.DecodeError) -> str:
    message = str(exc)  # msgspec's own text starts "JSON is malformed: " for most errors
    return message if message.startswith("JSON is malformed") else f"JSON is malformed: {message}"


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value
