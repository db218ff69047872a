"""An engine never outlives its probe: the fake engine (tests/support/fake_engine.py, which starts
a child of its own, as vLLM starts its EngineCore) on 127.0.0.1, its probe child SIGKILLed
mid-load, a SIGTERM landing while the engine is being stopped, a group the store remembers
reaped at the agent's next start (and nothing else reaped), and a data-parallel engine given
its GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from tests.agent.test_engine_probe import (
    ENGINES,
    _child,
    _running,
    alive,
    request,
)
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.engine import run
from vrambudget.agent.engine.group import ENV, EngineGroup, boot_id, reap, reap_stored, start_time
from vrambudget.agent.engine.recipe import EngineRefused, engine_gpus, plan
from vrambudget.agent.limits import WorkloadRefused, validate_workload
from vrambudget.agent.runner import ProbeProcess
from vrambudget.agent.settings import AgentSettings
from vrambudget.agent.store import Store
from vrambudget.core.probe_engine import EngineLoad


def _wait_record(record: Path, requests: int, seconds: float = 40) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if record.exists():
            rec: dict[str, Any] = json.loads(record.read_text())
            if rec["requests"] >= requests:
                return rec
        time.sleep(0.05)
    raise AssertionError(f"the fake engine did not serve {requests} requests")


def _kill(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(path))
    yield path
    if path.exists():  # whatever a failed assertion left running
        rec = json.loads(path.read_text())
        _kill(rec["pid"], rec["child_pid"], rec["parent_pid"])


LONG = {"concurrency": 2, "requests": 100_000, "output_tokens": 64}


# ----------------------------------------------------------------- the probe child dies --


def test_a_sigkilled_probe_child_leaves_no_engine_process(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL (the agent's own kill after its grace, the OOM killer) gives the child no
    ``finally``: the supervisor sees the pipe's EOF and stops the group by itself; the parent,
    told the group at start, reaps what is left when ``wait`` returns."""
    monkeypatch.setenv("FAKE_ENGINE_TOKEN_S", "0.01")
    groups: list[EngineGroup] = []
    p = ProbeProcess(
        msgspec.json.encode(request("vllm", LONG)),
        ChildSettings(engines=ENGINES),
        60,
        on_engine=groups.append,
    )
    p.start()
    try:
        rec = _wait_record(record, 3)
        assert _running(rec["pid"]) and _running(rec["child_pid"])
        assert p.pid is not None
        os.kill(p.pid, signal.SIGKILL)
        # nothing of the agent acts yet: the supervisor alone stops the engine and its child
        assert not alive(rec["pid"], 8) and not alive(rec["child_pid"], 8)
        assert not alive(rec["parent_pid"], 2)
        out = p.wait()
        assert out.status == "failed" and "code -9" in (out.error or "")
        (group,) = groups  # stored by the agent (worker._remember_engine)
        assert group.pgid == rec["parent_pid"] and group.token and group.start_time
    finally:
        p.kill()


