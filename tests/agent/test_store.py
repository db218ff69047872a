"""The agent's SQLite store: WAL and durability settings, schema versioning, compare-and-set
transitions, keyset pagination, crash recovery (a real process killed with its connection
open) and the result + callback transaction."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.support import ROOT
from vrambudget.agent.store import (
    ACTIVE_STATUSES,
    SCHEMA_VERSION,
    TERMINAL_STATUSES,
    ProbeStatus,
    SchemaTooNewError,
    Store,
)

T0 = 1_700_000_000.0

REQ = json.dumps({"workload": {"kind": "inference"}})


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "agent.sqlite3"


@pytest.fixture
def store(db: Path):
    s = Store(db)
    yield s
    s.close()


def _raw(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(db)


# -- settings and schema ---------------------------------------------------------------------


def test_wal_mode_full_sync_and_schema_version(store: Store, db: Path) -> None:
    conn = store._db()  # the store's own connection: synchronous is per connection
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    other = _raw(db)  # WAL is a property of the file: a fresh connection sees it too
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    tables = {r[0] for r in other.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"probes", "outbox"} <= tables
    other.close()


def test_reopening_keeps_data_and_does_not_migrate_again(db: Path) -> None:
    with Store(db) as s:
        s.create_probe("p1", REQ, "gpu0", T0)
    with Store(db) as s:
        row = s.get_probe("p1")
        assert row is not None and row.request == REQ and row.status == "queued"


def test_a_newer_schema_is_refused(db: Path) -> None:
    Store(db).close()
    conn = _raw(db)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNewError):
        Store(db)


def test_closed_store_raises(db: Path) -> None:
    s = Store(db)
    s.close()
    s.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        s.get_probe("x")


def test_statuses_partition() -> None:
    assert {"queued", "running"} == ACTIVE_STATUSES
    assert {s.value for s in ProbeStatus} == ACTIVE_STATUSES | TERMINAL_STATUSES
    assert not ACTIVE_STATUSES & TERMINAL_STATUSES
    assert all(member.__doc__ for member in ProbeStatus)


# -- probes ----------------------------------------------------------------------------------


def test_create_and_get(store: Store) -> None:
    store.create_probe("p1", REQ, "GPU-1234", T0)
    row = store.get_probe("p1")
    assert row is not None
    assert (row.id, row.status, row.device_key, row.created_at, row.updated_at) == (
        "p1",
        "queued",
        "GPU-1234",
        T0,
        T0,
    )
    assert row.result is None and row.error is None
    assert store.get_probe("nope") is None
    with pytest.raises(sqlite3.IntegrityError):
        store.create_probe("p1", REQ, "GPU-1234", T0)


def test_transition_compare_and_set(store: Store) -> None:
    store.create_probe("p1", REQ, "gpu0", T0)
    assert store.transition("p1", "running", T0 + 1, expected={"queued"})
    assert not store.transition("p1", "running", T0 + 2, expected={"queued"})  # already moved
    assert store.transition(
        "p1", "succeeded", T0 + 3, result_json='{"peak": 1}', expected=ACTIVE_STATUSES
    )
    # A late cancel loses and changes nothing.
    assert not store.transition(
        "p1", "cancelled", T0 + 4, error="by user", expected=ACTIVE_STATUSES
    )
    row = store.get_probe("p1")
    assert row is not None
    assert (row.status, row.result, row.error, row.updated_at) == (
        "succeeded",
        '{"peak": 1}',
        None,
        T0 + 3,
    )
    # Without expected it is unconditional; None leaves result and error as they were.
    assert store.transition("p1", "failed", T0 + 5, error="boom")
    row = store.get_probe("p1")
    assert row is not None and (row.status, row.result, row.error) == (
        "failed",
        '{"peak": 1}',
        "boom",
    )
    assert not store.transition("missing", "failed", T0)
    assert not store.transition("p1", "failed", T0, expected=set())
    with pytest.raises(ValueError, match="unknown probe status"):
        store.transition("p1", "exploded", T0)
    with pytest.raises(ValueError, match="unknown probe status"):
        store.transition("p1", "failed", T0, expected={"exploded"})


def test_a_cancel_racing_a_completion_is_decided_once(store: Store) -> None:
    """Many threads try to finish the same probe at once; the CAS lets exactly one win."""
    for i in range(20):
        store.create_probe(f"p{i}", REQ, "gpu0", T0 + i)
        store.transition(f"p{i}", "running", T0 + i)
    outcomes: list[tuple[str, str, bool]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(status: str) -> None:
        barrier.wait()
        for i in range(20):
            won = store.transition(f"p{i}", status, T0 + 100, expected=ACTIVE_STATUSES)
            with lock:
                outcomes.append((f"p{i}", status, won))

    threads = [threading.Thread(target=worker, args=(s,)) for s in ["cancelled", "succeeded"] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(20):
        winners = [s for p, s, won in outcomes if p == f"p{i}" and won]
        assert len(winners) == 1, winners
        row = store.get_probe(f"p{i}")
        assert row is not None and row.status == winners[0]


def test_concurrent_writers_from_many_threads(store: Store) -> None:
    def worker(n: int) -> None:
        for i in range(25):
            store.create_probe(f"t{n}-{i}", REQ, "gpu0", T0 + i)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows, cursor = store.list_probes(1000)
    assert len(rows) == 200 and cursor is None


def test_list_probes_pages_newest_first_without_gaps_or_repeats(store: Store) -> None:
    # Ties on created_at are broken by id, so equal timestamps still page deterministically.
    ids = []
    for i in range(25):
        pid = f"p{i:02d}"
        store.create_probe(pid, REQ, "gpu0", T0 + i // 3)
        ids.append(pid)
    expected = sorted(ids, key=lambda p: (T0 + int(p[1:]) // 3, p), reverse=True)

    seen: list[str] = []
    cursor: str | None = None
    pages = []
    while True:
        rows, cursor = store.list_probes(10, cursor)
        pages.append(len(rows))
        seen += [r.id for r in rows]
        if cursor is None:
            break
        # A probe created between pages sorts before the cursor: no shift, no repeat.
        if len(pages) == 1:
            store.create_probe("late", REQ, "gpu0", T0 + 1000)
    assert pages == [10, 10, 5]
    assert seen == expected


def test_list_probes_edges(store: Store) -> None:
    assert store.list_probes(5) == ([], None)
    store.create_probe("a", REQ, "gpu0", T0)
    rows, cursor = store.list_probes(1)
    assert [r.id for r in rows] == ["a"] and cursor is None  # exactly one page: no cursor
    with pytest.raises(ValueError):
        store.list_probes(0)
    with pytest.raises(ValueError, match="cursor"):
        store.list_probes(5, "not a cursor!")
    with pytest.raises(ValueError, match="cursor"):
        store.list_probes(5, "WzFd")  # base64 of "[1]": decodes, wrong shape


# -- crash recovery --------------------------------------------------------------------------

_CRASH = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from vrambudget.agent.store import Store
    s = Store(Path(sys.argv[1]))
    s.create_probe("done", "{}", "gpu0", 1.0)
    s.finish_with_callback("done", "succeeded", 2.0, '{"peak": 7}',
                           ("http://127.0.0.1:9/cb", '{"id": "done"}', "evt-done"))
    s.create_probe("running", "{}", "gpu0", 3.0)
    s.transition("running", "running", 4.0)
    s.create_probe("queued", "{}", "gpu0", 5.0)
    print("ready", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close(), no checkpoint, no atexit
""")


