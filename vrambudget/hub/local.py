"""A checkpoint directory on disk (``save_pretrained`` output, a Hub snapshot in
huggingface_hub's cache): ``config.json`` and the safetensors headers, never the tensor data."""

from __future__ import annotations

import os
from pathlib import Path

from vrambudget.core.checkpoint import Checkpoint, StoredTensor
from vrambudget.hub.errors import HubError
from vrambudget.hub.headers import (
    MAX_JSON_BYTES,
    HeaderError,
    choose_layout,
    parse_index,
    parse_json_object,
    read_header,
    stored_tensors,
    weight_files,
)
from vrambudget.hub.resolved import ResolvedCheckpoint
from vrambudget.hub.settings import DEFAULT_MAX_HEADER_BYTES

__all__ = ["read_local"]


def read_local(
    path: str | os.PathLike[str], *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
) -> ResolvedCheckpoint:
    """The config and every stored tensor of a checkpoint directory.

    Reads ``config.json`` (or, for a diffusers pipeline, ``model_index.json``, with
    ``checkpoint=None``) and, of each safetensors file, the 8-byte header length ``N`` and the
    ``N`` header bytes -- refused when ``N`` is over ``max_header_bytes`` or past the end of the
    file. The files read are ``model.safetensors``, else the shards
    ``model.safetensors.index.json`` names, else every top-level ``*.safetensors`` file.
    Symbolic links are followed (a Hub snapshot links into its blob store). Raises
    ``HubError`` with field ``path``.
    """
    root = Path(path)
    if not root.is_dir():
        raise HubError("not_found", "path", f"{_show(root)} is not a directory.")
    names = _files(root)
    if "config.json" in names:
        config_name = "config.json"
    elif "model_index.json" in names:
        config_name = "model_index.json"
    else:
        raise HubError(
            "not_found", "path", f"{_show(root)} has no config.json (nor model_index.json)."
        )
    try:
        config = parse_json_object(_read_json_file(root, config_name))
    except HeaderError as exc:
        raise HubError("invalid", "path", f"{_show(root / config_name)} {exc}.") from None

    checkpoint = None
    if config_name == "config.json":
        checkpoint = _checkpoint(root, names, max_header_bytes)
    files = checkpoint.files if checkpoint is not None else weight_files(names)
    return ResolvedCheckpoint(
        origin="local",
        repo_id=None,
        revision=None,
        commit=None,
        config=config,
        checkpoint=checkpoint,
        files=files,
    )


def _checkpoint(
    root: Path, names: dict[str, int | None], max_header_bytes: int
) -> Checkpoint | None:
    layout = choose_layout(names)
    if layout.empty:
        return None
    shards, total_size = layout.shards, None
    if layout.index is not None:
        try:
            index = parse_index(_read_json_file(root, layout.index))
        except HeaderError as exc:
            raise HubError("invalid", "path", f"{_show(root / layout.index)} {exc}.") from None
        shards, total_size = index.shards, index.total_size
    tensors: list[StoredTensor] = []
    seen: dict[str, str] = {}
    files: list[tuple[str, int]] = []
    for shard in shards:
        file = root / shard
        try:
            header, n, size = read_header(file, max_header_bytes)
            shard_tensors = stored_tensors(header, size - 8 - n)
        except HeaderError as exc:
            raise HubError("invalid", "path", f"Safetensors file {_show(file)} {exc}.") from None
        except FileNotFoundError:
            raise HubError(
                "not_found",
                "path",
                f"{_show(root / layout.index) if layout.index else _show(file)} names "
                f"{shard!r}, which is not in the directory.",
            ) from None
        except OSError as exc:
            raise HubError(
                "invalid", "path", f"{_show(file)} could not be read ({exc.strerror})."
            ) from None
        for t in shard_tensors:
            other = seen.setdefault(t.name, shard)
            if other != shard:
                raise HubError(
                    "invalid",
                    "path",
                    f"Tensor {t.name!r} is stored twice in {_show(root)}: in {other!r} and "
                    f"{shard!r}.",
                )
        tensors.extend(shard_tensors)
        files.append((shard, size))
    return Checkpoint(tensors=tuple(tensors), total_size=total_size, files=tuple(files))


def _files(root: Path) -> dict[str, int | None]:
    """Every file under ``root`` ('/'-separated relative path -> bytes), hidden directories
    (``.git``, ``.cache``) skipped."""
    out: dict[str, int | None] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = Path(dirpath).relative_to(root)
        for name in filenames:
            key = (rel / name).as_posix()
            try:
                out[key] = (Path(dirpath) / name).stat().st_size
            except OSError:  # a dangling link
                out[key] = None
    return out


def _read_json_file(root: Path, name: str) -> bytes:
    file = root / name
    try:
        with file.open("rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise HubError(
            "invalid", "path", f"{_show(file)} could not be read ({exc.strerror})."
        ) from None
    if len(data) > MAX_JSON_BYTES:
        raise HubError("invalid", "path", f"{_show(file)} is over the {MAX_JSON_BYTES}-byte limit.")
    return data


def _show(path: Path) -> str:
    return repr(str(path))
