"""Safetensors headers and indexes, as the format defines them, checked the way the safetensors
crate checks them before it maps a file.

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON mapping each tensor
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an optional
``__metadata__`` string map), then the byte buffer (https://github.com/huggingface/safetensors,
README "Format"). The crate accepts a header only if, sorted by offsets, every tensor begins
where the previous one ended, ``end - begin`` is exactly ``numel x bits / 8`` and the last end
is the end of the file: ``8 + N + end == file length`` (``safetensors/src/tensor.rs``:
``Metadata::validate``, ``SafeTensors::read_metadata``; errors ``InvalidOffset``,
``TensorInvalidInfo``, ``MetadataIncompleteBuffer``). A sharded checkpoint lists its shards in
``model.safetensors.index.json``: ``{"metadata": {"total_size": ...}, "weight_map": {tensor:
file}}`` (transformers ``modeling_utils``, ``SAFE_WEIGHTS_INDEX_NAME``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrambudget.core.checkpoint import SAFETENSORS_DTYPE_BITS, StoredTensor
from vrambudget.hub.names import check_repo_path

__all__ = [
    "INDEX_FILE",
    "MAX_DIM",
    "MAX_JSON_BYTES",
    "MAX_SHARDS",
    "SINGLE_FILE",
    "WEIGHT_SUFFIXES",
    "HeaderError",
    "Index",
    "SafetensorsLayout",
    "choose_layout",
    "parse_index",
    "parse_json_object",
    "read_header",
    "stored_tensors",
    "weight_files",
]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
"""transformers' ``SAFE_WEIGHTS_NAME`` and ``SAFE_WEIGHTS_INDEX_NAME``; huggingface_hub's
``constants.SAFETENSORS_SINGLE_FILE`` and ``SAFETENSORS_INDEX_FILE``."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
"""File endings counted as weight files in ``ResolvedCheckpoint.files`` when no safetensors
checkpoint is read (PyTorch pickles, GGUF, TensorFlow and Flax weights)."""

MAX_JSON_BYTES = 64 * 1024 * 1024
"""The largest ``config.json``, ``model_index.json`` or index file read. DeepSeek-V3's index,
91,000 entries, is about 9 MB."""

MAX_SHARDS = 10_000
"""The most shards an index may name."""

MAX_DIM = 1 << 40
"""The largest dimension accepted (``vrambudget.core.checkpoint.StoredTensor.shape``)."""


class HeaderError(ValueError):
    """A header, index or JSON file that breaks the format; the message completes the sentence
    "<file> ..." (e.g. "is not JSON")."""


def parse_json_object(data: bytes) -> dict[str, Any]:
    """``data`` as a JSON object, parsed like transformers parses ``config.json``
    (``json.loads``; ``NaN`` and ``Infinity`` are accepted, a repeated key keeps its last
    value)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError
        raise HeaderError("is not JSON") from None
    if not isinstance(value, dict):
        raise HeaderError(f"is JSON but not an object (a {_json_type(value)})")
    return value


@dataclass(frozen=True, slots=True)
class Index:
    """What ``model.safetensors.index.json`` says: its shards (sorted, unique) and
    ``metadata.total_size`` when it is a non-negative integer."""

    shards: tuple[str, ...]
    total_size: int | None


def parse_index(data: bytes) -> Index:
    """The shards and total size of an index file's bytes."""
    index = parse_json_object(data)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise HeaderError("has no 'weight_map' object naming the shards")
    shards: set[str] = set()
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors"):
            raise HeaderError(f"maps {_cut(name)} to something that is not a .safetensors file")
        why = check_repo_path(shard)
        if why is not None:
            raise HeaderError(f"names a shard that {why}: {_cut(shard)}")
        shards.add(shard)
    if len(shards) > MAX_SHARDS:
        raise HeaderError(f"names {len(shards)} shards, more than {MAX_SHARDS}")
    metadata = index.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    # Some indexes write the total as a float (``1.6e10``); an integral one is kept.
    if isinstance(total, float) and total.is_integer():
        total = int(total)
    total_size = total if isinstance(total, int) and not isinstance(total, bool) else None
    if total_size is not None and total_size < 0:
        total_size = None
    return Index(shards=tuple(sorted(shards)), total_size=total_size)


@dataclass(frozen=True, slots=True)
class SafetensorsLayout:
    """Which files hold a checkpoint's tensors: one file, an index to read, or every top-level
    ``*.safetensors`` file; empty when the repository or directory has none."""

    index: str | None
    shards: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return self.index is None and not self.shards


