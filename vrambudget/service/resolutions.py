"""The worker side of resolved models: the (index, key, encoded ResolvedModel) triples the
service sends with a request, decoded once per key per worker and put in place of the
workloads' models."""

from __future__ import annotations

from typing import Any

import msgspec

from vrambudget.core.memo import BoundedCache
from vrambudget.core.resolved import ResolvedModel

__all__ = ["Resolutions", "with_resolutions"]

Resolutions = tuple[tuple[int, str, bytes], ...]
"""What crosses to a worker with a request: (workload index, ResolvedModel key, the encoded
ResolvedModel) per resolved model, by index."""

_DECODED: BoundedCache[str, ResolvedModel] = BoundedCache(64)
_DECODER = msgspec.json.Decoder(ResolvedModel)


def with_resolutions(workloads: tuple[Any, ...], resolutions: Resolutions) -> tuple[Any, ...]:
    if not resolutions:
        return workloads
    out = list(workloads)
    for i, key, encoded in resolutions:
        model = _DECODED.get_or(key, lambda e=encoded: _DECODER.decode(e))  # type: ignore[misc]
        out[i] = msgspec.structs.replace(out[i], model=model)
    return tuple(out)
