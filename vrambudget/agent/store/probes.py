"""The probes' operations: create, compare-and-set transitions, pages, recovery at startup, and
the terminal transitions that enqueue their callback in the same transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection

import msgspec

from .cursor import _decode_cursor, _encode_cursor
from .outbox import _Outbox
from .rows import ACTIVE_STATUSES, TERMINAL_STATUSES, Callback, ProbeRow, ProbeStatus, _check_status
from .schema import _OUTBOX_COLUMNS, _PROBE_COLUMNS, _outbox, _probe

__all__ = ["Store"]


class Store(_Outbox):
    """The agent's SQLite file: open it once per process, share it between threads."""

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
        sql = (
            "UPDATE probes SET status = ?, updated_at = ?, result = COALESCE(?, result), "
            "error = COALESCE(?, error) WHERE id = ?"
        )
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

    def succeeded_on_device(self, device_key: str, limit: int) -> list[ProbeRow]:
        """The newest ``limit`` succeeded probes of a device, newest first (the observed
        headroom compares a probe with earlier ones of the same workload)."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_PROBE_COLUMNS} FROM probes WHERE device_key = ? AND status = "
                "'succeeded' AND result IS NOT NULL ORDER BY created_at DESC, id DESC LIMIT ?",
                (device_key, limit),
            ).fetchall()
        return [_probe(r) for r in rows]

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
        reap_engine: Callable[[str], None] | None = None,
    ) -> list[str]:
        """At startup: every probe still ``queued`` or ``running`` belonged to a process that is
        gone, so it becomes ``interrupted`` (finished results are untouched). Returns their ids,
        oldest first.

        ``callback_for`` (optional) is asked, for each interrupted probe's updated row, which
        callback to enqueue; its outbox rows go in the same transaction, so a crash during
        recovery cannot leave an interrupted probe whose caller is never told.

        ``reap_engine`` (optional) is given the stored engine group (JSON text,
        :meth:`set_engine_group`) of each such probe that had started one, before the probe is
        marked: it stops what the earlier agent process left running.
        """
        with self._write() as conn:
            if reap_engine is not None:
                for (group,) in conn.execute(
                    "SELECT engine_group FROM probes WHERE status IN (?, ?) "
                    "AND engine_group IS NOT NULL ORDER BY created_at, id",
                    (ProbeStatus.QUEUED.value, ProbeStatus.RUNNING.value),
                ).fetchall():
                    reap_engine(group)
            rows = conn.execute(
                f"SELECT {_PROBE_COLUMNS} FROM probes WHERE status IN (?, ?) "
                "ORDER BY created_at, id",
                (ProbeStatus.QUEUED.value, ProbeStatus.RUNNING.value),
            ).fetchall()
            ids: list[str] = []
            for row in rows:
                probe = _probe(row)
                error = f"the agent stopped while the probe was {probe.status}"
                self._transition(
                    conn, probe.id, ProbeStatus.INTERRUPTED.value, now, None, error, ACTIVE_STATUSES
                )
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
                conn.execute(
                    "UPDATE probes SET comparison_error = ? WHERE id = ?",
                    (comparison_error, probe_id),
                )
            if comparison is not None:
                # The callback waits for the comparison (complete_comparison enqueues it).
                self._enqueue(conn, probe_id, comparison, now, kind="comparison")
            elif callback is not None:
                self._enqueue(conn, probe_id, callback, now)
        return True

    def set_engine_group(self, probe_id: str, group_json: str | None) -> None:
        """The process group of the engine the probe's child started (JSON text), or None."""
        with self._write() as conn:
            conn.execute("UPDATE probes SET engine_group = ? WHERE id = ?", (group_json, probe_id))

    def set_estimate(self, probe_id: str, estimate_json: str | None, error: str | None) -> None:
        """The service's estimate fetched before the run (or why it could not be)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE probes SET estimate = ?, estimate_error = ? WHERE id = ?",
                (estimate_json, error, probe_id),
            )

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
            row = conn.execute(
                f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE id = ?", (event_id,)
            ).fetchone()
            if row is None:
                return False
            ob = _outbox(row)
            if ob.delivered_at is not None or ob.kind != "comparison":
                return False
            if comparison_json is not None:
                conn.execute(
                    "UPDATE outbox SET delivered_at = ?, attempts = attempts + 1, "
                    "last_error = NULL WHERE id = ?",
                    (now, event_id),
                )
            else:
                conn.execute(
                    "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = NULL, "
                    "last_error = ? WHERE id = ?",
                    (error, event_id),
                )
            conn.execute(
                "UPDATE probes SET comparison = ?, comparison_error = ? WHERE id = ?",
                (comparison_json, error, ob.probe_id),
            )
            probe = conn.execute(
                f"SELECT {_PROBE_COLUMNS} FROM probes WHERE id = ?", (ob.probe_id,)
            ).fetchone()
            callback = callback_for(_probe(probe)) if probe is not None else None
            if callback is not None:
                self._enqueue(conn, ob.probe_id, callback, now)
        return True