def test_the_parent_reaps_a_group_whose_supervisor_died_too(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Belt and braces: the supervisor and the child both SIGKILLed (nothing inside the group
    is left to stop it); ``wait`` returning reaps the engine by its token."""
    monkeypatch.setenv("FAKE_ENGINE_TOKEN_S", "0.01")
    groups: list[EngineGroup] = []
    p = ProbeProcess(
        msgspec.json.encode(request("vllm", LONG)),
        ChildSettings(engines=ENGINES),
        60,
        on_engine=groups.append,
    )
    p.start()
    try:
        rec = _wait_record(record, 3)
        assert p.pid is not None
        os.kill(rec["parent_pid"], signal.SIGKILL)  # the supervisor first
        os.kill(p.pid, signal.SIGKILL)
        time.sleep(0.5)
        assert _running(rec["pid"]) and _running(rec["child_pid"])  # orphans now
        p.wait()
        assert not alive(rec["pid"]) and not alive(rec["child_pid"])
    finally:
        p.kill()


def test_a_sigterm_during_the_stop_does_not_cut_it_short(record: Path) -> None:
    """A cancel arriving while the child stops an engine that drains on SIGTERM (here: ignores
    it) used to end the child between the group's SIGTERM and its SIGKILL; now SIGTERM is
    ignored during the stop, the SIGKILL comes, and the child finishes normally."""
    req = request(
        "vllm", {"concurrency": 1, "requests": 3, "warmup_requests": 1, "output_tokens": 4}
    )
    p = _child(req, record, FAKE_ENGINE_IGNORE_TERM="1")
    try:
        rec = _wait_record(record, 4)
        time.sleep(1.0)  # the load is over: the child waits out the supervisor's 3 s grace
        assert _running(rec["pid"])  # the engine ignored the SIGTERM
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
        assert p.returncode == 0 and "status succeeded" in out
        assert not alive(rec["pid"]) and not alive(rec["child_pid"])
    finally:
        p.kill()
        p.wait()


def test_a_child_started_from_a_thread_that_ends_lives_on(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PR_SET_PDEATHSIG`` fires when the thread that forked the child ends, not the process:
    a child started from a short-lived thread used to be SIGKILLed when that thread ended. It
    now relies on the agent's lifeline pipe there, and the probe runs to its end."""
    monkeypatch.setenv("FAKE_ENGINE_TOKEN_S", "0.01")
    load = {"concurrency": 2, "requests": 20, "output_tokens": 16}
    p = ProbeProcess(msgspec.json.encode(request("vllm", load)), ChildSettings(engines=ENGINES), 60)

    def start_then_end() -> None:
        p.start()
        time.sleep(2.5)  # past the child's start-up: its prctl would have been set by now

    t = threading.Thread(target=start_then_end)
    t.start()
    t.join()
    try:
        out = p.wait()
        assert (out.status, out.error) == ("succeeded", None)
        rec = json.loads(record.read_text())
        warmup = EngineLoad().warmup_requests
        assert rec["requests"] == 20 + warmup and not alive(rec["child_pid"])
    finally:
        p.kill()


# ------------------------------------------------------------------ the group's identity --


def _sleeper(token: str) -> subprocess.Popen[bytes]:
    """A process group of two (a leader and its child) carrying ``token``, like an engine."""
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, env={**os.environ, ENV: token}
    )


