"""What the hub layer hands back: a checkpoint's config and every stored tensor, with where they
came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from vrambudget.core.checkpoint import Checkpoint

__all__ = ["Origin", "ResolvedCheckpoint"]

Origin = Literal["hub", "local"]


@dataclass(frozen=True, slots=True)
class ResolvedCheckpoint:
    """A checkpoint's ``config.json`` and safetensors headers, read without its tensor data.

    A diffusers pipeline (a repository with ``model_index.json`` and no top-level
    ``config.json``) comes back with ``config`` = ``model_index.json`` and ``checkpoint=None``:
    its components' weights live in subfolders (``unet/``, ``text_encoder/`` ...) and are not
    read yet; ``files`` lists them. ``config`` may be shared between callers (``HubCache``):
    treat it as read-only.
    """

    origin: Origin
    repo_id: str | None
    """The Hub repository id; ``None`` for a local directory."""
    revision: str | None
    """The revision asked for (a branch, tag or commit id; ``None``: the default branch)."""
    commit: str | None
    """The commit the Hub resolved the revision to (``None`` for a local directory). Every
    file was read at this commit, so a branch that moves during a fetch is never mixed."""
    config: dict[str, Any]
    checkpoint: Checkpoint | None
    """Every stored tensor from the safetensors headers; ``None`` when there are none."""
    files: tuple[tuple[str, int], ...]
    """(path in the repository, bytes) of the weight files: the safetensors files read when
    there is a checkpoint, otherwise every weight file (``.bin``, ``.gguf``, ``.safetensors``
    in subfolders ...) whose size is known."""
