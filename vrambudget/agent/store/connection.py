"""The one SQLite connection: opened in WAL mode, migrated, guarded by a lock; writes are
``BEGIN IMMEDIATE`` transactions (:mod:`vrambudget.agent.store` says why)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from .schema import _MIGRATIONS, SCHEMA_VERSION, SchemaTooNewError


class _Connection:
    """The connection half of :class:`~vrambudget.agent.store.probes.Store`."""

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
