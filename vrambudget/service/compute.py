"""The compute pool: analytic budgets, fits and comparisons run in a bounded pool of worker
processes, never on the event loop, so that no request -- however much work it asks for -- can
delay another (``/healthz`` included) or stop the server from draining on SIGTERM.

* **Processes, not threads**: the analytic formulas are pure Python and hold the GIL; a thread
  pool would still leave the event loop waiting for the GIL on every I/O step. ``pebble`` (as in
  the trace tier): a task that runs past the time limit has its worker killed and replaced, and
  a cancelled task (a client that went away) frees its worker; ``concurrent.futures`` can stop
  neither. The ``spawn`` context: no forked copy of the server's threads and sockets.
* **Deadline**: a task computing longer than ``time_limit_s`` is stopped -- 422
  ``compute-time-limit`` naming ``VRAMBUDGET_COMPUTE_TIME_LIMIT_S``; a task still waiting for a
  worker after another ``time_limit_s`` is dropped -- 503 ``compute-busy`` with ``Retry-After``.
  No request waits more than twice the limit.
* **Bounded**: at most ``max_pending`` tasks running or waiting (beyond: 503 at once), and an
  answer larger than ``max_answer_bytes`` is refused in the worker (422 ``answer-too-large``)
  instead of crossing the pipe. The schema bounds every input dimension that multiplies work
  (``vrambudget.core.spec.limits``), so a valid request stays well inside both.
* **Started lazily** on the first computation (a worker imports the core only: a fraction of a
  second), so start-up and tests that never compute stay cheap.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from litestar import Request, Response

from vrambudget.core.errors import BudgetError, InvalidWorkload, UnknownGPU, UnknownModel
from vrambudget.http.problems import internal, problem

from .compute_worker import init_worker, run_task
from .workers import WorkerProcesses

__all__ = [
    "AnswerTooLarge",
    "ComputeBusy",
    "ComputeError",
    "ComputePool",
    "ComputeTimeLimit",
    "ComputeUnavailable",
    "ComputeWorkerDied",
    "compute_error",
]

log = logging.getLogger("vrambudget.compute")

TIME_LIMIT_ENV = "VRAMBUDGET_COMPUTE_TIME_LIMIT_S"
MAX_PENDING_ENV = "VRAMBUDGET_COMPUTE_MAX_PENDING"
MAX_ANSWER_ENV = "VRAMBUDGET_MAX_ANSWER_BYTES"
_TYPE = "https://vrambudget.dev/problems/"


class ComputeError(Exception):
    """Base of the compute pool's own errors (mapped by :func:`compute_error`)."""


class ComputeTimeLimit(ComputeError):
    def __init__(self, limit_s: float) -> None:
        super().__init__(f"computation ran past {limit_s:g} s")
        self.limit_s = limit_s


