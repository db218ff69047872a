"""The agent's durable state: probes, their results, and the callback outbox, in one SQLite file.

Why SQLite in WAL mode: the agent is one process per GPU host and its state is small (a row per
probe, a row per callback), so a server database would be one more thing to run for nothing.
WAL lets the web handlers read while the probe runner or the deliverer writes, and a process
killed at any instant leaves the file consistent: every committed transaction is there on the
next open, every uncommitted one is gone.

Durability: ``synchronous=FULL``. In WAL mode ``NORMAL`` already survives the *process* being
killed (the WAL pages are in the OS's cache), but a power cut or kernel panic -- not rare on GPU
hosts: Xid faults, preempted spot instances -- may roll back the last commits. The agent
writes a handful of rows per probe, and a probe lasts seconds to minutes, so an fsync per commit
costs nothing measurable, and with it a result the agent has stored (and a callback it has
promised) is on disk before anyone is told about it.

Threading: one connection, opened with ``check_same_thread=False`` and guarded by a lock.
Every operation is a short statement or two (well under a millisecond), callers are few (the
asyncio web handlers, the probe runner, the deliverer thread), and the lock is needed anyway:
two threads sharing a connection would otherwise interleave their statements inside each
other's transactions. A connection per thread would buy parallel reads nobody needs, and leak
a connection per short-lived worker thread that ``close()`` could not reach. Writes use
``BEGIN IMMEDIATE`` so that even another process on the same file (a CLI reading state) cannot
make a compare-and-set lose an update.

Times are Unix seconds (``time.time()``) passed in by the caller: they must mean the same thing
after a restart, which a monotonic clock does not, and tests can pin them.
"""

from __future__ import annotations

import base64
import binascii
import json
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

import msgspec

__all__ = [
    "ACTIVE_STATUSES",
    "SCHEMA_VERSION",
    "TERMINAL_STATUSES",
    "Callback",
    "OutboxRow",
    "ProbeRow",
    "ProbeStatus",
    "SchemaTooNewError",
    "Store",
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


class SchemaTooNewError(RuntimeError):
    """The file was written by a newer agent; opening it with this one could corrupt it."""


# Each entry migrates from version i to i + 1; never edit one that has shipped, append.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE probes (
            id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            status TEXT NOT NULL,
            device_key TEXT NOT NULL,
            request TEXT NOT NULL,
            result TEXT,
            error TEXT
        )""",
        "CREATE INDEX probes_by_time ON probes (created_at, id)",
        "CREATE INDEX probes_by_status ON probes (status)",
        """CREATE TABLE outbox (
            id TEXT PRIMARY KEY,
            probe_id TEXT NOT NULL REFERENCES probes (id),
            url TEXT NOT NULL,
            payload TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at REAL,
            delivered_at REAL,
            last_error TEXT,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE delivered_at IS NULL",
    ),
    (
        # The service round trip (issue 5): the estimate fetched before the run, the
        # comparison posted after it; outbox rows are callbacks or comparison requests.
        "ALTER TABLE probes ADD COLUMN estimate TEXT",
        "ALTER TABLE probes ADD COLUMN estimate_error TEXT",
        "ALTER TABLE probes ADD COLUMN comparison TEXT",
        "ALTER TABLE probes ADD COLUMN comparison_error TEXT",
        "ALTER TABLE outbox ADD COLUMN kind TEXT NOT NULL DEFAULT 'callback'",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)

_PROBE_COLUMNS = ("id, created_at, updated_at, status, device_key, request, result, error, "
                  "estimate, estimate_error, comparison, comparison_error")
_OUTBOX_COLUMNS = (
    "id, probe_id, url, payload, attempts, next_attempt_at, delivered_at, last_error, created_at, "
    "kind"
)
_PENDING = "delivered_at IS NULL AND next_attempt_at IS NOT NULL"


def _probe(row: Any) -> ProbeRow:
    (id_, created_at, updated_at, status, device_key, request, result, error, estimate,
     estimate_error, comparison, comparison_error) = row
    return ProbeRow(id=id_, created_at=created_at, updated_at=updated_at, status=status,
                    device_key=device_key, request=request, result=result, error=error,
                    estimate=estimate, estimate_error=estimate_error, comparison=comparison,
                    comparison_error=comparison_error)


