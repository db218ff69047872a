"""A checkpoint's config and safetensors headers from the Hugging Face Hub, through
huggingface_hub, pinned to one commit, never downloading tensor data.

The calls, in order (huggingface_hub 2.4.0; paths relative to the endpoint):

1. ``HfApi.model_info(repo_id, revision=..., files_metadata=True)``:
   ``GET /api/models/{repo_id}/revision/{revision}?blobs=True`` (``GET /api/models/{repo_id}``
   for the default branch). Gives the commit id (``sha``) and every file with its size
   (``siblings``). Every later request names that commit, so a branch that moves meanwhile is
   never mixed in.
2. ``config.json`` (or ``model_index.json`` for a diffusers pipeline, and
   ``model.safetensors.index.json`` for a sharded checkpoint) through huggingface_hub's disk
   cache: ``try_to_load_from_cache(..., revision=<commit>)`` (a file cached at that commit is
   read without a request), else ``get_hf_file_metadata`` (``HEAD
   /{repo_id}/resolve/{commit}/{file}``, with the timeout and no retry) then
   ``hf_hub_download(..., revision=<commit>, cache_dir=...)`` (``HEAD`` and ``GET`` of the
   same path).
3. ``HfApi.parse_safetensors_file_metadata(repo_id, shard, revision=<commit>)`` per shard, up
   to 8 at a time: ``GET /{repo_id}/resolve/{commit}/{shard}`` with ``Range: bytes=0-100000``,
   then ``Range: bytes=8-{N+7}`` when the header is longer -- the header only, never the data.
   This is the per-file step of ``HfApi.get_safetensors_metadata``, called directly because
   that helper probes files with ``HEAD`` requests it passes no timeout to and downloads the
   index into the default cache whatever ``cache_dir`` says; the file list of step 1 answers
   the probes.

Every call gets the token explicitly (``False`` when there is none) and ``timeout_s``;
``hf_hub_download`` cannot take it for everything: its body ``GET`` uses
``HF_HUB_DOWNLOAD_TIMEOUT`` (10 s unless set), and a ``HEAD`` that fails inside it is retried
with huggingface_hub's own 60 s timeout and backoff (``file_download.
_hf_hub_download_to_cache_dir``) -- which is why the ``HEAD`` of step 2 is made first, without
retry: only a Hub that fails between that ``HEAD`` and the download reaches the retry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Literal, TypeVar

from huggingface_hub import (
    HfApi,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    try_to_load_from_cache,
)
from huggingface_hub.hf_api import ModelInfo

from vrambudget.core.checkpoint import Checkpoint, StoredTensor
from vrambudget.hub.errors import HubError
from vrambudget.hub.headers import (
    MAX_JSON_BYTES,
    HeaderError,
    choose_layout,
    parse_index,
    parse_json_object,
    stored_tensors,
    weight_files,
)
from vrambudget.hub.names import check_repo_id, check_revision, is_commit_sha, shown
from vrambudget.hub.resolved import ResolvedCheckpoint
from vrambudget.hub.settings import HubSettings
from vrambudget.hub.translate import Where, translate

__all__ = ["MAX_PARALLEL_HEADERS", "fetch"]

MAX_PARALLEL_HEADERS = 8
"""Shard headers requested at once (DeepSeek-V3 has 163 shards)."""

_LIBRARY = "vrambudget"
_log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Malformed data inside a parsed answer (a header entry that is a list, an answer without an
# "id") surfaces from huggingface_hub as these, after its HTTP errors are sorted out.
_MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError)
_Malformed = Literal["invalid", "unreachable"] | None


def fetch(repo_id: str, revision: str | None, *, settings: HubSettings) -> ResolvedCheckpoint:
    """The config and every stored tensor of a Hub repository at ``revision`` (``None``: the
    default branch). Raises ``HubError``; the repository id and revision are checked before
    any request."""
    check_repo_id(repo_id)
    check_revision(revision)
    started = time.monotonic()
    where = Where(repo_id=repo_id, revision=revision, timeout_s=settings.timeout_s)
    api = HfApi(endpoint=settings.endpoint, token=settings.hf_token, library_name=_LIBRARY)

    info = _call(
        where,
        lambda: api.model_info(
            repo_id,
            revision=revision,
            files_metadata=True,
            timeout=settings.timeout_s,
            token=settings.hf_token,
        ),
        malformed="unreachable",
    )
    commit, sizes = _commit_and_files(info, where)

    if "config.json" in sizes:
        config_name = "config.json"
    elif "model_index.json" in sizes:
        config_name = "model_index.json"
    else:
        raise HubError(
            "not_found", "id", f"The {where.repo} has no config.json (nor model_index.json)."
        )
    config_where = replace(where, file=config_name)
    try:
        config = parse_json_object(_download(settings, where, commit, config_name, sizes))
    except HeaderError as exc:
        raise HubError("invalid", "id", f"File {config_where.thing} {exc}.") from None

    checkpoint: Checkpoint | None = None
    if config_name == "config.json":
        checkpoint = _checkpoint(api, settings, where, commit, sizes)
    files = checkpoint.files if checkpoint is not None else weight_files(sizes)
    _log.debug(
        "hub checkpoint %s@%s (commit %s): %d tensors in %d files, %.2f s",
        repo_id,
        revision or "default",
        commit,
        len(checkpoint.tensors) if checkpoint else 0,
        len(files),
        time.monotonic() - started,
    )
    return ResolvedCheckpoint(
        origin="hub",
        repo_id=repo_id,
        revision=revision,
        commit=commit,
        config=config,
        checkpoint=checkpoint,
        files=files,
    )


def _commit_and_files(info: ModelInfo, where: Where) -> tuple[str, dict[str, int | None]]:
    commit = info.sha
    if not isinstance(commit, str) or not is_commit_sha(commit):
        raise HubError(
            "unreachable",
            "id",
            f"The endpoint's answer for {where.repo} named no commit id; it does not answer "
            "like the Hub.",
        )
    if info.siblings is None:
        raise HubError(
            "unreachable",
            "id",
            f"The endpoint's answer for {where.repo} listed no files; it does not answer like "
            "the Hub.",
        )
    sizes: dict[str, int | None] = {}
    for sibling in info.siblings:
        size = sibling.size
        sizes[sibling.rfilename] = size if isinstance(size, int) and size >= 0 else None
    return commit, sizes


def _checkpoint(
    api: HfApi,
    settings: HubSettings,
    where: Where,
    commit: str,
    sizes: Mapping[str, int | None],
) -> Checkpoint | None:
    layout = choose_layout(sizes)
    if layout.empty:
        return None
    total_size: int | None = None
    shards = layout.shards
    if layout.index is not None:
        try:
            index = parse_index(_download(settings, where, commit, layout.index, sizes))
        except HeaderError as exc:
            raise HubError(
                "invalid", "id", f"File {replace(where, file=layout.index).thing} {exc}."
            ) from None
        missing = [s for s in index.shards if s not in sizes]
        if missing:
            raise HubError(
                "invalid",
                "id",
                f"File {replace(where, file=layout.index).thing} names shard "
                f"{shown(missing[0])}, which the repository does not hold.",
            )
        shards, total_size = index.shards, index.total_size

    def one(shard: str) -> tuple[StoredTensor, ...]:
        return _shard_tensors(api, settings, where, commit, shard, sizes.get(shard))

    with ThreadPoolExecutor(
        max_workers=min(MAX_PARALLEL_HEADERS, len(shards)), thread_name_prefix="hub-header"
    ) as pool:
        futures = [pool.submit(one, shard) for shard in shards]
        try:
            per_shard = [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    tensors: list[StoredTensor] = []
    seen: dict[str, str] = {}
    for shard, shard_tensors in zip(shards, per_shard, strict=True):
        for t in shard_tensors:
            other = seen.setdefault(t.name, shard)
            if other != shard:
                raise HubError(
                    "invalid",
                    "id",
                    f"Tensor {shown(t.name)} is stored twice in the {where.repo}: in "
                    f"{shown(other)} and {shown(shard)}.",
                )
        tensors.extend(shard_tensors)
    files = tuple((s, size) for s in shards if (size := sizes.get(s)) is not None)
    return Checkpoint(tensors=tuple(tensors), total_size=total_size, files=files)


def _shard_tensors(
    api: HfApi,
    settings: HubSettings,
    where: Where,
    commit: str,
    shard: str,
    size: int | None,
) -> tuple[StoredTensor, ...]:
    shard_where = replace(where, file=shard)
    meta = _call(
        shard_where,
        lambda: api.parse_safetensors_file_metadata(
            where.repo_id,
            shard,
            revision=commit,
            token=settings.hf_token,
            timeout=settings.timeout_s,
        ),
        malformed="invalid",
    )
    header = {
        name: {"dtype": t.dtype, "shape": t.shape, "data_offsets": t.data_offsets}
        for name, t in meta.tensors.items()
    }
    try:
        tensors = stored_tensors(header, None)
    except HeaderError as exc:
        raise HubError(
            "invalid", "id", f"The safetensors file {shard_where.thing} {exc}."
        ) from None
    if size is not None:
        # The header length is what the file holds besides its 8-byte prefix and its buffer
        # (the tensors tile the buffer from 0, as stored_tensors checked).
        data_end = sum(t.nbytes for t in tensors)
        header_len = size - 8 - data_end
        if header_len < 2:
            raise HubError(
                "invalid",
                "id",
                f"The safetensors file {shard_where.thing} is {size} bytes long, too short for "
                f"the {data_end} bytes of tensors its header lists.",
            )
        if header_len > settings.max_header_bytes:
            raise HubError(
                "invalid",
                "id",
                f"The safetensors file {shard_where.thing} has a {header_len}-byte header, over "
                f"the {settings.max_header_bytes}-byte limit.",
            )
    return tensors


def _download(
    settings: HubSettings,
    where: Where,
    commit: str,
    filename: str,
    sizes: Mapping[str, int | None],
) -> bytes:
    """A small JSON file of the repository at the pinned commit, through huggingface_hub's
    disk cache."""
    file_where = replace(where, file=filename)
    size = sizes.get(filename)
    if size is not None and size > MAX_JSON_BYTES:
        raise HubError(
            "invalid",
            "id",
            f"File {file_where.thing} is {size} bytes, over the {MAX_JSON_BYTES}-byte limit.",
        )
    cached = try_to_load_from_cache(
        where.repo_id, filename, cache_dir=settings.cache_dir, revision=commit
    )
    if isinstance(cached, str):
        path = cached
    else:
        # A HEAD with the timeout and no retry first: a HEAD that fails inside hf_hub_download
        # is retried with a 60 s timeout and backoff (up to minutes on a hanging Hub).
        url = hf_hub_url(where.repo_id, filename, revision=commit, endpoint=settings.endpoint)
        _call(
            file_where,
            lambda: get_hf_file_metadata(
                url, token=settings.hf_token, timeout=settings.timeout_s, library_name=_LIBRARY
            ),
            malformed=None,
        )
        path = _call(
            file_where,
            lambda: hf_hub_download(
                where.repo_id,
                filename,
                revision=commit,
                cache_dir=settings.cache_dir,
                etag_timeout=settings.timeout_s,
                token=settings.hf_token,
                endpoint=settings.endpoint,
                library_name=_LIBRARY,
            ),
            malformed=None,
        )
    with Path(path).open("rb") as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise HubError(
            "invalid", "id", f"File {file_where.thing} is over the {MAX_JSON_BYTES}-byte limit."
        )
    return data


def _call(where: Where, call: Callable[[], _T], *, malformed: _Malformed) -> _T:
    """``call()``, its huggingface_hub exceptions translated (``translate``); malformed answer
    data becomes ``malformed`` ("invalid": the repository's file; "unreachable": the
    endpoint's answer) when given."""
    with _translated(where, malformed):
        return call()


@contextmanager
def _translated(where: Where, malformed: _Malformed) -> Iterator[None]:
    try:
        yield
    except HubError:
        raise
    except Exception as exc:
        error = translate(exc, where)
        if error is None and malformed is not None and isinstance(exc, _MALFORMED):
            error = HubError(
                malformed,
                "id",
                f"The safetensors header of {where.thing} does not have the safetensors layout."
                if malformed == "invalid"
                else f"The endpoint's answer for {where.thing} was not understood; it does not "
                "answer like the Hub.",
            )
        if error is None:
            raise
        raise error from exc
