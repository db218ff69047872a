"""Issue 13 (agent): atomic submission, a worker that survives runner and store failures,
storage readiness, the store's integrity check at start, the CPU memory cap and the scrubbed
child environment, workload validation at submission. In-process (the agent app under
Litestar's test clients, children via spawn); no traffic leaves 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import sqlite3
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from litestar.testing import AsyncTestClient, TestClient

import vrambudget.agent.worker as agent_worker
from tests.support.workloads import INFER
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.limits import cpu_memory_cap, cpu_memory_limit
from vrambudget.agent.runner import ChildResult, ProbeProcess, scrubbed
from vrambudget.agent.settings import AgentSettings, AgentSettingsError
from vrambudget.agent.spec import ProbeRequest
from vrambudget.agent.storage import storage_checker
from vrambudget.agent.store import Store, StoreOpenError

AUTH = {"Authorization": "Bearer t"}
PROBE = {"workload": INFER, "iterations": 1}


def _settings(tmp_path: Path, **kw: Any) -> AgentSettings:
    return AgentSettings(data_dir=tmp_path, tokens=(b"t",), **kw)


class FakeProcess:
    """Stands in for ProbeGroup in the worker: no child, an outcome chosen by the test."""

    outcomes: ClassVar[list[Any]] = []
    created: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        FakeProcess.created.append({"args": args, **kwargs})
        self.pid: int | None = None

    def start(self) -> None:
        self.pid = 1

    def cancel(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def wait(self) -> ChildResult:
        outcome = FakeProcess.outcomes.pop(0) if FakeProcess.outcomes else None
        if isinstance(outcome, BaseException):
            raise outcome
        if callable(outcome):
            return outcome()  # type: ignore[no-any-return]
        return ChildResult("failed", None, "fake child")


@pytest.fixture
def fake_process(monkeypatch: pytest.MonkeyPatch) -> type[FakeProcess]:
    FakeProcess.outcomes = []
    FakeProcess.created = []
    monkeypatch.setattr(agent_worker, "ProbeGroup", FakeProcess)
    return FakeProcess


def _wait_status(client: TestClient[Any], probe_id: str, wanted: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = client.get(f"/v1/probes/{probe_id}", headers=AUTH).json()
        if body["status"] in wanted or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


# -------------------------------------------------------------------- atomic submission --


def test_40_concurrent_submissions_with_a_busy_worker_are_202_or_429_never_500(
    tmp_path: Path, fake_process: type[FakeProcess]
) -> None:
    """The issue's run: 8x202, 18x429, 14x500 and 14 rows stuck ``queued``. Now: no 500, and
    every stored ``queued`` row is on the queue (the worker will take it)."""
    release = threading.Event()

    def busy() -> ChildResult:
        release.wait(30)
        return ChildResult("failed", None, "fake child")

    fake_process.outcomes = [busy] * 50
    app = create_agent_app(_settings(tmp_path, max_queue=8))

    async def run() -> tuple[list[int], int, int]:
        async with AsyncTestClient(app) as client:
            first = await client.post("/v1/probes", json=PROBE, headers=AUTH)
            assert first.status_code == 202
            st = app.state.agent
            for _ in range(200):  # the worker holds the first probe: the queue is empty
                if first.json()["id"] in st.running:
                    break
                await asyncio.sleep(0.01)
            answers = await asyncio.gather(
                *(client.post("/v1/probes", json=PROBE, headers=AUTH) for _ in range(40))
            )
            queued = len([r for r in st.store.list_probes(500)[0] if r.status == "queued"])
            depth = st.queues["cpu"].qsize()
            release.set()
            return [a.status_code for a in answers], queued, depth

    statuses, queued, depth = asyncio.run(run())
    assert sorted(set(statuses)) == [202, 429], statuses
    assert statuses.count(202) == 8 and statuses.count(429) == 32
    assert queued == depth == 8  # no orphaned queued row


# ----------------------------------------------------- failures end the probe, not the worker --


def test_a_runner_exception_fails_the_probe_and_the_worker_keeps_serving(
    tmp_path: Path, fake_process: type[FakeProcess]
) -> None:
    fake_process.outcomes = [OSError(28, "No space left on device")]
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    with TestClient(create_agent_app(_settings(tmp_path))) as client:
        logging.getLogger("vrambudget.agent.worker").addHandler(handler)
        first = client.post("/v1/probes", json=PROBE, headers=AUTH).json()["id"]
        body = _wait_status(client, first, {"failed"})
        assert body["status"] == "failed"
        assert "No space left on device" in body["error"] and "agent error" in body["error"]
        second = client.post("/v1/probes", json=PROBE, headers=AUTH).json()["id"]
        assert _wait_status(client, second, {"failed"})["error"] == "fake child"
    logging.getLogger("vrambudget.agent.worker").removeHandler(handler)
    logged = [r for r in records if "the agent failed to run or record it" in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # with its traceback


def test_an_injected_store_failure_fails_the_probe_and_the_worker_keeps_serving(
    tmp_path: Path, fake_process: type[FakeProcess]
) -> None:
    with TestClient(create_agent_app(_settings(tmp_path))) as client:
        store = client.app.state.agent.store
        real = store.finish_with_callback
        calls = {"n": 0}

        def flaky(*args: Any, **kwargs: Any) -> bool:
            calls["n"] += 1
            if calls["n"] == 1:
                raise sqlite3.OperationalError("database or disk is full")
            return real(*args, **kwargs)

        store.finish_with_callback = flaky
        first = client.post("/v1/probes", json=PROBE, headers=AUTH).json()["id"]
        body = _wait_status(client, first, {"failed"})
        assert body["status"] == "failed" and "disk is full" in body["error"]
        second = client.post("/v1/probes", json=PROBE, headers=AUTH).json()["id"]
        assert _wait_status(client, second, {"failed"})["error"] == "fake child"


def test_a_failure_that_cannot_even_be_stored_shows_as_failed(
    tmp_path: Path, fake_process: type[FakeProcess]
) -> None:
    with TestClient(create_agent_app(_settings(tmp_path))) as client:
        store = client.app.state.agent.store

        def broken(*_: Any, **__: Any) -> bool:
            raise sqlite3.OperationalError("attempt to write a readonly database")

        store.finish_with_callback = broken
        probe_id = client.post("/v1/probes", json=PROBE, headers=AUTH).json()["id"]
        body = _wait_status(client, probe_id, {"failed"})
        assert body["status"] == "failed" and "readonly" in body["error"]


# ---------------------------------------------------------------------- storage readiness --


def test_a_full_disk_is_on_readyz_and_refuses_probes_with_503(
    tmp_path: Path, fake_process: type[FakeProcess]
) -> None:
    problem: dict[str, str | None] = {"now": None}
    app = create_agent_app(_settings(tmp_path), storage_check=lambda: problem["now"])
    with TestClient(app) as client:
        assert client.get("/readyz").json() == {"status": "ok", "reason": None}
        problem["now"] = "the data directory has 0 bytes free (below 67108864)"
        r = client.get("/readyz")
        assert r.status_code == 503 and "0 bytes free" in r.json()["reason"]
        r = client.post("/v1/probes", json=PROBE, headers=AUTH)
        assert r.status_code == 503 and "0 bytes free" in r.json()["detail"]
        assert r.headers["retry-after"] == "30"
        assert client.get("/v1/probes", headers=AUTH).json()["items"] == []
        problem["now"] = None
        assert client.post("/v1/probes", json=PROBE, headers=AUTH).status_code == 202


def test_a_store_write_that_fails_at_submission_is_503_with_no_row(
    tmp_path: Path, fake_process: type[FakeProcess]
) -> None:
    with TestClient(create_agent_app(_settings(tmp_path))) as client:
        st = client.app.state.agent

        def full(*_: Any) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        st.store.create_probe = full
        r = client.post("/v1/probes", json=PROBE, headers=AUTH)
        assert r.status_code == 503 and "disk is full" in r.json()["detail"]
        assert st.queues["cpu"].qsize() == 0


def test_storage_checker_reports_read_only_and_low_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert storage_checker(tmp_path, 0)() is None
    assert "free" in (storage_checker(tmp_path, 1 << 62)() or "")
    real = os.statvfs

    class ReadOnly:
        def __init__(self, st: os.statvfs_result) -> None:
            self.f_flag = st.f_flag | os.ST_RDONLY
            self.f_bavail, self.f_frsize = st.f_bavail, st.f_frsize

    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly(real(p)))
    assert storage_checker(tmp_path, 0)() == "the data directory is read-only"


# ------------------------------------------------------------------- the store at startup --


def test_an_empty_db_file_is_refused_with_its_path_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite3"
    path.write_bytes(b"")
    with pytest.raises(StoreOpenError, match="0 bytes") as info:
        Store(path)
    assert str(path) in str(info.value)
    assert path.stat().st_size == 0  # never silently replaced


def test_a_garbage_header_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite3"
    path.write_bytes(b"this is not a database" * 300)
    with pytest.raises(StoreOpenError) as info:
        Store(path)
    assert str(path) in str(info.value)


def test_a_corrupt_index_page_is_found_at_start(tmp_path: Path) -> None:
    path = tmp_path / "agent.sqlite3"
    with Store(path) as store:
        for i in range(400):
            store.create_probe(f"p{i:04d}", '{"x": "' + "y" * 200 + '"}', "cpu", float(i))
    conn = sqlite3.connect(path)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name='probes_by_time'").fetchone()
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with path.open("r+b") as f:
        f.seek((root[0] - 1) * page_size + 8)
        f.write(os.urandom(page_size - 8))
    with pytest.raises(StoreOpenError, match=r"integrity check|malformed") as info:
        Store(path)
    assert str(path) in str(info.value)


def test_the_agent_refuses_to_start_on_a_bad_db_with_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "agent.sqlite3").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMBUDGET_AGENT_")}
    env |= {"VRAMBUDGET_AGENT_DATA_DIR": str(tmp_path), "VRAMBUDGET_AGENT_PORT": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "vrambudget.agent"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert str(tmp_path / "agent.sqlite3") in done.stderr and "0 bytes" in done.stderr


# --------------------------------------------------- the child: memory cap, scrubbed env --


def _report_env(send: Connection) -> None:
    with open("/proc/self/environ", "rb") as f:
        send.send(f.read().decode("utf-8", "replace").split("\0"))
    send.close()


def _report_limit(send: Connection, limit: int) -> None:
    import resource

    from vrambudget.agent.probe import _limit_memory

    _limit_memory(limit)
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    try:
        block = bytearray(2 * limit)
        outcome = f"allocated {len(block)}"
    except MemoryError:
        outcome = "MemoryError"
    send.send((soft, outcome))
    send.close()


def _run_target(p: ProbeProcess, target: Any, *args: Any) -> Any:
    """Run ``target`` in the probe's spawned child instead of the probe (same start path)."""
    ctx = mp.get_context("spawn")
    p._process = ctx.Process(target=target, args=(p._send, *args), daemon=True)
    p.start()
    try:
        assert p._recv.poll(60)
        return p._recv.recv()
    finally:
        p._process.join(10)


