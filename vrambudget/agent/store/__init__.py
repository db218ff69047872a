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

Modules: ``rows`` (probe statuses and the rows read back), ``schema`` (the migrations and the
column lists), ``cursor`` (the page cursor), ``connection`` (opening, migrating, transactions),
``outbox`` (the callback outbox) and ``probes`` (:class:`Store`, the probes' operations).
"""

from __future__ import annotations

from .probes import Store
from .rows import ACTIVE_STATUSES, TERMINAL_STATUSES, Callback, OutboxRow, ProbeRow, ProbeStatus
from .schema import SCHEMA_VERSION, SchemaTooNewError, StoreOpenError

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
    "StoreOpenError",
]
