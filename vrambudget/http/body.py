"""Strict decoding of a JSON request body into the core's msgspec types."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from litestar.exceptions import ClientException, ValidationException

__all__ = ["decode_body"]

T = TypeVar("T")


def decode_body(body: bytes, type_: type[T]) -> T:
    """Strict msgspec decoding of a request body: exactly what the published schema says (no
    coercion of 0 to false or "1" to 1, unlike Litestar's lenient signature model)."""
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
        raise ClientException(detail=f"JSON is malformed: {exc}") from None


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value