def choose_layout(names: Iterable[str]) -> SafetensorsLayout:
    """The files to read, from the repository's (or directory's) file names, in the order
    transformers looks for them: ``model.safetensors``, then the index
    (``modeling_utils._get_resolved_checkpoint_files``); a repository with neither but with
    other top-level ``*.safetensors`` files has those read, sorted. Subfolders are not
    looked into."""
    top = {n for n in names if "/" not in n}
    if SINGLE_FILE in top:
        return SafetensorsLayout(index=None, shards=(SINGLE_FILE,))
    if INDEX_FILE in top:
        return SafetensorsLayout(index=INDEX_FILE, shards=())
    return SafetensorsLayout(
        index=None, shards=tuple(sorted(n for n in top if n.endswith(".safetensors")))
    )


def weight_files(sizes: Mapping[str, int | None]) -> tuple[tuple[str, int], ...]:
    """(path, bytes) of every weight file (:data:`WEIGHT_SUFFIXES`) whose size is known,
    sorted by path."""
    return tuple(
        (name, size)
        for name, size in sorted(sizes.items())
        if size is not None and name.endswith(WEIGHT_SUFFIXES)
    )


def stored_tensors(header: object, data_len: int | None) -> tuple[StoredTensor, ...]:
    """The tensors of one parsed header, in storage order, checked as the crate checks them.

    ``data_len`` is the length of the byte buffer (file length - 8 - N) when known; the
    tensors must cover exactly that. ``__metadata__`` is skipped (it must be an object).
    Worked example: ``{"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}`` is
    one tensor of 6 elements x 16 bits = 12 bytes, ``nbytes = 12 - 0``.
    """
    if not isinstance(header, dict):
        raise HeaderError(f"has a header that is not a JSON object (a {_json_type(header)})")
    entries: list[tuple[int, int, StoredTensor]] = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise HeaderError("has a '__metadata__' entry that is not an object")
            continue
        entries.append(_entry(name, info))
    entries.sort(key=lambda e: (e[0], e[1]))
    end = 0
    for begin, stop, tensor in entries:
        if begin != end:
            raise HeaderError(
                f"has tensor {_cut(tensor.name)} at byte {begin} of the buffer where the "
                f"previous tensor ends at {end} (offsets overlap or leave a hole)"
            )
        end = stop
    if data_len is not None and end != data_len:
        raise HeaderError(
            f"has tensors covering {end} bytes but a buffer of {data_len} bytes after the header"
        )
    return tuple(t for _, _, t in entries)


def _entry(name: str, info: object) -> tuple[int, int, StoredTensor]:
    where = f"tensor {_cut(name)}"
    if not name:
        raise HeaderError("has a tensor with an empty name")
    if not isinstance(info, dict):
        raise HeaderError(f"has {where} described by a {_json_type(info)}, not an object")
    dtype = info.get("dtype")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
        raise HeaderError(f"has {where} of unknown dtype {_cut(str(dtype))}")
    shape = info.get("shape")
    if not isinstance(shape, (list, tuple)) or not all(_is_int(d) for d in shape):
        raise HeaderError(f"has {where} whose shape is not a list of integers")
    if any(d < 0 or d > MAX_DIM for d in shape):
        raise HeaderError(f"has {where} with a dimension outside [0, 2**40]")
    offsets = info.get("data_offsets")
    if (
        not isinstance(offsets, (list, tuple))
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
    ):
        raise HeaderError(f"has {where} whose data_offsets are not two integers")
    begin, end = int(offsets[0]), int(offsets[1])
    if not 0 <= begin <= end:
        raise HeaderError(f"has {where} with data_offsets [{begin}, {end}] out of order")
    numel = 1
    for d in shape:
        numel *= int(d)
    bits = numel * SAFETENSORS_DTYPE_BITS[dtype]
    if bits % 8 or end - begin != bits // 8:
        raise HeaderError(
            f"has {where} of {numel} x {dtype} stored in {end - begin} bytes "
            f"(expected {bits / 8:g})"
        )
    tensor = StoredTensor(
        name=name, dtype=dtype, shape=tuple(int(d) for d in shape), nbytes=end - begin
    )
    return begin, end, tensor


def read_header(path: Path, max_header_bytes: int) -> tuple[object, int, int]:
    """(parsed header, N, file length) of a local safetensors file, reading 8 + N bytes and
    never the tensor data. ``OSError`` propagates."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError(f"is {size} bytes long, shorter than the 8-byte header length")
        n = int.from_bytes(head, "little")
        if n > max_header_bytes:
            raise HeaderError(f"declares a {n}-byte header, over the {max_header_bytes}-byte limit")
        if 8 + n > size:
            raise HeaderError(f"declares a {n}-byte header but the file is {size} bytes long")
        raw = f.read(n)
    if len(raw) < n:
        raise HeaderError(f"ends inside its {n}-byte header")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise HeaderError("has a header that is not JSON") from None
    return header, n, size


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "value"


def _cut(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
