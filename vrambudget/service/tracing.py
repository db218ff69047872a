"""The trace tier behind ``POST /v1/budgets`` with ``method: "trace"``: a bounded pool of worker
processes that run the (CPU-bound, torch-importing) trace engine, so the event loop never waits
on a trace.

* **Processes, not threads**: a trace holds the GIL for seconds. ``pebble.ProcessPool`` rather
  than ``concurrent.futures``: on a time limit pebble kills the worker and starts a new one;
  concurrent.futures cannot stop a running task. The ``spawn`` context: no forked copy of the
  server's threads and sockets in the worker, and the same behaviour on every platform.
* **Started lazily**, on the first trace request, not at app start-up: most replicas serve only
  the analytic path, and a worker with torch imported costs a process, ~1 s of CPU to start and
  hundreds of MiB of resident memory. Start-up stays fast and torch-free (tests/test_layering.py).
  Each worker imports torch and the engine once, in the pool's initializer, which runs before
  the worker takes its first task, so the import is never counted against a trace's time limit
  and later traces do not pay it at all.
* **Bounded**: at most ``max_pending`` distinct traces are running or waiting; beyond that a
  request is refused at once (:class:`TraceBusy`, 503 + ``Retry-After``) instead of queueing
  without end. Identical concurrent requests share one trace (single flight), and answers are
  kept in a bounded LRU keyed by the sha256 of the *decoded* request re-encoded (defaults
  filled, key order and whitespace irrelevant).
* **Nothing unpicklable crosses the process boundary**: the request goes to the worker as msgspec
  JSON bytes and comes back as encoded answer bytes or a tuple of plain strings (pebble treats an
  unpicklable result as a broken pool, and ``InvalidWorkload(field, message)`` does not survive
  pickling).

This module imports neither Litestar nor torch nor pebble at import time: the worker processes
import its worker side (:mod:`~vrambudget.service.trace_worker`, for :func:`run_trace`), and the
server imports pebble only on its first trace. Errors are plain exceptions
(:mod:`~vrambudget.service.trace_errors`); ``problems.py`` turns them into problem+json.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from typing import Any, Protocol

import msgspec

from vrambudget.core.errors import (
    BudgetError,
    InvalidWorkload,
    UnknownGPU,
    UnknownModel,
)
from vrambudget.core.inventory import ModelInventory
from vrambudget.core.memo import BoundedCache
from vrambudget.core.spec import BudgetRequest

from .resolutions import Resolutions, resolution_digest
from .trace_errors import (
    TraceBusy,
    TraceError,
    TraceTimeLimit,
    TraceUnavailable,
    TraceWorkerDied,
)
from .trace_worker import (
    DEFAULT_ENTRY,
    ENTRY_PATTERN,
    INSTALL_HINT,
    encode_answer,
    init_worker,
    load_entry,
    run_inventory,
    run_trace,
)
from .workers import WorkerProcesses

__all__ = [
    "DEFAULT_ENTRY",
    "ENTRY_PATTERN",
    "INSTALL_HINT",
    "OUTCOMES",
    "TraceBusy",
    "TraceError",
    "TracePool",
    "TraceTimeLimit",
    "TraceUnavailable",
    "TraceWorkerDied",
    "canonical_key",
    "encode_answer",
    "init_worker",
    "load_entry",
    "run_trace",
]

log = logging.getLogger("vrambudget.trace")

TIME_LIMIT_ENV = "VRAMBUDGET_TRACE_TIME_LIMIT_S"

OUTCOMES = (
    "ok",
    "shared",
    "cached",
    "timeout",
    "busy",
    "crashed",
    "invalid",
    "unavailable",
    "error",
)
"""Outcome label of ``vrambudget_trace_requests_total``, one per trace request: ``shared`` is
an answer from another request's trace in flight (single flight), ``error`` an unexpected
exception in the engine (500)."""


# ------------------------------------------------------------------------------ server side --


def canonical_key(request: BudgetRequest, resolutions: Resolutions = ()) -> tuple[bytes, bytes]:
    """(encoded request, its digest with what its models resolved to): the worker's input and
    the cache key (:func:`~vrambudget.service.resolutions.resolution_digest`, as the analytic
    answers' key). Encoding the decoded struct fills defaults and fixes field order, so equal
    workloads hash equal however the body was written."""
    payload = msgspec.json.encode(request)
    return payload, resolution_digest(payload, resolutions)


class _Cache(Protocol):
    def get(self, key: tuple[str, bytes]) -> bytes | None: ...
    def put(self, key: tuple[str, bytes], value: bytes) -> bytes: ...


@dataclass(frozen=True, slots=True)
class _Metrics:
    requests: Any
    duration: Any


@lru_cache(maxsize=1)
def _metrics() -> _Metrics:
    """Process-wide, in prometheus_client's default registry -- where Litestar's
    PrometheusMiddleware puts the request metrics and PrometheusController reads them -- and
    created once however many apps a process builds (a second registration would raise)."""
    from prometheus_client import Counter, Histogram

    requests = Counter(
        "vrambudget_trace_requests", "Trace requests (method: trace) by outcome", ["outcome"]
    )
    duration = Histogram(
        "vrambudget_trace_duration_seconds",
        "Seconds a worker spent on a trace that ran to its end (outcome ok: a budget; invalid: "
        "the engine rejected the workload)",
        ["outcome"],
        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
    )
    for outcome in OUTCOMES:
        requests.labels(outcome)
    for outcome in ("ok", "invalid"):
        duration.labels(outcome)
    return _Metrics(requests=requests, duration=duration)


def trace_tier_problem(entry: str) -> str | None:
    """Why the trace tier cannot run here (None: it can), found without importing torch or the
    engine: pebble, torch and the entry point's module must be installed."""
    module = entry.partition(":")[0]
    for name in ("pebble", "torch", module):
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):  # a parent package that does not import
            spec = None
        if spec is None:
            return f"{INSTALL_HINT} (module {name!r} not found)"
    return None


