"""The callback outbox: rows enqueued with a probe's terminal transition, drained by the
deliverer (due, delivered, rescheduled or given up)."""

from __future__ import annotations

import sqlite3

from .connection import _Connection
from .rows import Callback, OutboxRow
from .schema import _OUTBOX_COLUMNS, _PENDING, _outbox


class _Outbox(_Connection):
    """The outbox half of :class:`~vrambudget.agent.store.probes.Store`."""

    # -- outbox -----------------------------------------------------------------------------

    @staticmethod
    def _enqueue(
        conn: sqlite3.Connection,
        probe_id: str,
        callback: Callback,
        now: float,
        kind: str = "callback",
    ) -> None:
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
