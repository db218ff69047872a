"""Where a model's real checkpoint is on this host, if it is: a directory of the host owner's
model directories named like its repository, or a complete snapshot in the Hugging Face cache.
Nothing is downloaded (a checkpoint can be hundreds of gigabytes; the host owner fills the cache
or the directories). Used by the probe agent's children to run the real weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrambudget.core.catalog import preset
from vrambudget.core.spec import HubModel, PresetModel

__all__ = ["Found", "Missing", "find_checkpoint", "repository_of"]


@dataclass(frozen=True, slots=True)
class Found:
    path: Path
    revision: str | None
    """The Hub commit of a cached snapshot (None for a model directory)."""
    where: str
    """In words: "model directory /models" or "Hugging Face cache"."""


@dataclass(frozen=True, slots=True)
class Missing:
    reason: str


def repository_of(model: Any) -> tuple[str, str | None] | None:
    """(repository id, revision) of a model that names one: a `hub` model, a preset (its source
    repository). None for a model given by its config or dimensions."""
    if isinstance(model, HubModel):
        return model.id, model.revision
    if isinstance(model, PresetModel):
        return preset(model.id).hf_repo, None
    return None


def _complete(path: Path) -> str | None:
    """None when ``path`` holds a config.json and every safetensors file its index names (or a
    single ``model.safetensors``); else what is missing."""
    if not (path / "config.json").is_file():
        return f"{path} has no config.json"
    from vrambudget.hub import HubError, read_local

    try:
        found = read_local(path)
    except HubError as exc:
        return exc.message
    if found.checkpoint is None or not found.checkpoint.tensors:
        return f"{path} has no safetensors weights"
    return None


def find_checkpoint(model: Any, model_dirs: tuple[str, ...]) -> Found | Missing:
    """The model's checkpoint on this host: ``<dir>/<owner>/<name>`` or ``<dir>/<name>`` in a
    model directory, else the cached snapshot of its revision (``main`` by default) in the
    Hugging Face cache (``HF_HUB_CACHE`` / ``HF_HOME``); each must be complete (config.json and
    every safetensors shard)."""
    repo = repository_of(model)
    if repo is None:
        return Missing("the model is given by its config or dimensions: no repository to load")
    repo_id, revision = repo
    owner, _, name = repo_id.partition("/")
    incomplete: list[str] = []
    for d in model_dirs:
        for candidate in (Path(d) / owner / name, Path(d) / name):
            if candidate.is_dir():
                why = _complete(candidate)
                if why is None:
                    return Found(candidate, None, f"model directory {d}")
                incomplete.append(why)
    cached = _hub_cache(repo_id, revision)
    if isinstance(cached, Found):
        return cached
    if cached is not None:
        incomplete.append(cached)
    where = "the Hugging Face cache" + (f" or {', '.join(model_dirs)}" if model_dirs else "")
    detail = f" ({'; '.join(incomplete)})" if incomplete else ""
    return Missing(f"{repo_id} is not in {where}{detail}")


def _hub_cache(repo_id: str, revision: str | None) -> Found | str | None:
    """The cached snapshot (Found), what is wrong with it (str) or None when not cached."""
    from vrambudget.hub import cached_snapshot

    snapshot = cached_snapshot(repo_id, revision)
    if snapshot is None:
        return None
    why = _complete(snapshot)
    if why is not None:
        return why
    return Found(snapshot, snapshot.name, "Hugging Face cache")
