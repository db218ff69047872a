"""Limits and the base of every wire type: generous enough for any real workload, small enough
that an absurd request is refused with the range instead of computed for minutes."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = [
    "MAX_DEVICES",
    "MAX_FIT_DEVICE_COUNT",
    "MAX_LAYERS",
    "MAX_SOLVED_DEVICE_COUNT",
    "MAX_STAGES",
    "MAX_TOKENS",
    "Batch",
    "Bytes",
    "Degree",
    "Dim",
    "Fraction",
    "Layers",
    "Name",
    "Stages",
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

# Limits of the dimensions that multiply the work of one request (see docs/API.md, "Limits"):
MAX_LAYERS = 1024
"""Layers of a model given by its dimensions or config (the largest published models have
~130; an analytic serving budget costs ~0.1 ms per layer and per evaluation, so 10^6 layers
took 32 s). ``vrambudget.core.hf_config.LayerCount`` repeats the number (import order)."""
MAX_STAGES = 256
"""Pipeline stages (the largest published runs use 16 .. 64): a training budget answers one
device line per stage, ~6 KB each, so 65,536 stages answered 411 MB after 44 s."""
MAX_DEVICES = 64
"""Entries of a fit's ``devices`` (the catalog has 31 GPUs): a fit checks every device at
every device count, so devices x device_counts is at most 64 x 16 = 1,024 layouts."""
MAX_FIT_DEVICE_COUNT = 1024
"""Entries of a fit's ``device_counts``: an inference layout of n devices has n / 8 pipeline
stages, and a serving fit evaluates every stage of every layer at every count."""
MAX_SOLVED_DEVICE_COUNT = 256
"""A fit's ``max_device_count``: solving ``device_count`` tries 1 .. 8 then every multiple of 8
up to it, each a full layout; 4,096 made one serving fit per GPU take 34 s (one at 256 counts
takes ~35 ms at 1,024 layers)."""
Layers = Annotated[
    int, Meta(ge=1, le=MAX_LAYERS, description="Layers (1 .. 1024; the largest models have ~130).")
]
Stages = Annotated[
    int,
    Meta(ge=1, le=MAX_STAGES, description="Pipeline stages (1 .. 256; each is a device line)."),
]


class Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every request object forbids unknown fields (a misspelt ``batch_szie`` must not be
    silently ignored by a tool whose answer decides a purchase)."""