class ComputeBusy(ComputeError):
    def __init__(self, reason: str, retry_after_s: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class ComputeWorkerDied(ComputeError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ComputeUnavailable(ComputeError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AnswerTooLarge(ComputeError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"answer of {size} bytes exceeds {limit}")
        self.size = size
        self.limit = limit


def compute_error(request: Request[Any, Any, Any], exc: ComputeError) -> Response[Any]:
    """problem+json of the compute pool's errors."""
    match exc:
        case ComputeTimeLimit():
            return problem(
                request,
                422,
                "Compute time limit exceeded",
                f"this request needs more than the {exc.limit_s:g} s of computation "
                f"{TIME_LIMIT_ENV} allows, so it was stopped. Ask for fewer GPUs, device "
                f"counts or solved variables, or a smaller workload.",
                type_=_TYPE + "compute-time-limit",
            )
        case ComputeBusy():
            return problem(
                request,
                503,
                "Compute workers busy",
                f"{exc.reason}. Retry after {exc.retry_after_s} s.",
                type_=_TYPE + "compute-busy",
                headers={"Retry-After": str(exc.retry_after_s)},
            )
        case ComputeWorkerDied():
            return problem(
                request,
                503,
                "Compute worker died",
                f"the worker computing this answer died ({exc.reason}); a new one has taken "
                f"its place.",
                type_=_TYPE + "compute-worker-died",
                headers={"Retry-After": "1"},
            )
        case ComputeUnavailable():
            return problem(
                request,
                503,
                "Service unavailable",
                exc.reason,
                type_=_TYPE + "compute-unavailable",
                headers={"Retry-After": "1"},
            )
        case AnswerTooLarge():
            return problem(
                request,
                422,
                "Answer too large",
                f"the answer would be {exc.size} bytes, more than the {exc.limit} bytes "
                f"{MAX_ANSWER_ENV} allows; ask for fewer pipeline stages, GPUs or device "
                f"counts.",
                type_=_TYPE + "answer-too-large",
            )
    return internal(request, exc)


class ComputePool:
    """The app's compute workers (one pool per app)."""

    def __init__(
        self,
        *,
        workers: int,
        time_limit_s: float,
        max_pending: int,
        max_answer_bytes: int,
        profiles_dir: str | None = None,
    ) -> None:
        self.workers = workers
        self.time_limit_s = time_limit_s
        self.max_pending = max_pending
        self.max_answer_bytes = max_answer_bytes
        self.profiles_dir = profiles_dir
        self._pending = 0
        self._processes = WorkerProcesses(
            "compute",
            workers,
            init_worker,
            (profiles_dir,),
            lambda: ComputeUnavailable("the server is shutting down"),
            join_timeout_s=5,
        )

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def started(self) -> bool:
        return self._processes.started

    def _retry_after_s(self) -> int:
        return max(1, math.ceil(self.time_limit_s))

    async def run(self, task: str, payload: bytes, *args: Any) -> bytes:
        """The encoded answer of ``task`` (``budget``, ``fit``, ``comparison``) on ``payload``
        (the canonical request), computed in a worker process."""
        if self._processes.closed:
            raise ComputeUnavailable("the server is shutting down")
        if self._pending >= self.max_pending:
            raise ComputeBusy(
                f"{self._pending} computations are running or waiting, the most "
                f"{MAX_PENDING_ENV} allows",
                self._retry_after_s(),
            )
        self._pending += 1
        try:
            return await self._run(task, payload, args)
        finally:
            self._pending -= 1

    async def _run(self, task: str, payload: bytes, args: tuple[Any, ...]) -> bytes:
        from concurrent.futures.process import BrokenProcessPool

        pool, future = await asyncio.to_thread(self._schedule, task, payload, args)
        from pebble import ProcessExpired  # imported by _schedule by now

        wrapped = asyncio.wrap_future(future)
        try:
            try:
                # The running time is bounded by pebble's timeout, counted from the task's start
                # in a worker; the wait for a worker (a replacement's boot included) by this
                # one. Shielded: the timeout must not cancel a task that has started.
                result = await asyncio.wait_for(asyncio.shield(wrapped), 2 * self.time_limit_s)
            except TimeoutError:
                if not (future.done() or future.running()):  # still queued: drop it
                    future.cancel()
                    raise ComputeBusy(
                        f"no compute worker was free within {2 * self.time_limit_s:g} s "
                        f"({self.workers} workers)",
                        self._retry_after_s(),
                    ) from None
                result = await wrapped  # started: pebble ends it within its limit
        except TimeoutError:  # pebble's: it ran past the limit and its worker was killed
            raise ComputeTimeLimit(self.time_limit_s) from None
        except asyncio.CancelledError:  # the client went away: free its worker
            future.cancel()
            raise
        except BrokenProcessPool as exc:
            self._processes.discard(pool)
            raise ComputeWorkerDied(f"the pool broke: {exc}; it has been restarted") from None
        except ProcessExpired as exc:
            raise ComputeWorkerDied(f"exit code {exc.exitcode}") from None
        kind = result[0]
        if kind == "ok":
            answer: bytes = result[1]
            return answer
        if kind == "too-large":
            raise AnswerTooLarge(result[1], self.max_answer_bytes)
        if kind == "invalid":
            raise InvalidWorkload(result[1], result[2])
        if kind == "unknown-model":
            raise UnknownModel(result[1])
        if kind == "unknown-gpu":
            raise UnknownGPU(result[1])
        if kind == "budget-error":
            raise BudgetError(result[1])
        if kind == "memory":
            raise ComputeWorkerDied(f"out of host memory: MemoryError {result[1]}".strip())
        log.error("computing a %s failed: %s\n%s", task, result[1], result[2])
        raise RuntimeError(f"computing a {task} failed: {result[1]}")

    # -- the pebble pool (called in worker threads, never on the event loop) ------------------

    def _schedule(self, task: str, payload: bytes, args: tuple[Any, ...]) -> tuple[Any, Any]:
        for attempt in (1, 2):
            pool = self._processes.get()
            try:
                return pool, pool.schedule(
                    run_task,
                    args=(task, self.max_answer_bytes, payload, *args),
                    timeout=self.time_limit_s,
                )
            except RuntimeError:  # "Unexpected error within the Pool" / "not active"
                if attempt == 2 or self._processes.closed:
                    raise ComputeWorkerDied("the compute pool is not running") from None
                self._processes.discard(pool)
        raise AssertionError("unreachable")

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self) -> None:
        self._processes.open()

    async def close(self) -> None:
        """Stop the workers (app shutdown): computations still running are killed."""
        await self._processes.close()
