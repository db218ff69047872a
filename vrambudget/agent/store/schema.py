"""The file's schema: the migrations (``PRAGMA user_version`` counts them), the column lists, and
rows decoded into :mod:`~vrambudget.agent.store.rows` records."""

from __future__ import annotations

from typing import Any

from .rows import OutboxRow, ProbeRow

__all__ = ["SCHEMA_VERSION", "SchemaTooNewError", "StoreOpenError"]


class StoreOpenError(RuntimeError):
    """The file cannot be used as the agent's store (empty, not SQLite, corrupt); the message
    names its path. The agent refuses to start rather than replace or half-use it."""


class SchemaTooNewError(StoreOpenError):
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
    (
        # An engine probe's process group (engine.group.EngineGroup as JSON), stored when its
        # child started the engine: an agent restarting after a crash stops what is left.
        "ALTER TABLE probes ADD COLUMN engine_group TEXT",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)

_PROBE_COLUMNS = (
    "id, created_at, updated_at, status, device_key, request, result, error, "
    "estimate, estimate_error, comparison, comparison_error"
)
_OUTBOX_COLUMNS = (
    "id, probe_id, url, payload, attempts, next_attempt_at, delivered_at, last_error, created_at, "
    "kind"
)
_PENDING = "delivered_at IS NULL AND next_attempt_at IS NOT NULL"


def _probe(row: Any) -> ProbeRow:
    (
        id_,
        created_at,
        updated_at,
        status,
        device_key,
        request,
        result,
        error,
        estimate,
        estimate_error,
        comparison,
        comparison_error,
    ) = row
    return ProbeRow(
        id=id_,
        created_at=created_at,
        updated_at=updated_at,
        status=status,
        device_key=device_key,
        request=request,
        result=result,
        error=error,
        estimate=estimate,
        estimate_error=estimate_error,
        comparison=comparison,
        comparison_error=comparison_error,
    )


def _outbox(row: Any) -> OutboxRow:
    (id_, probe_id, url, payload, attempts, next_at, delivered_at, last_error, created_at, kind) = (
        row
    )
    return OutboxRow(
        id=id_,
        probe_id=probe_id,
        url=url,
        payload=payload,
        attempts=attempts,
        next_attempt_at=next_at,
        delivered_at=delivered_at,
        last_error=last_error,
        created_at=created_at,
        kind=kind,
    )
