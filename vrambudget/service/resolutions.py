"""Resolved models across the process boundary: the (index, key, encoded ResolvedModel) triples
the service sends with a request, the digest of a request with them (the key of its cached
answer), and the worker side: decoded once per key per worker and put in place of the
workloads' models."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from vrambudget.core.memo import BoundedCache
from vrambudget.core.resolved import ResolvedModel

__all__ = ["Resolutions", "draft_index", "resolution_digest", "with_resolutions"]

Resolutions = tuple[tuple[int, str, bytes], ...]
"""What crosses to a worker with a request: (workload index, ResolvedModel key, the encoded
ResolvedModel) per resolved model, by index; ``-1 - i`` for the speculative drafter of workload
``i`` (``speculative.model`` of an ``llm_serving`` workload)."""


def draft_index(i: int) -> int:
    """The index a resolution of workload ``i``'s speculative drafter travels under."""
    return -1 - i


def resolution_digest(payload: bytes, resolutions: Resolutions = ()) -> bytes:
    """The sha256 of a canonical request and what its models resolved to (a moved Hub branch,
    another commit, is another answer): the key of its cached answer."""
    digest = hashlib.sha256(payload)
    for i, key, _ in resolutions:
        digest.update(f"\0{i}:{key}".encode())
    return digest.digest()


_DECODED: BoundedCache[str, ResolvedModel] = BoundedCache(64)
_DECODER = msgspec.json.Decoder(ResolvedModel)


def with_resolutions(workloads: tuple[Any, ...], resolutions: Resolutions) -> tuple[Any, ...]:
    if not resolutions:
        return workloads
    out = list(workloads)
    for i, key, encoded in resolutions:
        model = _DECODED.get_or(key, lambda e=encoded: _DECODER.decode(e))  # type: ignore[misc]
        if i < 0:  # a speculative drafter (draft_index)
            w = out[-1 - i]
            spec = msgspec.structs.replace(w.speculative, model=model)
            out[-1 - i] = msgspec.structs.replace(w, speculative=spec)
        else:
            out[i] = msgspec.structs.replace(out[i], model=model)
    return tuple(out)