def _members_of(pgid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _running(int(name)):
            try:
                stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(stat[2]) == pgid:
                found.append(int(name))
    return found


def _until(predicate: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_recover_reaps_the_groups_an_earlier_agent_left(tmp_path: Path) -> None:
    """A probe the store still has as running, with its engine's group: the next start stops
    that group (by its leader, verified by its start time) before marking it interrupted; a
    group with someone else's identity is not touched."""
    ours, theirs = _sleeper("a" * 32), _sleeper("b" * 32)
    try:
        _until(lambda: len(_members_of(ours.pid)) == 2 and len(_members_of(theirs.pid)) == 2)
        group = EngineGroup(
            pgid=ours.pid, start_time=start_time(ours.pid), boot_id=boot_id(), token="a" * 32
        )
        # the same pgid but another start time (PID reuse) and another token: not ours
        impostor = EngineGroup(
            pgid=theirs.pid,
            start_time=(start_time(theirs.pid) or 0) + 1,
            boot_id=boot_id(),
            token="c" * 32,
        )
        assert reap(impostor) == [] and len(_members_of(theirs.pid)) == 2
        assert reap(msgspec.structs.replace(group, boot_id="another boot")) == []
        before = _members_of(ours.pid)
        store = Store(tmp_path / "agent.sqlite3")
        store.create_probe("p1", "{}", "cpu", 1.0)
        store.transition("p1", "running", 2.0)
        store.set_engine_group("p1", msgspec.json.encode(group).decode())
        store.create_probe("p2", "{}", "cpu", 1.0)  # queued, no engine
        reaped: list[list[int]] = []
        ids = store.recover(3.0, reap_engine=lambda g: reaped.append(reap_stored(g)))
        assert sorted(ids) == ["p1", "p2"] and len(reaped) == 1
        assert reaped[0] == sorted(before) and len(before) == 2
        assert ours.wait(10) == -signal.SIGKILL
        _until(lambda: not _members_of(ours.pid))
        assert len(_members_of(theirs.pid)) == 2
        assert store.get_probe("p1").status == "interrupted"  # type: ignore[union-attr]
        assert reap_stored("not json") == []
        store.close()
    finally:
        for p in (ours, theirs):
            for pid in _members_of(p.pid):
                _kill(pid)
            p.kill()
            p.wait()


def test_members_without_their_leader_are_found_by_token() -> None:
    p = _sleeper("d" * 32)
    try:
        _until(lambda: len(_members_of(p.pid)) == 2)
        (orphan,) = [m for m in _members_of(p.pid) if m != p.pid]
        group = EngineGroup(
            pgid=p.pid, start_time=start_time(p.pid), boot_id=boot_id(), token="d" * 32
        )
        p.kill()
        p.wait()
        assert reap(group) == [orphan]
        _until(lambda: not _running(orphan))
    finally:
        for pid in _members_of(p.pid):
            _kill(pid)


# ---------------------------------------------------------------- data-parallel engines --


def _gpu(index: int) -> SimpleNamespace:
    return SimpleNamespace(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA L4",
        memory_total_bytes=24 << 30,
        compute_capability="8.9",
    )


def _inventory(n: int) -> SimpleNamespace:
    return SimpleNamespace(available=True, gpus=[_gpu(i) for i in range(n)], driver_version="x")


def _parallel(**sizes: int) -> Any:
    req = request("vllm")
    w = msgspec.structs.replace(
        req.workload,
        parallelism=msgspec.convert(sizes, type(req.workload.parallelism)),  # type: ignore[union-attr]
    )
    return msgspec.structs.replace(req, workload=w)


def test_engine_gpus_put_the_probe_s_device_first() -> None:
    inv = _inventory(4)
    assert [g.index for g in engine_gpus(inv, 2, 1)] == [2]
    assert [g.index for g in engine_gpus(inv, 2, 3)] == [2, 0, 1]
    assert engine_gpus(None, 0, 2) == [] == engine_gpus(SimpleNamespace(available=False), 0, 2)


def test_a_data_parallel_probe_needs_its_gpus(tmp_path: Path) -> None:
    with pytest.raises(EngineRefused) as err:
        plan(_parallel(data=2), ENGINES, _inventory(1))
    assert err.value.field == "$.workload.parallelism"
    assert "1 x 1 x 2 = 2 GPUs; this host has 1" in err.value.message
    plan(_parallel(data=2), ENGINES, _inventory(2))  # enough
    with pytest.raises(WorkloadRefused) as refused:  # a host without GPUs, at submission
        validate_workload(AgentSettings(engines=ENGINES), _parallel(tensor=1, data=2), cpu=True)
    assert refused.value.field == "$.workload.parallelism"


@pytest.mark.parametrize(
    ("sizes", "visible", "devices"),
    [({}, "GPU-1", (1,)), ({"data": 2}, "GPU-1,GPU-0", (1, 0))],
)
def test_the_engine_sees_as_many_gpus_as_its_parallelism(
    sizes: dict[str, int],
    visible: str,
    devices: tuple[int, ...],
    record: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One GPU: pinned to the probe's own. Data-parallel 2 (the recipe says
    ``--data-parallel-size 2``): the probe's GPU and the next, and the agent is told both, so
    it samples both."""
    monkeypatch.setattr(run, "_device", lambda req: (_inventory(2), None, 1))
    notes: list[Any] = []
    status, result, error = run.measure_engine(
        _parallel(**sizes), ChildSettings(engines=ENGINES), notes.append
    )
    assert (status, error) == ("succeeded", None)
    rec = json.loads(record.read_text())
    assert rec["cuda_visible_devices"] == visible
    assert ("--data-parallel-size" in rec["argv"]) == bool(sizes)
    assert notes[0][0] == "engine_started" and notes[0][1].devices == devices
    assert result is not None and result.device == "cuda" and result.device_name == "NVIDIA L4"
