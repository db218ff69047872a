"""The probe agent for real: an agent process (uvicorn on 127.0.0.1), probes submitted over HTTP
that run in spawned children with real torch on the CPU, a real webhook receiver.

The measured peak of the CPU path (the dispatch-mode tracker on real tensors) is checked against
the trace tier's recorder on fake tensors for the same program, to the byte.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.support.processes import AUTH, SECRET, Agent, Receiver
from tests.support.workloads import INFER, TRAIN
from vrambudget.agent.webhooks import verify
from vrambudget.core.resolve import resolve_model
from vrambudget.core.spec import Workload
from vrambudget.trace.recorder import Recorder
from vrambudget.workloads.run import initialize, prepare


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Agent]:
    a = Agent(tmp_path_factory.mktemp("agent"), receiver.port, VRAMBUDGET_AGENT_MAX_QUEUE="1")
    a.start()
    yield a
    a.stop()


def _expected_peak(spec: dict[str, Any], warmup: int, iterations: int) -> int:
    """The trace tier's recorder on fake tensors, same program and phases as the probe."""
    w = msgspec.convert(spec, Workload)
    rec = Recorder()
    with FakeTensorMode(), rec.recording():
        program = prepare(w, resolve_model(w.model), rec, torch.device("cpu"))
        program.every_decode_step = True
        initialize(program.model)
        for _ in range(warmup):
            program.run(1)
        rec.reset_peak()
        for _ in range(iterations):
            program.run(1)
    return rec.peak_bytes


@pytest.mark.parametrize("spec", [INFER, TRAIN], ids=["inference", "training"])
def test_probe_runs_for_real_and_matches_the_tracker(
    agent: Agent, receiver: Receiver, spec: dict[str, Any]
) -> None:
    before = len(receiver.requests)
    r = agent.submit(
        {
            "workload": spec,
            "warmup_iterations": 1,
            "iterations": 2,
            "callback": {"url": f"http://127.0.0.1:{receiver.port}/hook"},
        }
    )
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/probes/{r.json()['id']}"
    doc = agent.wait(r.json()["id"])
    assert doc["status"] == "succeeded", doc
    result = doc["result"]
    assert result["device"] == "cpu" and result["nvml"] is None
    assert result["outputs_finite"] is True
    assert result["iterations"]["count"] == 2
    assert result["torch"]["allocated_peak_bytes"] == _expected_peak(spec, 1, 2)
    assert result["host_peak_rss_bytes"] > result["torch"]["allocated_peak_bytes"]
    # One signed callback, whose signature verifies and which carries the same result.
    deadline = time.monotonic() + 20
    while len(receiver.requests) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(receiver.requests) == before + 1
    headers, body = receiver.requests[-1]
    verify(SECRET, headers, body, time.time())
    assert headers["webhook-id"] == f"msg_{doc['id']}"
    assert json.loads(body)["data"]["result"] == result


