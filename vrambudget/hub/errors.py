"""The one error the hub layer raises: what went wrong (``kind``), which request field to name
(``field``) and one sentence for a user (``message``), never the token."""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["KINDS", "HubError", "HubErrorKind"]

HubErrorKind = Literal["not_found", "gated", "unreachable", "invalid"]
"""``not_found``: the repository, revision or file is absent (HTTP 404; huggingface_hub's
``RepositoryNotFoundError``, ``RevisionNotFoundError``, ``EntryNotFoundError``), or a local
directory or file is. ``gated``: the Hub refused access (HTTP 401/403: a gated or private
repository, the token missing or refused). ``unreachable``: connection errors, timeouts, HTTP
5xx/429, an endpoint that does not answer like the Hub. ``invalid``: the request or what the
repository holds is malformed (a repository id or revision that breaks the Hub's naming rules,
a ``config.json`` that is not a JSON object, a safetensors header that does not parse or is
over the size limit)."""

KINDS: tuple[HubErrorKind, ...] = get_args(HubErrorKind)


class HubError(Exception):
    """A checkpoint could not be read. ``str(error)`` is ``message``."""

    __slots__ = ("field", "kind", "message")

    def __init__(self, kind: str, field: str, message: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown HubError kind {kind!r}; expected one of {KINDS}")
        super().__init__(message)
        self.kind: HubErrorKind = kind  # narrowed by the check above
        self.field = field
        """The request field the error is about (``id``, ``revision``, ``path``)."""
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"HubError({self.kind!r}, {self.field!r}, {self.message!r})"

    def __reduce__(self) -> tuple[type[HubError], tuple[str, str, str]]:
        # Crosses process boundaries intact (the service's worker pools pickle exceptions).
        return (HubError, (self.kind, self.field, self.message))
