"""Why a trace request got no budget: plain exceptions (``problems.py`` maps each to
problem+json); the trace pool is :mod:`vrambudget.service.tracing`."""

from __future__ import annotations

__all__ = ["TraceBusy", "TraceError", "TraceTimeLimit", "TraceUnavailable", "TraceWorkerDied"]


class TraceError(Exception):
    """Why a trace request got no budget (problems.py maps each to problem+json)."""


class TraceUnavailable(TraceError):
    """The trace tier cannot run on this server (501), or not now: shutting down (503)."""

    def __init__(self, reason: str, *, temporary: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.temporary = temporary


class TraceTimeLimit(TraceError):
    """The trace ran past the time limit and its worker was killed (422)."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(f"trace exceeded {limit_s:g} s")
        self.limit_s = limit_s


class TraceBusy(TraceError):
    """As many traces as allowed are running or waiting (503 + Retry-After). ``resolving``: the
    refused job is a model's resolution (its framework inventory, built by the trace workers
    for any method), not a trace."""

    def __init__(self, max_pending: int, retry_after_s: int, *, resolving: bool = False) -> None:
        what = "traces and model resolutions" if resolving else "traces"
        super().__init__(f"{max_pending} {what} running or waiting")
        self.max_pending = max_pending
        self.retry_after_s = retry_after_s
        self.resolving = resolving


class TraceWorkerDied(TraceError):
    """The worker process running the trace died (killed for memory, a crash) (503)."""

    def __init__(self, exitcode: int | None, reason: str = "") -> None:
        super().__init__(reason or f"trace worker exited with code {exitcode}")
        self.exitcode = exitcode
        self.reason = reason