_REJECTED = ("invalid", "unknown-model", "unknown-gpu", "budget-error")
"""Worker results where the engine rejected the workload (a 4xx answer)."""


def _settle(
    flights: dict[bytes, asyncio.Task[bytes]], digest: bytes, task: asyncio.Task[bytes]
) -> None:
    """A job done: out of the single-flight table, its exception retrieved (no "exception was
    never retrieved" when nobody waits)."""
    if flights.get(digest) is task:
        del flights[digest]
    if not task.cancelled():
        task.exception()


class TracePool:
    """The app's trace workers, single-flight table and answer cache (one per app)."""

    def __init__(
        self,
        *,
        entry: str,
        workers: int,
        time_limit_s: float,
        max_pending: int,
        cache: _Cache,
        env: dict[str, str] | None = None,
    ) -> None:
        self.entry = entry
        self.env = dict(env or {})
        """Environment variables set in each worker before the engine loads (e.g. the
        calibration profiles directory)."""
        self.workers = workers
        self.time_limit_s = time_limit_s
        self.max_pending = max_pending
        self._cache = cache
        self._inflight: dict[bytes, asyncio.Task[bytes]] = {}
        self._processes = WorkerProcesses(
            "trace",
            workers,
            init_worker,
            (entry, self.env),
            lambda: TraceUnavailable("the server is shutting down", temporary=True),
        )
        self._problem: str | None = None
        self._checked = False
        self._typical_s: float | None = None  # EWMA of finished traces, for Retry-After
        self._metrics = _metrics()
        self._inventories: BoundedCache[bytes, ModelInventory] = BoundedCache(128)
        self._inventory_flight: dict[bytes, asyncio.Task[bytes]] = {}

    # -- availability -------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        if not self._checked:
            self._problem = self._problem or trace_tier_problem(self.entry)
            self._checked = True
        return self._problem

    # -- the request path ---------------------------------------------------------------------

    async def answer(self, request: BudgetRequest, resolutions: Resolutions = ()) -> bytes:
        """The encoded budget of a ``method: trace`` request, from the cache, from a trace of
        the same workload already in flight, or from a new trace. ``resolutions`` are its
        models as the service resolved them (:mod:`vrambudget.service.models`)."""
        count = self._metrics.requests.labels
        reason = self.unavailable()
        if reason is not None:
            count("unavailable").inc()
            raise TraceUnavailable(reason)
        payload, digest = canonical_key(request, resolutions)
        key = ("trace", digest)
        hit = self._cache.get(key)
        if hit is not None:
            count("cached").inc()
            return hit
        try:
            task, leader = self._flight(
                self._inflight,
                digest,
                len(self._inflight),
                lambda: self._job(run_trace, (self.entry, payload, resolutions), key),
            )
        except TraceBusy:
            count("busy").inc()
            raise
        try:
            # shield: a client that disconnects does not cancel a trace others may share (its
            # answer is cached either way); shutdown cancels the task itself.
            answer = await asyncio.shield(task)
        except TraceTimeLimit:
            count("timeout").inc()
            raise
        except TraceWorkerDied:
            count("crashed").inc()
            raise
        except TraceUnavailable:
            count("unavailable").inc()
            raise
        except BudgetError:
            count("invalid").inc()
            raise
        except asyncio.CancelledError:
            raise
        except Exception:
            count("error").inc()
            raise
        count("ok" if leader else "shared").inc()
        return answer

    async def inventory(self, config: dict[str, Any]) -> ModelInventory:
        """The framework inventory of a ``config.json`` (built in a worker, once per config:
        cached, and shared by concurrent requests for the same config)."""
        reason = self.unavailable()
        if reason is not None:
            raise TraceUnavailable(reason)
        payload = msgspec.json.encode(config, order="sorted")
        digest = hashlib.sha256(payload).digest()
        hit = self._inventories.get(digest)
        if hit is not None:
            return hit
        task, _ = self._flight(
            self._inventory_flight,
            digest,
            len(self._inflight) + len(self._inventory_flight),
            lambda: self._job(run_inventory, (payload,), None, timed=False),
            resolving=True,
        )
        encoded = await asyncio.shield(task)
        return self._inventories.get_or(
            digest, lambda: msgspec.json.decode(encoded, type=ModelInventory)
        )

    def _flight(
        self,
        flights: dict[bytes, asyncio.Task[bytes]],
        digest: bytes,
        load: int,
        start: Callable[[], Coroutine[Any, Any, bytes]],
        *,
        resolving: bool = False,
    ) -> tuple[asyncio.Task[bytes], bool]:
        """Single flight: (the job in ``flights`` for ``digest``, False) to join, or (a job
        ``start`` begins now, True). Refused when the server is shutting down, or busy
        (:class:`TraceBusy`; ``resolving``: a model resolution's job) when ``load``, the jobs
        counted against ``max_pending``, is at the cap."""
        task = flights.get(digest)
        if task is not None:
            return task, False
        if self._processes.closed:
            raise TraceUnavailable("the server is shutting down", temporary=True)
        if load >= self.max_pending:
            raise TraceBusy(self.max_pending, self._retry_after_s(), resolving=resolving)
        task = asyncio.get_running_loop().create_task(start())
        flights[digest] = task
        task.add_done_callback(functools.partial(_settle, flights, digest))
        return task, True

    def _retry_after_s(self) -> int:
        """When a slot is likely free: a typical trace's duration (until one has finished, the
        smaller of 5 s and the limit), at least 1 s and at most the limit."""
        typical = self._typical_s if self._typical_s is not None else min(5.0, self.time_limit_s)
        return max(1, min(math.ceil(typical), math.ceil(self.time_limit_s)))

    async def _job(
        self, fn: Any, args: tuple[Any, ...], key: tuple[str, bytes] | None, *, timed: bool = True
    ) -> bytes:
        """Run ``fn(*args)`` in a worker; its answer bytes (cached under ``key`` if given).
        ``timed``: a trace, whose duration the histogram and ``Retry-After`` average (not a
        model's inventory)."""
        from concurrent.futures.process import BrokenProcessPool

        pool, future = await asyncio.to_thread(self._schedule, fn, args)
        from pebble import ProcessExpired  # imported by _schedule by now

        try:
            result = await asyncio.wrap_future(future)
        except TimeoutError:  # pebble has killed the worker and is starting a new one
            raise TraceTimeLimit(self.time_limit_s) from None
        except BrokenProcessPool as exc:
            self._processes.discard(pool)
            raise TraceWorkerDied(
                None, f"the trace pool broke ({exc}); it has been restarted"
            ) from None
        except ProcessExpired as exc:  # the worker died mid-trace; pebble starts a new one
            raise TraceWorkerDied(exc.exitcode) from None
        kind = result[0]
        if kind == "ok":
            if timed:
                self._finished(result[2], "ok")
            return result[1] if key is None else self._cache.put(key, result[1])
        if kind == "unavailable":
            self._problem = result[1]  # the same on every worker: answer 501 from now on
            raise TraceUnavailable(result[1])
        if timed:
            self._finished(result[-1], "invalid" if kind in _REJECTED else None)
        if kind == "invalid":
            raise InvalidWorkload(result[1], result[2])
        if kind == "unknown-model":
            raise UnknownModel(result[1])
        if kind == "unknown-gpu":
            raise UnknownGPU(result[1])
        if kind == "budget-error":
            raise BudgetError(result[1])
        if kind == "memory":
            raise TraceWorkerDied(None, f"out of host memory: MemoryError {result[1]}".strip())
        log.error("trace engine %s failed: %s\n%s", self.entry, result[1], result[2])
        raise RuntimeError(f"trace engine failed: {result[1]}")

    def _finished(self, seconds: float, outcome: str | None) -> None:
        if outcome is not None:
            self._metrics.duration.labels(outcome).observe(seconds)
        self._typical_s = (
            seconds if self._typical_s is None else 0.7 * self._typical_s + 0.3 * seconds
        )

    # -- the pebble pool (called in worker threads, never on the event loop) ------------------

    def _schedule(self, fn: Any, args: tuple[Any, ...]) -> tuple[Any, Any]:
        """(the pool, the pebble future of the job); a broken pool is replaced once."""
        for attempt in (1, 2):
            pool = self._processes.get()
            try:
                return pool, pool.schedule(fn, args=args, timeout=self.time_limit_s)
            except RuntimeError:  # "Unexpected error within the Pool" / "not active"
                if attempt == 2 or self._processes.closed:
                    raise TraceWorkerDied(None, "the trace pool is not running") from None
                self._processes.discard(pool)
        raise AssertionError("unreachable")

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._processes.started

    @property
    def pool(self) -> Any:
        """The running pebble pool, if any (tests kill its workers)."""
        return self._processes.pool

    def open(self) -> None:
        """Accept traces again (app start-up); workers still start only on the first trace."""
        self._processes.open()

    async def close(self) -> None:
        """Cancel traces in flight and stop the workers (app shutdown)."""
        self._processes.closed = True
        tasks = [*self._inflight.values(), *self._inventory_flight.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._processes.close()
