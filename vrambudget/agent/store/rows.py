"""What the store holds, as read back: a probe's status, its row, and an outbox row."""

from __future__ import annotations

from enum import StrEnum

import msgspec

__all__ = [
    "ACTIVE_STATUSES",
    "TERMINAL_STATUSES",
    "Callback",
    "OutboxRow",
    "ProbeRow",
    "ProbeStatus",
]


class ProbeStatus(StrEnum):
    """Where a probe is in its life. A probe moves from an active status to exactly one terminal
    one; the compare-and-set in :meth:`Store.transition` is what makes "exactly one" hold when a
    cancel races a completion."""

    QUEUED = "queued"
    """Accepted and waiting for its GPU (one probe per GPU at a time)."""
    RUNNING = "running"
    """Its child process has been started."""
    SUCCEEDED = "succeeded"
    """Finished and measured; the result holds both views of memory."""
    OOM = "oom"
    """The workload ran out of device memory: a result (peak reached, message), not a crash."""
    TIMEOUT = "timeout"
    """Killed at its time limit."""
    FAILED = "failed"
    """The workload or the harness raised; the error says what."""
    CANCELLED = "cancelled"
    """Cancelled by a client (``DELETE``); its child process was terminated."""
    INTERRUPTED = "interrupted"
    """The agent stopped (crash, restart) while the probe was queued or running."""
    UNRELIABLE = "unreliable"
    """Ran, but the measurement cannot be trusted (another process changed device memory)."""


_ALL_STATUSES: frozenset[str] = frozenset(s.value for s in ProbeStatus)
ACTIVE_STATUSES: frozenset[str] = frozenset({ProbeStatus.QUEUED.value, ProbeStatus.RUNNING.value})
"""A probe in one of these has a process (or a queue slot) behind it."""
TERMINAL_STATUSES: frozenset[str] = _ALL_STATUSES - ACTIVE_STATUSES
"""Final: nothing moves a probe out of these (the compare-and-sets all expect an active one)."""

Callback = tuple[str, str, str]
"""``(url, payload, event_id)``: where to post, the exact JSON body, and the webhook-id, which
is the outbox row's primary key and stays the same on every retry (receivers dedupe on it)."""


class ProbeRow(msgspec.Struct, frozen=True, kw_only=True):
    """One probe as stored; fields are named after the columns. ``request`` and ``result`` are
    JSON *text* (what ``create_probe`` / ``transition`` took as ``request_json`` /
    ``result_json``), so the store needs no wire types."""

    id: str
    created_at: float
    updated_at: float
    status: str
    device_key: str
    request: str
    result: str | None
    error: str | None
    estimate: str | None = None
    estimate_error: str | None = None
    comparison: str | None = None
    comparison_error: str | None = None


class OutboxRow(msgspec.Struct, frozen=True, kw_only=True):
    """One callback to deliver. ``next_attempt_at`` is None once delivery was given up (the row
    is kept, with ``last_error``, for whoever asks why); ``delivered_at`` is set once a 2xx came
    back."""

    id: str
    probe_id: str
    url: str
    payload: str
    attempts: int
    next_attempt_at: float | None
    delivered_at: float | None
    last_error: str | None
    created_at: float
    kind: str = "callback"
    """``callback`` (a signed webhook) or ``comparison`` (the report posted to the service)."""


def _check_status(status: str) -> None:
    if status not in _ALL_STATUSES:
        raise ValueError(f"unknown probe status {status!r}")
