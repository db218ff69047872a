"""Limits and the base of every wire type: generous enough for any real workload, small enough
that an absurd request is refused with the range instead of computed for minutes."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = [
    "MAX_TOKENS",
    "Batch",
    "Bytes",
    "Degree",
    "Dim",
    "Fraction",
    "Name",
    "Tokens",
    "TokensOrZero",
    "Wire",
]

MAX_TOKENS = 1 << 40
Tokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS, description="Tokens (1 .. 2^40).")]
TokensOrZero = Annotated[int, Meta(ge=0, le=MAX_TOKENS, description="Tokens (0 .. 2^40).")]
Batch = Annotated[int, Meta(ge=1, le=1 << 24, description="A batch or request count (1 .. 2^24).")]
Degree = Annotated[int, Meta(ge=1, le=1 << 16, description="A parallel degree (1 .. 65536).")]
Bytes = Annotated[int, Meta(ge=0, le=1 << 62, description="Bytes (0 .. 2^62).")]
Fraction = Annotated[float, Meta(ge=0.0, le=0.9, description="A fraction (0 .. 0.9).")]
Name = Annotated[str, Meta(min_length=1, max_length=128)]
Dim = Annotated[int, Meta(ge=1, le=1 << 24, description="A model dimension (1 .. 2^24).")]


class Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every request object forbids unknown fields (a misspelt ``batch_szie`` must not be
    silently ignored by a tool whose answer decides a purchase)."""
