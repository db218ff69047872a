"""huggingface_hub's exceptions as ``HubError`` kinds, for the ones the fake Hub does not
provoke."""

from __future__ import annotations

import pickle

import pytest
from huggingface_hub.errors import (
    DisabledRepoError,
    FileMetadataError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    NotASafetensorsRepoError,
    OfflineModeIsEnabled,
    SafetensorsParsingError,
)
from huggingface_hub.utils import httpx as httpx2  # its HTTP library (httpx2 in 2.4.0)

from vrambudget.hub import HubError
from vrambudget.hub.translate import Where, translate

WHERE = Where(repo_id="org/a", revision="main", timeout_s=3.0, file="config.json")


def _response(status: int) -> httpx2.Response:
    return httpx2.Response(status, request=httpx2.Request("GET", "http://h/api/models/org/a"))


def _chained(error: Exception) -> LocalEntryNotFoundError:
    try:
        try:
            raise error
        except Exception as cause:
            raise LocalEntryNotFoundError("no file") from cause
    except LocalEntryNotFoundError as outer:
        return outer


@pytest.mark.parametrize(
    ("exc", "kind", "field"),
    [
        (_chained(httpx2.ConnectError("refused")), "unreachable", "id"),
        (_chained(HfHubHTTPError("x", response=_response(503))), "unreachable", "id"),
        (LocalEntryNotFoundError("no file"), "unreachable", "id"),
        (httpx2.ReadTimeout("slow"), "unreachable", "id"),
        (httpx2.RemoteProtocolError("eof"), "unreachable", "id"),
        (OfflineModeIsEnabled("offline"), "unreachable", "id"),
        (FileMetadataError("no etag"), "unreachable", "id"),
        (DisabledRepoError("x", response=_response(403)), "not_found", "id"),
        (HfHubHTTPError("x", response=_response(404)), "not_found", "id"),
        (HfHubHTTPError("x", response=_response(401)), "gated", "id"),
        (HfHubHTTPError("x", response=_response(403)), "gated", "id"),
        (HfHubHTTPError("x", response=_response(400)), "invalid", "revision"),
        (HfHubHTTPError("x", response=_response(429)), "unreachable", "id"),
        (NotASafetensorsRepoError("none"), "not_found", "id"),
        (SafetensorsParsingError("header is not json"), "invalid", "id"),
        (HFValidationError("bad id"), "invalid", "id"),
    ],
)
def test_kinds(exc: Exception, kind: str, field: str) -> None:
    error = translate(exc, WHERE)
    assert error is not None
    assert (error.kind, error.field) == (kind, field)
    assert "org/a" in error.message or "offline" in error.message
    assert "http://h" not in error.message


def test_the_timeout_is_named() -> None:
    error = translate(httpx2.ConnectTimeout("slow"), WHERE)
    assert error is not None and "3 s" in error.message


def test_a_header_over_huggingface_hubs_limit() -> None:
    error = translate(SafetensorsParsingError("safetensors header is too big. Maximum"), WHERE)
    assert error is not None and "25,000,000" in error.message


def test_anything_else_is_not_translated() -> None:
    assert translate(RuntimeError("bug"), WHERE) is None
    assert translate(PermissionError("cache dir"), WHERE) is None


def test_hub_error() -> None:
    error = HubError("gated", "id", "Repository 'org/a' is gated.")
    assert str(error) == error.message == "Repository 'org/a' is gated."
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.kind, copy.field, copy.message) == ("gated", "id", error.message)
    with pytest.raises(ValueError):
        HubError("teapot", "id", "x")
