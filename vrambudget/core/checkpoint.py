"""A checkpoint's stored tensors, as its safetensors headers list them (names, dtypes, shapes,
exact byte ranges), and their compact form: repeated layers and experts folded into patterns.

A safetensors file starts with an 8-byte little-endian header length and a JSON header that maps
every tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(https://github.com/huggingface/safetensors, "Format"); ``end - begin`` is the tensor's exact
stored size, whatever its packing (``F4`` holds two values per byte). Reading the header never
touches the data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = [
    "SAFETENSORS_DTYPE_BITS",
    "Checkpoint",
    "StoredGroup",
    "StoredTensor",
    "collapse",
    "layer_index",
]

SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
"""Bits per element of each dtype code a safetensors header may carry (the crate's ``Dtype``
enum; ``F4`` is float4 e2m1, two per byte; ``F8_E8M0`` the MX block scale)."""

_MAX_DIM = 1 << 40


class StoredTensor(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One tensor of a checkpoint as its file header describes it."""

    name: str
    dtype: str
    """The safetensors dtype code (``BF16``, ``F8_E4M3``, ``I32``, ``U8``, ``F4`` ...)."""
    shape: tuple[Annotated[int, Meta(ge=0, le=_MAX_DIM)], ...]
    nbytes: Annotated[int, Meta(ge=0)]
    """Stored bytes (``data_offsets`` end - begin)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """Every tensor a checkpoint stores (all shards), read from the headers only."""

    tensors: tuple[StoredTensor, ...]
    total_size: int | None = None
    """``metadata.total_size`` of ``model.safetensors.index.json`` when the checkpoint has one
    (bytes of all tensors; equals the sum of ``nbytes``)."""
    files: tuple[tuple[str, int], ...] = ()
    """(file name, bytes on disk) of each shard when known (header + data)."""

    @property
    def stored_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


class StoredGroup(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Stored tensors that differ only in their integer path components (the same tensor of
    every layer, of every expert): ``model.layers.{}.mlp.experts.{}.down_proj.weight``."""

    pattern: str
    """The name with each integer component replaced by ``{}``."""
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    """Bytes of one tensor."""
    layers: tuple[int, ...]
    """The first integer component of each name, sorted and unique (the layer index when the
    pattern is under a layer stack); empty for tensors outside any numbered list."""
    count: int
    """How many tensors the group holds (layers x experts ...)."""

    @property
    def total_bytes(self) -> int:
        return self.nbytes * self.count


_INT_COMPONENT = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)")


def layer_index(name: str) -> int | None:
    """The first integer path component of a tensor name (``model.layers.3.x`` -> 3)."""
    m = _INT_COMPONENT.search(name)
    return int(m.group()) if m else None


def collapse(tensors: Iterable[StoredTensor]) -> tuple[StoredGroup, ...]:
    """Fold tensors that differ only in integer path components into groups, in first-seen
    order. DeepSeek-V3's ~91,000 stored tensors fold into a few hundred groups."""
    groups: dict[tuple[str, str, tuple[int, ...], int], tuple[set[int], list[int]]] = {}
    for t in tensors:
        pattern = _INT_COMPONENT.sub("{}", t.name)
        key = (pattern, t.dtype, t.shape, t.nbytes)
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = (set(), [0])
        index = layer_index(t.name)
        if index is not None:
            entry[0].add(index)
        entry[1][0] += 1
    return tuple(
        StoredGroup(
            pattern=pattern,
            dtype=dtype,
            shape=shape,
            nbytes=nbytes,
            layers=tuple(sorted(layers)),
            count=count[0],
        )
        for (pattern, dtype, shape, nbytes), (layers, count) in groups.items()
    )
