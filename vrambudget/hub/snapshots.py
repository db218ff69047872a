"""A repository's snapshot in the host's Hugging Face cache (``HF_HUB_CACHE`` / ``HF_HOME``), as
huggingface_hub lays it out; nothing is fetched."""

from __future__ import annotations

from pathlib import Path

__all__ = ["cached_snapshot"]


def cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The snapshot directory of ``revision`` (``main`` by default: the commit its ref names)
    holding a ``config.json``, or None when the cache has none."""
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return Path(hit).parent if isinstance(hit, str) else None