def test_missing_or_wrong_token_is_401(agent: Agent) -> None:
    assert httpx.get(f"{agent.url}/v1/probes").status_code == 401
    bad = httpx.get(f"{agent.url}/v1/device", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert bad.headers["www-authenticate"] == "Bearer"
    assert bad.headers["content-type"].startswith("application/problem+json")
    assert httpx.get(f"{agent.url}/healthz").status_code == 200


def test_device_inventory_says_no_nvml(agent: Agent) -> None:
    r = httpx.get(f"{agent.url}/v1/device", headers=AUTH)
    assert r.status_code == 200
    doc = r.json()
    assert doc["nvml"]["available"] is False and doc["nvml"]["error"]
    assert doc["probe_device"] == "cpu"


def test_callback_off_the_allow_list_and_unknown_entry_point_are_422(agent: Agent) -> None:
    r = agent.submit({"workload": INFER, "callback": {"url": "https://evil.example.com/x"}})
    assert r.status_code == 422 and "$.callback.url" in r.text
    r = agent.submit({"workload": {"kind": "custom", "entry_point": "os.system"}})
    assert r.status_code == 422 and "$.workload.entry_point" in r.text


def test_bad_limits_are_422_with_the_range(agent: Agent) -> None:
    r = agent.submit({"workload": INFER, "iterations": 0})
    assert r.status_code == 422 and "$.iterations" in r.text and ">= 1" in r.text
    r = agent.submit({"workload": INFER, "concurrency": 65})
    assert r.status_code == 422 and "$.concurrency" in r.text


def test_oom_is_a_result(agent: Agent) -> None:
    r = agent.submit({"workload": INFER, "memory_limit_bytes": 1 << 20})
    doc = agent.wait(r.json()["id"])
    assert doc["status"] == "oom", doc
    assert "limit" in doc["result"]["message"]
    assert doc["result"]["torch"]["allocated_peak_bytes"] > 0


def test_time_limit_queue_full_and_cancel(agent: Agent) -> None:
    slow = {
        "workload": {"kind": "custom", "entry_point": "sleeper", "arguments": {"seconds": 30.0}},
        "warmup_iterations": 0,
        "iterations": 1,
        "time_limit_s": 4,
    }
    first = agent.submit(slow)
    assert first.status_code == 202, first.text
    time.sleep(0.5)  # the worker takes it: the queue (size 1) is free again
    second = agent.submit({**slow, "time_limit_s": 60})
    assert second.status_code == 202
    third = agent.submit(slow)
    assert third.status_code == 429 and int(third.headers["retry-after"]) > 0
    doc = agent.wait(first.json()["id"], timeout=30)
    assert doc["status"] == "timeout" and "4 s" in doc["error"]
    # The second is now running; cancel it.
    time.sleep(1.0)
    r = httpx.delete(f"{agent.url}/v1/probes/{second.json()['id']}", headers=AUTH, timeout=30)
    assert r.status_code == 202
    assert agent.wait(second.json()["id"], timeout=30)["status"] == "cancelled"


def test_listing_is_paged(agent: Agent) -> None:
    r = httpx.get(f"{agent.url}/v1/probes", params={"limit": 1}, headers=AUTH)
    assert r.status_code == 200
    page = r.json()
    assert len(page["items"]) == 1 and page["next"]
    r2 = httpx.get(
        f"{agent.url}/v1/probes", params={"limit": 1, "after": page["next"]}, headers=AUTH
    )
    assert r2.json()["items"][0]["id"] != page["items"][0]["id"]


def test_sigkill_mid_probe_then_restart(tmp_path: Path) -> None:
    """The agent is killed while a probe runs and its receiver is down; after a restart the
    finished results are still there, the running probe is interrupted, and the callback is
    delivered once the receiver is up."""
    receiver = Receiver()
    data = tmp_path / "agent"
    a = Agent(data, receiver.port)
    a.start()
    try:
        done = a.submit({"workload": INFER, "iterations": 1})
        finished = a.wait(done.json()["id"])
        assert finished["status"] == "succeeded"
        slow = a.submit(
            {
                "workload": {
                    "kind": "custom",
                    "entry_point": "sleeper",
                    "arguments": {"seconds": 60.0},
                },
                "callback": {"url": f"http://127.0.0.1:{receiver.port}/hook"},
            }
        )
        time.sleep(1.0)
        a.kill()
        b = Agent(data, receiver.port)
        b.port, b.url = a.port, a.url
        b.env["VRAMBUDGET_AGENT_PORT"] = str(a.port)
        b.start()
        try:
            again = httpx.get(f"{b.url}/v1/probes/{done.json()['id']}", headers=AUTH).json()
            assert again == finished
            doc = b.wait(slow.json()["id"])
            assert doc["status"] == "interrupted"
            with receiver:  # the receiver comes up only now
                deadline = time.monotonic() + 60
                while not receiver.requests and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert len(receiver.requests) == 1
                headers, body = receiver.requests[0]
                verify(SECRET, headers, body, time.time())
                assert json.loads(body)["data"]["status"] == "interrupted"
        finally:
            b.stop()
    finally:
        if a.process and a.process.poll() is None:
            a.stop()


# ------------------------------------------------------------------------ issue 13 (agent) --

SLEEPER = {
    "workload": {"kind": "custom", "entry_point": "sleeper", "arguments": {"seconds": 30.0}},
    "warmup_iterations": 0,
    "iterations": 1,
    "time_limit_s": 40,
}


def _probe_child(agent_pid: int, timeout: float = 30) -> int:
    """The pid of the agent's spawned probe child (``multiprocessing.spawn``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{agent_pid}/task").iterdir():
            for pid in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"spawn_main" in cmdline:
                    return int(pid)
        time.sleep(0.1)
    raise AssertionError("no probe child")


def test_concurrent_submissions_a_capped_scrubbed_child_and_a_body_timeout(
    tmp_path: Path, receiver: Receiver
) -> None:
    """With the worker busy and the queue (8) full, 40 concurrent POSTs: only 202 and 429
    (the issue saw 14 x 500 and 14 rows queued forever), and the stored queued rows are exactly
    those on the queue. The running child has no agent secrets in its environment and runs
    under the CPU memory cap. A body that never completes is answered 408 after the body
    timeout instead of holding the connection."""
    cap = 8 << 30
    a = Agent(
        tmp_path / "agent",
        receiver.port,
        VRAMBUDGET_AGENT_MAX_QUEUE="8",
        VRAMBUDGET_AGENT_CPU_MEMORY_LIMIT_BYTES=str(cap),
        VRAMBUDGET_AGENT_BODY_TIMEOUT_S="1",
    )
    a.start()
    try:
        assert httpx.get(f"{a.url}/readyz").json()["status"] == "ok"
        first = a.submit(SLEEPER)
        assert first.status_code == 202, first.text
        assert a.process is not None
        child = _probe_child(a.process.pid)
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        assert not [e for e in environ if e.startswith(b"VRAMBUDGET_AGENT_")]
        assert any(e.startswith(b"PYTHONPATH=") for e in environ)
        deadline = time.monotonic() + 30  # the child sets it first thing after its bootstrap
        while True:
            limits = Path(f"/proc/{child}/limits").read_text()
            data_line = next(x for x in limits.splitlines() if x.startswith("Max data size"))
            if data_line.split()[3] == str(cap) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert data_line.split()[3] == str(cap), data_line

        async def burst() -> list[int]:
            async with httpx.AsyncClient(headers=AUTH, timeout=30) as client:
                answers = await asyncio.gather(
                    *(client.post(f"{a.url}/v1/probes", json=SLEEPER) for _ in range(40))
                )
            return [r.status_code for r in answers]

        statuses = asyncio.run(burst())
        assert set(statuses) <= {202, 429}, statuses
        assert statuses.count(202) == 8 and statuses.count(429) == 32
        page = httpx.get(f"{a.url}/v1/probes", params={"limit": 100}, headers=AUTH).json()
        assert [p["status"] for p in page["items"]].count("queued") == 8

        # A submission whose body never completes.
        with socket.create_connection(("127.0.0.1", a.port), timeout=10) as s:
            s.sendall(
                b"POST /v1/probes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + AUTH["Authorization"].split()[1].encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )
            t0 = time.monotonic()
            answer = s.recv(4096)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
            assert time.monotonic() - t0 < 5
    finally:
        a.stop()


def test_an_empty_db_stops_the_agent_with_one_line_naming_it(
    tmp_path: Path, receiver: Receiver
) -> None:
    data = tmp_path / "agent"
    data.mkdir()
    (data / "agent.sqlite3").write_bytes(b"")
    a = Agent(data, receiver.port)
    done = subprocess.run(
        [sys.executable, "-m", "vrambudget.agent"],
        env=a.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert str(data / "agent.sqlite3") in done.stderr
    assert (data / "agent.sqlite3").stat().st_size == 0
