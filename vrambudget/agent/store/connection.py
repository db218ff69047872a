"""The one SQLite connection: opened in WAL mode, migrated, guarded by a lock; writes are
``BEGIN IMMEDIATE`` transactions (:mod:`vrambudget.agent.store` says why)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from .schema import _MIGRATIONS, SCHEMA_VERSION, SchemaTooNewError, StoreOpenError

_MOVE_IT = "move it away to start with no history, or restore it from a backup"


class _Connection:
    """The connection half of :class:`~vrambudget.agent.store.probes.Store`."""

    def __init__(self, path: Path) -> None:
        """Open (or create) the store. An existing file is integrity-checked first; an empty
        (0-byte), non-SQLite or corrupt one raises :class:`StoreOpenError` naming the path and
        is left as it is -- never silently replaced, which would drop its history."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        existed = path.exists()
        if existed and path.stat().st_size == 0:
            raise StoreOpenError(
                f"{path} is empty (0 bytes), not an agent database; refusing to start over it: "
                f"{_MOVE_IT}"
            )
        # isolation_level=None: no implicit transactions; _write() says BEGIN IMMEDIATE itself.
        try:
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=10.0
            )
        except sqlite3.Error as exc:
            raise StoreOpenError(f"{path} cannot be opened: {exc}") from None
        try:
            if existed:
                self._check_integrity()
            self._configure()
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            self._conn = None
            raise StoreOpenError(
                f"{path} is not a usable agent database ({exc}): {_MOVE_IT}"
            ) from None
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _check_integrity(self) -> None:
        """``PRAGMA integrity_check`` over the whole file (a few ms for an agent's history):
        a corrupt page found now, not by a later query failing as "malformed"."""
        rows = self._db().execute("PRAGMA integrity_check(20)").fetchall()
        problems = [str(r[0]) for r in rows if str(r[0]).lower() != "ok"]
        if problems:
            raise StoreOpenError(
                f"{self.path} failed SQLite's integrity check ({'; '.join(problems)[:1000]}): "
                f"{_MOVE_IT}"
            )

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