def test_recover_after_a_real_crash(db: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH, str(db)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "ready"
    # The committed transactions are in the WAL, not yet checkpointed into the main file.
    assert Path(f"{db}-wal").stat().st_size > 0

    with Store(db) as s:
        assert s.recover(10.0) == ["running", "queued"]  # oldest first
        done = s.get_probe("done")
        assert done is not None and (done.status, done.result) == ("succeeded", '{"peak": 7}')
        for pid in ("running", "queued"):
            row = s.get_probe(pid)
            assert row is not None and row.status == "interrupted" and row.updated_at == 10.0
            assert row.error and "agent stopped" in row.error
        # The callback promised before the crash is still owed.
        due = s.due_callbacks(10.0, 10)
        assert [(c.id, c.probe_id, c.payload) for c in due] == [
            ("evt-done", "done", '{"id": "done"}')
        ]
        assert s.recover(11.0) == []  # idempotent


def test_recover_can_enqueue_callbacks_in_the_same_transaction(store: Store) -> None:
    store.create_probe("r", REQ, "gpu0", T0)
    store.transition("r", "running", T0 + 1)
    store.create_probe("s", REQ, "gpu0", T0 + 2)
    store.finish_with_callback("s", "succeeded", T0 + 3, "{}", None)
    seen = []

    def callback_for(row):
        seen.append((row.id, row.status))
        return ("https://hooks.example.com/cb", json.dumps({"status": row.status}), f"e-{row.id}")

    assert store.recover(T0 + 10, callback_for=callback_for) == ["r"]
    assert seen == [("r", "interrupted")]
    cb = store.get_callback("e-r")
    assert cb is not None and cb.payload == '{"status": "interrupted"}'
    assert cb.next_attempt_at == T0 + 10
    assert store.pending_count() == 1


# -- result + callback in one transaction ----------------------------------------------------


def test_finish_with_callback_writes_both(store: Store) -> None:
    store.create_probe("p", REQ, "gpu0", T0)
    store.transition("p", "running", T0 + 1)
    cb = ("https://hooks.example.com/x", '{"status": "succeeded"}', "evt-1")
    assert store.finish_with_callback("p", "succeeded", T0 + 2, '{"peak": 3}', cb)
    row = store.get_probe("p")
    assert row is not None and (row.status, row.result) == ("succeeded", '{"peak": 3}')
    out = store.get_callback("evt-1")
    assert out is not None
    assert (
        out.probe_id,
        out.url,
        out.payload,
        out.attempts,
        out.next_attempt_at,
        out.delivered_at,
        out.last_error,
        out.created_at,
    ) == ("p", cb[0], cb[1], 0, T0 + 2, None, None, T0 + 2)


def test_finish_that_loses_the_race_enqueues_nothing(store: Store) -> None:
    store.create_probe("p", REQ, "gpu0", T0)
    assert store.transition("p", "cancelled", T0 + 1, expected=ACTIVE_STATUSES)
    cb = ("https://hooks.example.com/x", "{}", "evt-1")
    assert not store.finish_with_callback("p", "succeeded", T0 + 2, "{}", cb)
    assert store.get_callback("evt-1") is None
    row = store.get_probe("p")
    assert row is not None and row.status == "cancelled" and row.result is None


def test_finish_rolls_back_the_result_when_the_outbox_insert_fails(store: Store) -> None:
    """The atomicity, shown: make the outbox insert fail (a duplicate event id) and the status
    change made a statement earlier in the same transaction is undone."""
    for pid in ("a", "b"):
        store.create_probe(pid, REQ, "gpu0", T0)
        store.transition(pid, "running", T0)
    assert store.finish_with_callback(
        "a", "succeeded", T0 + 1, "{}", ("https://h.example.com", "{}", "dup")
    )
    with pytest.raises(sqlite3.IntegrityError):
        store.finish_with_callback(
            "b", "oom", T0 + 2, '{"peak": 9}', ("https://h.example.com", "{}", "dup")
        )
    row = store.get_probe("b")
    assert row is not None and (row.status, row.result) == ("running", None)
    # The store is still usable after the rollback.
    assert store.finish_with_callback("b", "oom", T0 + 3, '{"peak": 9}', None, error="CUDA OOM")
    row = store.get_probe("b")
    assert row is not None and (row.status, row.error) == ("oom", "CUDA OOM")


def test_finish_requires_a_terminal_status(store: Store) -> None:
    store.create_probe("p", REQ, "gpu0", T0)
    with pytest.raises(ValueError, match="terminal"):
        store.finish_with_callback("p", "running", T0, None, None)


# -- outbox ----------------------------------------------------------------------------------


def _probe_with_callback(store: Store, pid: str, now: float) -> None:
    store.create_probe(pid, REQ, "gpu0", now)
    callback = ("https://h.example.com", f'{{"id": "{pid}"}}', f"e-{pid}")
    store.finish_with_callback(pid, "succeeded", now, "{}", callback)


def test_outbox_due_reschedule_deliver_give_up(store: Store) -> None:
    for i, pid in enumerate(["a", "b", "c"]):
        _probe_with_callback(store, pid, T0 + i)
    assert store.pending_count() == 3
    assert store.next_attempt_at() == T0
    assert [c.id for c in store.due_callbacks(T0 + 1, 10)] == ["e-a", "e-b"]
    assert [c.id for c in store.due_callbacks(T0 + 5, 1)] == ["e-a"]

    assert store.reschedule("e-a", 1, T0 + 50, "HTTP 500")
    assert [c.id for c in store.due_callbacks(T0 + 5, 10)] == ["e-b", "e-c"]
    a = store.get_callback("e-a")
    assert a is not None and (a.attempts, a.next_attempt_at, a.last_error) == (
        1,
        T0 + 50,
        "HTTP 500",
    )

    assert store.mark_delivered("e-b", T0 + 6)
    assert not store.mark_delivered("e-b", T0 + 7)  # once
    assert not store.reschedule("e-b", 5, T0, "late failure")  # a delivered row stays so
    b = store.get_callback("e-b")
    assert b is not None and (b.delivered_at, b.attempts, b.last_error) == (T0 + 6, 1, None)

    assert store.reschedule("e-c", 3, None, "HTTP 404")  # given up: kept, not pending
    c = store.get_callback("e-c")
    assert c is not None and (c.next_attempt_at, c.attempts, c.last_error) == (None, 3, "HTTP 404")
    assert store.pending_count() == 1
    assert [x.id for x in store.due_callbacks(T0 + 1000, 10)] == ["e-a"]
    assert store.next_attempt_at() == T0 + 50
    assert not store.mark_delivered("missing", T0)


def test_outbox_rows_need_their_probe(store: Store) -> None:
    with pytest.raises(sqlite3.IntegrityError), store._write() as conn:
        store._enqueue(conn, "no-such-probe", ("https://h.example.com", "{}", "e"), T0)
    assert store.pending_count() == 0


def test_data_dir_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "agent.sqlite3"
    with Store(path):
        pass
    assert path.exists()
    assert not os.path.exists(f"{path}-wal")  # a clean close checkpoints and removes the WAL


def test_a_version_1_file_migrates_and_keeps_its_rows(tmp_path: Path) -> None:
    """A file written by the issue-4 agent (schema 1) gains the round-trip columns; its probes
    and callbacks are untouched and read back with empty comparison fields."""
    from vrambudget.agent.store.schema import _MIGRATIONS

    path = tmp_path / "v1.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in _MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version=1")
    conn.execute("INSERT INTO probes VALUES ('p', 1.0, 2.0, 'succeeded', 'cpu', '{}', '{}', NULL)")
    conn.execute(
        "INSERT INTO outbox VALUES ('msg_p', 'p', 'https://h/x', '{}', 0, 3.0, NULL, NULL, 1.0)"
    )
    conn.close()
    with Store(path) as s:
        row = s.get_probe("p")
        assert row is not None and row.result == "{}" and row.comparison is None
        assert row.estimate is None and row.comparison_error is None
        cb = s.get_callback("msg_p")
        assert cb is not None and cb.kind == "callback" and cb.next_attempt_at == 3.0


