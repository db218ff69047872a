"""Resolved checkpoints kept in memory: bounded, thread-safe, one fetch per key at a time."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from vrambudget.hub.errors import HubError
from vrambudget.hub.names import is_commit_sha
from vrambudget.hub.remote import fetch
from vrambudget.hub.resolved import ResolvedCheckpoint
from vrambudget.hub.settings import HubSettings

__all__ = ["DEFAULT_TTL_S", "Fetcher", "HubCache"]

DEFAULT_TTL_S = 300.0

Fetcher = Callable[..., ResolvedCheckpoint]
"""``fetcher(repo_id, revision, *, settings=...)``, as :func:`vrambudget.hub.fetch`."""

_Key = tuple[str, str, str | None]


@dataclass(slots=True)
class _Entry:
    value: ResolvedCheckpoint
    expires: float | None
    """Clock reading after which the entry is stale; ``None``: never (a commit id)."""


@dataclass(slots=True)
class _Flight:
    """One fetch in progress; callers asking for the same key wait on ``done``."""

    done: threading.Event = field(default_factory=threading.Event)
    value: ResolvedCheckpoint | None = None
    error: BaseException | None = None


class HubCache:
    """Bounded (entries), thread-safe, single-flight (concurrent gets of the same key wait for
    one fetch). Keyed by (endpoint, repo_id, revision). A revision that is a 40-hex commit id
    names immutable content and is kept until evicted; a branch or tag name (or ``None``, the
    default branch) expires after ``ttl_s`` so a moved branch is seen again. Failures are not
    cached: callers that waited on a failed fetch get its error, the next call fetches again.
    Least recently used entries are evicted beyond ``max_entries``.

    Entries are bounded by count, not bytes: a checkpoint of DeepSeek-V3's size holds ~91,000
    ``StoredTensor`` (tens of MB); size ``max_entries`` for the largest checkpoints served.
    """

    def __init__(
        self,
        settings: HubSettings,
        *,
        max_entries: int = 256,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        fetcher: Fetcher = fetch,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if not ttl_s > 0:
            raise ValueError("ttl_s must be positive")
        self._settings = settings
        self._endpoint = settings.resolved_endpoint
        self._max = max_entries
        self._ttl = ttl_s
        self._clock = clock
        self._fetcher = fetcher
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self._flights: dict[_Key, _Flight] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def peek(self, repo_id: str, revision: str | None) -> ResolvedCheckpoint | None:
        """The cached checkpoint if it is fresh (a commit's, or a branch's younger than the
        TTL), else ``None``: what :meth:`get` would return without fetching. Never fetches and
        never waits for a fetch in flight -- the lock guards dict operations only -- so an event
        loop may call it; on ``None``, call :meth:`get` in a thread."""
        key: _Key = (self._endpoint, repo_id, revision)
        with self._lock:
            return self._fresh(key)

    def get(self, repo_id: str, revision: str | None) -> ResolvedCheckpoint:
        """The cached checkpoint, or the one a fetch (this call's or a concurrent one's)
        returns. Raises what the fetch raises (``HubError``)."""
        key: _Key = (self._endpoint, repo_id, revision)
        with self._lock:
            fresh = self._fresh(key)
            if fresh is not None:
                return fresh
            self._entries.pop(key, None)  # stale
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
        if not leader:
            return self._wait(flight)
        try:
            value = self._fetcher(repo_id, revision, settings=self._settings)
        except BaseException as exc:
            with self._lock:
                del self._flights[key]
            flight.error = exc
            flight.done.set()
            raise
        with self._lock:
            expires = None if is_commit_sha(revision) else self._clock() + self._ttl
            self._entries[key] = _Entry(value=value, expires=expires)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
            del self._flights[key]
        flight.value = value
        flight.done.set()
        return value

    def _fresh(self, key: _Key) -> ResolvedCheckpoint | None:
        """The entry's value if it has not expired (made the most recently used); the lock is
        held."""
        entry = self._entries.get(key)
        if entry is None or (entry.expires is not None and self._clock() >= entry.expires):
            return None
        self._entries.move_to_end(key)
        return entry.value

    def clear(self) -> None:
        """Forget every entry (fetches in flight still complete and are stored)."""
        with self._lock:
            self._entries.clear()

    @staticmethod
    def _wait(flight: _Flight) -> ResolvedCheckpoint:
        flight.done.wait()
        if flight.error is not None:
            error = flight.error
            if isinstance(error, HubError):
                # A fresh instance per waiter: one exception object raised in many threads
                # would share (and grow) one traceback.
                raise HubError(error.kind, error.field, error.message) from error.__cause__
            raise error
        assert flight.value is not None
        return flight.value
