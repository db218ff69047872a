"""Delivery: the retry schedule and the thread that drains the store's outbox (callbacks and
comparison requests), at least once."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Self

import httpx

from vrambudget.agent.store import OutboxRow, Store

from .addresses import AddressRefused, Resolver, pin
from .allow_list import callback_allowed
from .signing import decode_secret, sign

__all__ = ["Deliverer", "backoff_s"]

log = logging.getLogger("vrambudget.agent.webhooks")  # the name it had as one module


class _NoQueryStrings(logging.Filter):
    """httpx logs every request at INFO with its full URL: callback URLs may carry tokens in
    their query strings, so those are cut from the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                a.copy_with(query=None, fragment=None) if isinstance(a, httpx.URL) else a
                for a in record.args
            )
        return True


def redact_httpx_logs() -> None:
    """Install the filter on httpx's logger (idempotent)."""
    logger = logging.getLogger("httpx")
    if not any(isinstance(f, _NoQueryStrings) for f in logger.filters):
        logger.addFilter(_NoQueryStrings())


redact_httpx_logs()


# -- retries ---------------------------------------------------------------------------------


def backoff_s(
    attempt: int,
    *,
    base: float = 1.0,
    cap: float = 300.0,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after ``attempt`` failed attempts (1 after the first failure):
    exponential with full jitter, uniform in ``[0, min(cap, base * 2 ** (attempt - 1)))``.
    Full jitter spreads the retries of many callbacks that failed together (a receiver that
    was down) instead of bringing them back in lockstep."""
    exponent = min(max(attempt - 1, 0), 64)  # 2**64 * base is past any sane cap already
    return rng() * min(cap, base * 2.0**exponent)


# -- delivery --------------------------------------------------------------------------------


_MAX_COMPARISON_BYTES = 4 << 20


class Deliverer:
    """Drains the outbox: a daemon thread with its own ``httpx.Client``.

    A thread rather than an asyncio task: the store is synchronous SQLite and every send
    blocks for up to its timeout, neither of which belongs on the web server's event loop;
    a thread also runs the same under uvicorn, under a test, or with no event loop at all, and
    its lifetime (``start``/``stop``) is the agent's, not a request's. One pass is
    :meth:`deliver_due`, which tests call directly with a pinned clock and an
    ``httpx.MockTransport``; the thread only repeats it, sleeping until the next callback is
    due or :meth:`wake` is called (the agent calls it right after enqueuing one).

    Each attempt re-checks the allow-list (configuration may have changed since the callback
    was accepted), signs with a fresh timestamp, never follows redirects (a 3xx is a failure:
    following one would post to a host nobody allowed), and does not read the response body.
    A 2xx is delivered; anything else is retried with :func:`backoff_s` until
    ``max_attempts``, then given up (the row keeps ``last_error``). The client ignores the
    environment (``trust_env=False``): no proxy variables, and no ``.netrc`` credentials sent to
    callback hosts.
    """

    def __init__(
        self,
        store: Store,
        secret: bytes | str,
        allow_list: tuple[str, ...],
        *,
        transport: httpx.BaseTransport | None = None,
        max_attempts: int = 24,
        timeout_s: float = 10.0,
        poll_interval_s: float = 30.0,
        batch_size: int = 16,
        backoff: Callable[[int], float] = backoff_s,
        clock: Callable[[], float] = time.time,
        service_allow_list: tuple[str, ...] = (),
        on_comparison: Callable[[OutboxRow, str | None, str | None], None] | None = None,
        comparison_max_attempts: int = 10,
        concurrency: int = 8,
        resolver: Resolver | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._store = store
        self._key = decode_secret(secret)
        self._allow_list = allow_list
        self._max_attempts = max_attempts
        self._poll_interval_s = poll_interval_s
        self._batch_size = batch_size
        self._backoff = backoff
        self._clock = clock
        self._service_allow_list = service_allow_list
        self._on_comparison = on_comparison
        self._comparison_max_attempts = comparison_max_attempts
        self._concurrency = max(1, concurrency)
        self._resolver = resolver
        self._client = httpx.Client(
            transport=transport,
            follow_redirects=False,
            timeout=httpx.Timeout(timeout_s),
            trust_env=False,
            headers={"user-agent": "vrambudget-agent"},
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the deliverer was already started")
        self._thread = threading.Thread(target=self._run, name="webhook-deliverer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop after the send in flight (bounded by its timeout) and close the client.
        Undelivered callbacks stay in the outbox for the next start. Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("webhook deliverer did not stop within %.1f s", timeout_s)
                return
        self._client.close()

    def wake(self) -> None:
        """Look at the outbox now (a callback was just enqueued)."""
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the pass: a wake() during it makes the wait return
            try:
                self.deliver_due()
                sleep_s = self._sleep_s()
            except Exception:  # a locked or broken file must not kill the thread, nor spin it
                log.exception("webhook delivery pass failed")
                sleep_s = self._poll_interval_s
            self._wake.wait(sleep_s)

    def _sleep_s(self) -> float:
        due = self._store.next_attempt_at()
        if due is None:
            return self._poll_interval_s
        return min(self._poll_interval_s, max(0.0, due - self._clock()))

    # -- one pass ---------------------------------------------------------------------------

    def deliver_due(self) -> int:
        """Attempt every callback due now, once, up to ``concurrency`` at a time (a slow
        receiver delays no other); return how many were delivered."""
        rows = self._store.due_callbacks(self._clock(), max(self._batch_size, self._concurrency))
        if len(rows) <= 1 or self._concurrency == 1:
            return sum(self._attempt_guarded(row) for row in rows)
        with ThreadPoolExecutor(self._concurrency, thread_name_prefix="webhook-send") as pool:
            return sum(pool.map(self._attempt_guarded, rows))

    def _attempt_guarded(self, row: OutboxRow) -> bool:
        if self._stop.is_set():
            return False
        try:
            return self._attempt(row)
        except Exception as exc:
            # Count it as a failed attempt, so one poison row cannot block the outbox forever.
            log.exception("callback %s: attempt failed unexpectedly", row.id)
            error = f"{type(exc).__name__}: {exc}"
            if row.kind == "comparison":
                self._fail_comparison(row, error)
            else:
                self._fail(row, error)
            return False

    def _fail_comparison(self, row: OutboxRow, error: str) -> None:
        """A comparison attempt that raised: retried under the comparison limit, and when that is
        reached the probe's callback still goes out (with the error), never silently dropped."""
        attempts = row.attempts + 1
        if attempts < self._comparison_max_attempts:
            self._store.reschedule(row.id, attempts, self._clock() + self._backoff(attempts), error)
            return
        try:
            if self._on_comparison is not None:
                self._on_comparison(row, None, f"{error} (after {attempts} attempt(s))")
                return
        except Exception:  # the handler itself is broken: give the row up, keep the thread
            log.exception("comparison %s: settling failed", row.id)
        self._store.reschedule(row.id, attempts, None, error)

    def _attempt(self, row: OutboxRow) -> bool:
        if row.kind == "comparison":
            return self._attempt_comparison(row)
        if row.attempts >= self._max_attempts:  # max_attempts lowered since it was scheduled
            self._store.reschedule(
                row.id, row.attempts, None, row.last_error or "max attempts reached"
            )
            return False
        if not callback_allowed(row.url, self._allow_list):
            # Not retried: it would not become allowed without a restart with a new list.
            log.warning("callback %s to %s is not on the allow-list; dropped", row.id, row.url)
            self._store.reschedule(
                row.id, row.attempts + 1, None, "callback URL not on the allow-list at send time"
            )
            return False
        try:
            target, extra, extensions = pin(row.url, self._allow_list, self._resolver)
        except AddressRefused as exc:
            # Retried: DNS may change back; given up after max_attempts like any failure.
            log.warning("callback %s: %s", row.id, exc)
            self._fail(row, f"refused: {exc}")
            return False
        error = self._post(row, target, extra, extensions)
        if error is None:
            self._store.mark_delivered(row.id, self._clock())
            return True
        self._fail(row, error)
        return False

    def _fail(self, row: OutboxRow, error: str) -> None:
        attempts = row.attempts + 1
        if attempts >= self._max_attempts:
            log.warning(
                "callback %s to %s given up after %d attempts: %s", row.id, row.url, attempts, error
            )
            self._store.reschedule(row.id, attempts, None, error)
        else:
            retry_at = self._clock() + self._backoff(attempts)
            self._store.reschedule(row.id, attempts, retry_at, error)

    # -- the service round trip -------------------------------------------------------------

    def _attempt_comparison(self, row: OutboxRow) -> bool:
        """POST the report to the service's ``/v1/comparisons``. A 2xx hands the body to
        ``on_comparison`` (which stores it and enqueues the callback in one transaction); a 4xx
        other than 408/429 is final (the service will not change its mind); anything else is
        retried with backoff until ``comparison_max_attempts``, then handed over as an
        error, so the callback is sent without a comparison rather than never."""
        settle = self._on_comparison
        if settle is None:
            self._store.reschedule(row.id, row.attempts + 1, None, "no comparison handler")
            return False
        if not callback_allowed(row.url, self._service_allow_list):
            settle(row, None, "service URL not on the agent's service allow-list at send time")
            return False
        try:
            target, extra, extensions = pin(row.url, self._service_allow_list, self._resolver)
        except AddressRefused as exc:
            settle(row, None, f"service URL refused: {exc}")
            return False
        body, error, final = self._post_comparison(row, target, extra, extensions)
        if body is not None:
            settle(row, body, None)
            return True
        attempts = row.attempts + 1
        if final or attempts >= self._comparison_max_attempts:
            settle(row, None, f"{error} (after {attempts} attempt(s))")
        else:
            self._store.reschedule(
                row.id, attempts, self._clock() + self._backoff(attempts), error or "failed"
            )
        return False

    def _post_comparison(
        self,
        row: OutboxRow,
        target: httpx.URL,
        extra: dict[str, str],
        extensions: dict[str, str],
    ) -> tuple[str | None, str | None, bool]:
        """(answer body, error, whether the error is final)."""
        try:
            response = self._client.post(
                target,
                content=row.payload.encode("utf-8"),
                headers={"content-type": "application/json", **extra},
                extensions=extensions,
            )
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, (False)
        if response.is_success:
            if len(response.content) > _MAX_COMPARISON_BYTES:
                return None, f"comparison larger than {_MAX_COMPARISON_BYTES} bytes", True
            return response.text, None, False
        detail = response.text[:500]
        final = 400 <= response.status_code < 500 and response.status_code not in (408, 429)
        return None, f"HTTP {response.status_code}: {detail}", final

    def _post(
        self,
        row: OutboxRow,
        target: httpx.URL,
        extra: dict[str, str],
        extensions: dict[str, str],
    ) -> str | None:
        """Send once; None on a 2xx, else why not."""
        body = row.payload.encode("utf-8")
        timestamp = int(self._clock())
        headers = {
            "content-type": "application/json",
            "webhook-id": row.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self._key, row.id, timestamp, body),
            **extra,
        }
        request = self._client.build_request(
            "POST", target, content=body, headers=headers, extensions=extensions
        )
        try:
            response = self._client.send(request, stream=True)  # status only; body unread
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        response.close()
        if response.is_success:
            return None
        if response.is_redirect:
            location = response.headers.get("location", "")
            return f"HTTP {response.status_code} redirect to {location!r} (not followed)"
        return f"HTTP {response.status_code}"
