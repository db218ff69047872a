"""Checks on what a caller names before any request: a repository id by huggingface_hub's own
rules, a revision, a file path inside a repository."""

from __future__ import annotations

import re
from collections.abc import Callable

import huggingface_hub.utils as _hf_utils

from vrambudget.hub.errors import HubError

__all__ = [
    "MAX_REVISION_CHARS",
    "check_repo_id",
    "check_repo_path",
    "check_revision",
    "is_commit_sha",
    "shown",
]

MAX_REVISION_CHARS = 256

_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
"""A full commit id as huggingface_hub recognises one (``file_download.REGEX_COMMIT_HASH``)."""

# huggingface_hub.utils exports lazily (a module ``__getattr__``), which mypy cannot follow;
# ``validate_repo_id`` is public there (https://huggingface.co/docs/huggingface_hub/package_reference/utilities).
_validate_repo_id: Callable[[str], None] = _hf_utils.validate_repo_id  # type: ignore[attr-defined]


def shown(value: str, limit: int = 100) -> str:
    """A caller's string quoted for a message, cut to ``limit`` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def is_commit_sha(revision: str | None) -> bool:
    """Whether ``revision`` is a full 40-hex commit id (immutable), not a branch or tag."""
    return revision is not None and _COMMIT_SHA.fullmatch(revision) is not None


def check_repo_id(repo_id: object) -> str:
    """``repo_id`` if huggingface_hub's ``validate_repo_id`` accepts it: ``name`` or
    ``namespace/name``, letters, digits, ``-``, ``_``, ``.``, at most 96 characters each, no
    ``--`` or ``..``, not ending in ``.git`` (``huggingface_hub/utils/_validators.py``)."""
    if not isinstance(repo_id, str) or not repo_id:
        raise HubError("invalid", "id", "The repository id must be a non-empty string.")
    try:
        _validate_repo_id(repo_id)
    except ValueError:  # HFValidationError
        raise HubError(
            "invalid",
            "id",
            f"{shown(repo_id)} is not a Hub repository id: expected 'name' or 'namespace/name' "
            "of letters, digits, '-', '_' and '.' (at most 96 characters each).",
        ) from None
    return repo_id


def check_revision(revision: object) -> str | None:
    """``revision`` if it is ``None`` (the default branch) or a plausible git ref or commit: at
    most 256 characters, no ``..``, no leading ``/``, no whitespace or control characters."""
    if revision is None:
        return None
    if not isinstance(revision, str) or not revision:
        raise HubError("invalid", "revision", "The revision must be a non-empty string.")
    if len(revision) > MAX_REVISION_CHARS:
        raise HubError(
            "invalid", "revision", f"The revision is longer than {MAX_REVISION_CHARS} characters."
        )
    if revision.startswith("/") or ".." in revision or _has_space_or_control(revision):
        raise HubError(
            "invalid",
            "revision",
            f"{shown(revision)} is not a revision: a branch, tag or commit id has no '..', "
            "no leading '/' and no whitespace.",
        )
    return revision


def check_repo_path(path: str) -> str | None:
    """Why ``path`` is not a safe relative file path inside a repository (``None`` if it is):
    no absolute paths, backslashes, empty, ``.`` or ``..`` components."""
    if not path or path.startswith("/") or "\\" in path or _has_space_or_control(path, space=False):
        return "is not a relative path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "leaves the repository"
    return None


def _has_space_or_control(text: str, *, space: bool = True) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F or (space and c.isspace()) for c in text)