def test_the_child_environment_has_no_agent_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VRAMBUDGET_AGENT_TOKENS", "tok-secret")
    monkeypatch.setenv("VRAMBUDGET_AGENT_WEBHOOK_SECRET", "whsec_c2VjcmV0")
    monkeypatch.setenv("KEEP_ME", "1")
    env = _run_target(ProbeProcess(b"{}", ChildSettings(), 5), _report_env)
    assert "KEEP_ME=1" in env
    assert not [e for e in env if e.startswith("VRAMBUDGET_AGENT_")]
    assert os.environ["VRAMBUDGET_AGENT_TOKENS"] == "tok-secret"  # the agent keeps its own
    assert scrubbed({"VRAMBUDGET_AGENT_X": "1", "PATH": "/bin"}) == {"PATH": "/bin"}


def test_the_memory_cap_is_applied_in_the_child() -> None:
    limit = 1 << 30
    p = ProbeProcess(b"{}", ChildSettings(), 5, memory_limit_bytes=limit)
    assert p._process._args[3] == limit  # type: ignore[attr-defined]  # child_main's argument
    soft, outcome = _run_target(p, _report_limit, limit)
    assert soft == limit and outcome == "MemoryError"


def test_cpu_probes_get_a_default_memory_limit(
    tmp_path: Path, fake_process: type[FakeProcess]
) -> None:
    settings = _settings(tmp_path)
    cap = cpu_memory_cap(settings)
    assert cap is not None and cap > 0
    req = msgspec.convert(PROBE, ProbeRequest)
    limit = cpu_memory_limit(settings, req)
    assert limit is not None and limit <= cap
    assert cpu_memory_limit(_settings(tmp_path, cpu_memory_limit_bytes=0), req) is None
    assert cpu_memory_limit(_settings(tmp_path, cpu_memory_limit_bytes=1 << 30), req) == 1 << 30
    with TestClient(create_agent_app(settings)) as client:
        probe_id = client.post("/v1/probes", json=PROBE, headers=AUTH).json()["id"]
        _wait_status(client, probe_id, {"failed"})
    memory_limits = fake_process.created[0]["args"][3]  # ProbeGroup: the limit of each job
    assert memory_limits([req]) == [limit]


