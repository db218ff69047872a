"""huggingface_hub's exceptions, as ``HubError`` kinds.

What huggingface_hub 2.4.0 raises (``utils/_http.py``: ``hf_raise_for_status``): the Hub's
``X-Error-Code`` header picks the class -- ``RepoNotFound`` -> ``RepositoryNotFoundError``
(also any 401 on ``/api/...`` unless the token itself was refused), ``RevisionNotFound`` ->
``RevisionNotFoundError``, ``EntryNotFound`` -> ``RemoteEntryNotFoundError``, ``GatedRepo`` ->
``GatedRepoError``; any other status is an ``HfHubHTTPError`` carrying the response. Transport
failures are httpx2's (``TimeoutException``, ``NetworkError`` ... under ``HTTPError``);
``HF_HUB_OFFLINE`` raises ``OfflineModeIsEnabled`` from the session's request hook.
``hf_hub_download`` turns a failed ``HEAD`` (connection error, 5xx) it cannot serve from its
cache into ``LocalEntryNotFoundError`` raised *from* the original error
(``file_download._raise_on_head_call_error``). Messages are written here from the repository
id, revision and file name only: never huggingface_hub's text (which quotes URLs), never the
token.
"""

from __future__ import annotations

from dataclasses import dataclass

import huggingface_hub.utils as _hf_utils
from huggingface_hub.errors import (
    DisabledRepoError,
    EntryNotFoundError,
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    NotASafetensorsRepoError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)

from vrambudget.hub.errors import HubError
from vrambudget.hub.names import shown

__all__ = ["Where", "translate"]

# huggingface_hub re-exports its HTTP library as ``huggingface_hub.utils.httpx`` ("the same
# export for downstream libraries across major versions", utils/__init__.py); it is httpx2 in
# 2.4.0. The export is lazy, which mypy cannot follow.
_httpx = _hf_utils.httpx  # type: ignore[attr-defined]
_TIMEOUT: type[Exception] = _httpx.TimeoutException
_TRANSPORT: type[Exception] = _httpx.HTTPError
_BAD_URL: type[Exception] = _httpx.InvalidURL


@dataclass(frozen=True, slots=True)
class Where:
    """What was being read when an exception came: for the message."""

    repo_id: str
    revision: str | None
    timeout_s: float
    file: str | None = None

    @property
    def repo(self) -> str:
        at = f"revision {shown(self.revision)}" if self.revision else "the default branch"
        return f"repository {shown(self.repo_id)} at {at}"

    @property
    def thing(self) -> str:
        return f"{shown(self.file)} in {self.repo}" if self.file else self.repo


def translate(exc: BaseException, where: Where) -> HubError | None:
    """The ``HubError`` for an exception huggingface_hub (or its HTTP library) raised;
    ``None`` for anything else (a bug, a disk error: let it propagate)."""
    if isinstance(exc, LocalEntryNotFoundError):
        # hf_hub_download could neither reach the file nor find it cached: the cause says why.
        cause = exc.__cause__
        inner = translate(cause, where) if cause is not None else None
        return inner or HubError(
            "unreachable", "id", f"The Hub could not be reached for {where.thing}."
        )
    if isinstance(exc, GatedRepoError):
        return HubError(
            "gated",
            "id",
            f"Repository {shown(where.repo_id)} is gated: the service's Hub token is missing or "
            "has not been granted access to it.",
        )
    if isinstance(exc, RevisionNotFoundError):
        return HubError(
            "not_found",
            "revision",
            f"Revision {shown(where.revision or 'main')} was not found in repository "
            f"{shown(where.repo_id)}.",
        )
    if isinstance(exc, DisabledRepoError):
        return HubError(
            "not_found", "id", f"Repository {shown(where.repo_id)} has been disabled on the Hub."
        )
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            "not_found",
            "id",
            f"Repository {shown(where.repo_id)} was not found on the Hub (a private repository "
            "looks the same to a token that cannot read it).",
        )
    if isinstance(exc, EntryNotFoundError):
        return HubError("not_found", "id", f"File {where.thing} was not found on the Hub.")
    if isinstance(exc, NotASafetensorsRepoError):
        return HubError("not_found", "id", f"The {where.repo} has no safetensors weights.")
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(
            "unreachable",
            "id",
            "The Hub is not reachable from this process: huggingface_hub's offline mode "
            "(HF_HUB_OFFLINE) is on.",
        )
    if isinstance(exc, FileMetadataError):
        return HubError(
            "unreachable",
            "id",
            f"The endpoint did not answer like the Hub for {where.thing} (no commit id or ETag).",
        )
    if isinstance(exc, HfHubHTTPError):
        return _by_status(exc.response.status_code, where)
    if isinstance(exc, SafetensorsParsingError):
        limit = "over huggingface_hub's 25,000,000-byte limit" if "too big" in str(exc) else ""
        return HubError(
            "invalid",
            "id",
            f"The safetensors header of {where.thing} "
            + (f"is {limit}." if limit else "does not parse."),
        )
    if isinstance(exc, HFValidationError):
        return HubError("invalid", "id", f"{shown(where.repo_id)} is not a Hub repository id.")
    if isinstance(exc, _TIMEOUT):
        return HubError(
            "unreachable",
            "id",
            f"The Hub did not answer within {where.timeout_s:g} s for {where.thing}.",
        )
    if isinstance(exc, (_TRANSPORT, _BAD_URL, ConnectionError, TimeoutError)):
        return HubError("unreachable", "id", f"The Hub could not be reached for {where.thing}.")
    return None


def _by_status(status: int, where: Where) -> HubError:
    if status == 404:
        return HubError("not_found", "id", f"The Hub found nothing for {where.thing} (HTTP 404).")
    if status == 401:
        return HubError(
            "gated",
            "id",
            f"The Hub refused the service's credentials for {where.thing} (HTTP 401): the "
            "token is missing, invalid or expired.",
        )
    if status == 403:
        return HubError(
            "gated",
            "id",
            f"The Hub denied access to {where.thing} (HTTP 403): the token lacks permission.",
        )
    if status == 400:
        return HubError(
            "invalid",
            "revision" if where.revision else "id",
            f"The Hub rejected the request for {where.thing} as malformed (HTTP 400).",
        )
    if status == 429:
        return HubError(
            "unreachable",
            "id",
            f"The Hub is rate-limiting requests (HTTP 429) for {where.thing}; try again later.",
        )
    return HubError(
        "unreachable",
        "id",
        f"The Hub answered HTTP {status} for {where.thing}; try again later.",
    )