def _outbox(row: Any) -> OutboxRow:
    (id_, probe_id, url, payload, attempts, next_at, delivered_at, last_error, created_at,
     kind) = row
    return OutboxRow(id=id_, probe_id=probe_id, url=url, payload=payload, attempts=attempts,
                     next_attempt_at=next_at, delivered_at=delivered_at, last_error=last_error,
                     created_at=created_at, kind=kind)


def _check_status(status: str) -> None:
    if status not in _ALL_STATUSES:
        raise ValueError(f"unknown probe status {status!r}")


def _encode_cursor(row: ProbeRow) -> str:
    raw = json.dumps([row.created_at, row.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, probe_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValueError(f"invalid page cursor {cursor!r}") from exc
    ok = isinstance(created_at, int | float) and not isinstance(created_at, bool)
    if not (ok and isinstance(probe_id, str)):
        raise ValueError(f"invalid page cursor {cursor!r}")
    return float(created_at), probe_id


class Store:
    """The agent's SQLite file: open it once per process, share it between threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        # isolation_level=None: no implicit transactions; _write() says BEGIN IMMEDIATE itself.
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=10.0
        )
        try:
            self._configure()
            self._migrate()
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    # -- connection -------------------------------------------------------------------------

    def _configure(self) -> None:
        conn = self._db()
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            # e.g. a file system without shared memory: refuse rather than run less safe.
            raise RuntimeError(f"SQLite refused WAL mode for {self.path} (got {mode!r})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")

    def _migrate(self) -> None:
        with self._write() as conn:
            # Read inside the write transaction: two processes opening a fresh file at once
            # must not both run migration 0.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SchemaTooNewError(
                    f"{self.path} has schema version {version}; this agent knows up to "
                    f"{SCHEMA_VERSION}"
                )
            for statements in _MIGRATIONS[version:]:
                for statement in statements:
                    conn.execute(statement)
            # user_version lives in the file header and is part of this transaction.
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION:d}")

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the store is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._db()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # Also when COMMIT itself failed (busy, disk full): never leave the shared
                # connection inside a transaction the next caller would silently join.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._db()

    def close(self) -> None:
        """Close the connection; later calls raise. Closing the last connection checkpoints
        the WAL into the main file. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- probes -----------------------------------------------------------------------------

    def create_probe(self, probe_id: str, request_json: str, device_key: str, now: float) -> None:
        """Store a new probe as ``queued``. A duplicate id raises ``sqlite3.IntegrityError``."""
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO probes ({_PROBE_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, NULL, NULL, NULL, NULL)",
                (probe_id, now, now, ProbeStatus.QUEUED.value, device_key, request_json),
            )

    def transition(
        self,
        probe_id: str,
        status: str,
        now: float,
        *,
        result_json: str | None = None,
        error: str | None = None,
        expected: Collection[str] | None = None,
    ) -> bool:
        """Set a probe's status (and result / error when given; None leaves them as they are).

        With ``expected``, the update happens only if the current status is one of them, in a
        single ``UPDATE ... WHERE status IN (...)``: of a cancel and a completion racing, exactly
        one sees ``True``. Returns whether the row changed (False also for an unknown id).
        """
        _check_status(status)
        with self._write() as conn:
            return self._transition(conn, probe_id, status, now, result_json, error, expected)

    @staticmethod
    def _transition(
        conn: sqlite3.Connection,
        probe_id: str,
        status: str,
        now: float,
        result_json: str | None,
        error: str | None,
        expected: Collection[str] | None,
    ) -> bool:
        sql = ("UPDATE probes SET status = ?, updated_at = ?, result = COALESCE(?, result), "
               "error = COALESCE(?, error) WHERE id = ?")
        params: list[object] = [status, now, result_json, error, probe_id]
        if expected is not None:
            wanted = sorted(expected)
            for s in wanted:
                _check_status(s)
            if not wanted:
                return False
            sql += f" AND status IN ({', '.join('?' * len(wanted))})"
            params += wanted
        return conn.execute(sql, params).rowcount == 1

    def get_probe(self, probe_id: str) -> ProbeRow | None:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {_PROBE_COLUMNS} FROM probes WHERE id = ?", (probe_id,)
            ).fetchone()
        return None if row is None else _probe(row)

    def list_probes(
        self, limit: int, after: str | None = None
    ) -> tuple[list[ProbeRow], str | None]:
        """One page of probes, **newest first** (what an operator looking at a host wants),
        ordered by ``(created_at, id)`` descending.

        Keyset pagination: ``after`` is the opaque cursor returned with the previous page, so a
        page never repeats or skips a probe when new ones arrive meanwhile (they sort before
        the cursor). The returned cursor is None on the last page. A malformed cursor raises
        ``ValueError`` (the API answers 400).
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        sql = f"SELECT {_PROBE_COLUMNS} FROM probes"
        params: list[object] = []
        if after is not None:
            created_at, probe_id = _decode_cursor(after)
            sql += " WHERE (created_at, id) < (?, ?)"
            params += [created_at, probe_id]
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        params.append(limit + 1)
        with self._read() as conn:
            rows = [_probe(r) for r in conn.execute(sql, params).fetchall()]
        if len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        return rows, _encode_cursor(rows[-1])

    def recover(
        self,
        now: float,
        *,
        callback_for: Callable[[ProbeRow], Callback | None] | None = None,
    ) -> list[str]:
        """At startup: every probe still ``queued`` or ``running`` belonged to a process that is
        gone, so it becomes ``interrupted`` (finished results are untouched). Returns their ids,
        oldest first.

        ``callback_for`` (optional) is asked, for each interrupted probe's updated row, which
        callback to enqueue; its outbox rows go in the same transaction, so a crash during
        recovery cannot leave an interrupted probe whose caller is never told.
        """
        with self._write() as conn:
            rows = conn.execute(
                f"SELECT {_PROBE_COLUMNS} FROM probes WHERE status IN (?, ?) "
                "ORDER BY created_at, id",
                (ProbeStatus.QUEUED.value, ProbeStatus.RUNNING.value),
            ).fetchall()
            ids: list[str] = []
            for row in rows:
                probe = _probe(row)
                error = f"the agent stopped while the probe was {probe.status}"
                self._transition(conn, probe.id, ProbeStatus.INTERRUPTED.value, now, None, error,
                                 ACTIVE_STATUSES)
                ids.append(probe.id)
                if callback_for is not None:
                    updated = msgspec.structs.replace(
                        probe, status=ProbeStatus.INTERRUPTED.value, updated_at=now, error=error
                    )
                    callback = callback_for(updated)
                    if callback is not None:
                        self._enqueue(conn, probe.id, callback, now)
        return ids

    def finish_with_callback(
        self,
        probe_id: str,
        status: str,
        now: float,
        result_json: str | None,
        callback: Callback | None,
        error: str | None = None,
        *,
        expected: Collection[str] = ACTIVE_STATUSES,
        comparison: Callback | None = None,
        comparison_error: str | None = None,
    ) -> bool:
        """Move a probe to a terminal status, store its result, and enqueue its callback, in
        ONE transaction: after a crash at any instant either both are on disk or neither is, so
        a finished probe can never lack its outbox row.

        The status change is a compare-and-set against ``expected`` (by default: still queued
        or running). Returns False, and enqueues nothing, when it lost (e.g. a cancel came
        first). A duplicate ``event_id`` raises ``sqlite3.IntegrityError`` and changes nothing.
        """
        _check_status(status)
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"{status!r} is not a terminal status")
        with self._write() as conn:
            if not self._transition(conn, probe_id, status, now, result_json, error, expected):
                return False
            if comparison_error is not None:
                conn.execute("UPDATE probes SET comparison_error = ? WHERE id = ?",
                             (comparison_error, probe_id))
            if comparison is not None:
                # The callback waits for the comparison (complete_comparison enqueues it).
                self._enqueue(conn, probe_id, comparison, now, kind="comparison")
            elif callback is not None:
                self._enqueue(conn, probe_id, callback, now)
        return True

    def set_estimate(self, probe_id: str, estimate_json: str | None, error: str | None) -> None:
        """The service's estimate fetched before the run (or why it could not be)."""
        with self._write() as conn:
            conn.execute("UPDATE probes SET estimate = ?, estimate_error = ? WHERE id = ?",
                         (estimate_json, error, probe_id))

    def complete_comparison(
        self,
        event_id: str,
        now: float,
        comparison_json: str | None,
        error: str | None,
        callback_for: Callable[[ProbeRow], Callback | None],
    ) -> bool:
        """A comparison row is done (the service answered, or it was given up): in ONE
        transaction store the comparison (or the error) on the probe, settle the outbox row, and
        enqueue the probe's callback, built by ``callback_for`` from the updated probe. False if
        the row is unknown or already settled."""
        with self._write() as conn:
            row = conn.execute(f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE id = ?",
                               (event_id,)).fetchone()
            if row is None:
                return False
            ob = _outbox(row)
            if ob.delivered_at is not None or ob.kind != "comparison":
                return False
            if comparison_json is not None:
                conn.execute("UPDATE outbox SET delivered_at = ?, attempts = attempts + 1, "
                             "last_error = NULL WHERE id = ?", (now, event_id))
            else:
                conn.execute("UPDATE outbox SET attempts = attempts + 1, next_attempt_at = NULL, "
                             "last_error = ? WHERE id = ?", (error, event_id))
            conn.execute("UPDATE probes SET comparison = ?, comparison_error = ? WHERE id = ?",
                         (comparison_json, error, ob.probe_id))
            probe = conn.execute(f"SELECT {_PROBE_COLUMNS} FROM probes WHERE id = ?",
                                 (ob.probe_id,)).fetchone()
            callback = callback_for(_probe(probe)) if probe is not None else None
            if callback is not None:
                self._enqueue(conn, ob.probe_id, callback, now)
        return True

    # -- outbox -----------------------------------------------------------------------------

    @staticmethod
    def _enqueue(conn: sqlite3.Connection, probe_id: str, callback: Callback, now: float,
                 kind: str = "callback") -> None:
        url, payload, event_id = callback
        conn.execute(
            f"INSERT INTO outbox ({_OUTBOX_COLUMNS}) VALUES (?, ?, ?, ?, 0, ?, NULL, NULL, ?, ?)",
            (event_id, probe_id, url, payload, now, now, kind),
        )

    def due_callbacks(self, now: float, limit: int) -> list[OutboxRow]:
        """Undelivered, not given up, due by ``now``; earliest due first. There is one
        deliverer per agent, so rows are not claimed: a second deliverer on the same file would
        send duplicates (still correct under at-least-once, receivers dedupe on the id)."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE {_PENDING} AND next_attempt_at <= ? "
                "ORDER BY next_attempt_at, created_at, id LIMIT ?",
                (now, limit),
            ).fetchall()
        return [_outbox(r) for r in rows]

    def next_attempt_at(self) -> float | None:
        """When the earliest pending callback is due (None: nothing pending), so the deliverer
        can sleep exactly that long instead of polling."""
        with self._read() as conn:
            row = conn.execute(f"SELECT MIN(next_attempt_at) FROM outbox WHERE {_PENDING}")
            value = row.fetchone()[0]
        return None if value is None else float(value)

    def get_callback(self, event_id: str) -> OutboxRow | None:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE id = ?", (event_id,)
            ).fetchone()
        return None if row is None else _outbox(row)

    def mark_delivered(self, event_id: str, now: float) -> bool:
        """Record a 2xx (the successful attempt counts in ``attempts``). False if the row is
        unknown or was already delivered."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE outbox SET delivered_at = ?, attempts = attempts + 1, last_error = NULL "
                "WHERE id = ? AND delivered_at IS NULL",
                (now, event_id),
            )
            return cur.rowcount == 1

    def reschedule(
        self, event_id: str, attempts: int, next_attempt_at: float | None, error: str
    ) -> bool:
        """Record a failed attempt. ``next_attempt_at=None`` gives up: the row stays, with
        ``last_error``, but is no longer due or pending."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE outbox SET attempts = ?, next_attempt_at = ?, last_error = ? "
                "WHERE id = ? AND delivered_at IS NULL",
                (attempts, next_attempt_at, error, event_id),
            )
            return cur.rowcount == 1

    def pending_count(self) -> int:
        """Outbox rows (callbacks and comparison requests) still to be delivered (not delivered,
        not given up): a /metrics gauge."""
        with self._read() as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM outbox WHERE {_PENDING}").fetchone()[0])