def test_a_workload_over_the_cpu_cap_is_refused_at_submission(tmp_path: Path) -> None:
    app = create_agent_app(_settings(tmp_path, cpu_memory_limit_bytes=1 << 20))
    with TestClient(app) as client:
        r = client.post("/v1/probes", json=PROBE, headers=AUTH)
        assert r.status_code == 422 and "CPU memory cap" in r.text and "$.workload" in r.text


# ------------------------------------------------------------- validation at submission --


def test_a_workload_the_service_would_refuse_is_422_naming_the_field(tmp_path: Path) -> None:
    with TestClient(create_agent_app(_settings(tmp_path))) as client:
        bad = {**INFER, "parallelism": {"tensor": 3}}
        r = client.post("/v1/probes", json={"workload": bad}, headers=AUTH)
        assert r.status_code == 422, r.text
        assert "$.workload.parallelism.tensor" in r.text
        assert client.get("/v1/probes", headers=AUTH).json()["items"] == []


def test_settings_for_the_new_limits(tmp_path: Path) -> None:
    s = AgentSettings.from_env(
        {
            "VRAMBUDGET_AGENT_BODY_TIMEOUT_S": "3",
            "VRAMBUDGET_AGENT_CPU_MEMORY_LIMIT_BYTES": "1073741824",
            "VRAMBUDGET_AGENT_DELIVERY_CONCURRENCY": "4",
            "VRAMBUDGET_AGENT_MIN_FREE_BYTES": "0",
        }
    )
    assert (s.body_timeout_s, s.cpu_memory_limit_bytes, s.delivery_concurrency) == (3, 1 << 30, 4)
    with pytest.raises(AgentSettingsError, match="DELIVERY_CONCURRENCY"):
        AgentSettings(delivery_concurrency=0)
    with pytest.raises(AgentSettingsError, match="public suffix"):
        AgentSettings.from_env({"VRAMBUDGET_AGENT_CALLBACK_ALLOW": "*.co.uk"})