def test_comparison_row_then_callback_in_one_transaction(store: Store) -> None:
    store.create_probe("p", "{}", "cpu", 1.0)
    store.transition("p", "running", 2.0, expected={"queued"})
    assert store.finish_with_callback(
        "p",
        "succeeded",
        3.0,
        "{}",
        ("https://cb/x", "{}", "msg_p"),
        comparison=("http://svc/v1/comparisons", "{}", "cmp_p"),
    )
    # Only the comparison is queued; the callback waits for its answer.
    due = store.due_callbacks(10.0, 10)
    assert [(r.id, r.kind) for r in due] == [("cmp_p", "comparison")]
    done = store.complete_comparison(
        "cmp_p", 4.0, '{"ok": 1}', None, lambda row: ("https://cb/x", row.comparison or "", "msg_p")
    )
    assert done
    assert not store.complete_comparison("cmp_p", 5.0, None, "again", lambda row: None)
    row = store.get_probe("p")
    assert row is not None and row.comparison == '{"ok": 1}' and row.comparison_error is None
    due = store.due_callbacks(10.0, 10)
    assert [(r.id, r.kind, r.payload) for r in due] == [("msg_p", "callback", '{"ok": 1}')]
    assert store.get_callback("cmp_p").delivered_at == 4.0  # type: ignore[union-attr]


def test_a_given_up_comparison_still_sends_the_callback(store: Store) -> None:
    store.create_probe("p", "{}", "cpu", 1.0)
    store.transition("p", "running", 2.0, expected={"queued"})
    store.finish_with_callback(
        "p", "succeeded", 3.0, "{}", None, comparison=("http://svc/v1/comparisons", "{}", "cmp_p")
    )
    store.complete_comparison(
        "cmp_p",
        4.0,
        None,
        "HTTP 503",
        lambda row: ("https://cb/x", row.comparison_error or "", "msg_p"),
    )
    row = store.get_probe("p")
    assert row is not None and row.comparison is None and row.comparison_error == "HTTP 503"
    cmp_row = store.get_callback("cmp_p")
    assert cmp_row is not None and cmp_row.next_attempt_at is None and cmp_row.delivered_at is None
    assert [r.payload for r in store.due_callbacks(10.0, 10)] == ["HTTP 503"]
