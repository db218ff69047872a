"""A real agent process (``python -m vrambudget.agent``) with the fake engine as its vLLM launcher,
stopped while an engine probe is mid-load: SIGTERM (systemctl stop) stops the engine's whole
tree before the agent exits; SIGKILL leaves the engine's supervisor to stop it; and when even
the supervisor was killed, the restarted agent reaps the group the store remembers."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.agent.test_engine_probe import FAKE, _running, alive
from tests.support.processes import AUTH, Agent, Receiver

LONG = {"concurrency": 2, "requests": 100_000, "output_tokens": 64}


def _body() -> dict[str, Any]:
    return {
        "workload": {
            "kind": "llm_serving",
            "engine": "vllm",
            "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "max_model_len": 512,
        },
        "recipe_gpu": "l4-24gb",
        "engine": LONG,
        "time_limit_s": 300,
    }


def _agent(data: Path, receiver: Receiver, record: Path) -> Agent:
    return Agent(
        data,
        receiver.port,
        VRAMBUDGET_AGENT_ENGINES=json.dumps({"vllm": [sys.executable, FAKE]}),
        FAKE_ENGINE_RECORD=str(record),
        FAKE_ENGINE_TOKEN_S="0.01",
    )


def _mid_load(agent: Agent, record: Path) -> tuple[str, dict[str, Any]]:
    r = agent.submit(_body())
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if record.exists() and json.loads(record.read_text())["requests"] >= 3:
            rec: dict[str, Any] = json.loads(record.read_text())
            assert _running(rec["pid"]) and _running(rec["child_pid"])
            return str(r.json()["id"]), rec
        time.sleep(0.1)
    raise AssertionError("the engine never served a request")


def _cleanup(agent: Agent, record: Path) -> None:
    agent.stop()
    if record.exists():
        rec = json.loads(record.read_text())
        for pid in (rec["pid"], rec["child_pid"], rec["parent_pid"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _status(agent: Agent, probe_id: str) -> str:
    r = httpx.get(f"{agent.url}/v1/probes/{probe_id}", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


def test_sigterm_stops_the_engine_tree_before_the_agent_exits(
    tmp_path: Path, receiver: Receiver
) -> None:
    record = tmp_path / "record.json"
    agent = _agent(tmp_path / "data", receiver, record)
    agent.start()
    try:
        probe_id, rec = _mid_load(agent, record)
        assert agent.process is not None
        agent.process.terminate()
        agent.process.wait(30)
        # at the instant the agent is gone, so is every process of the engine
        for pid in (rec["pid"], rec["child_pid"], rec["parent_pid"]):
            assert not alive(pid, 0.2), pid
        agent.start()  # the probe was cut short by the stop: interrupted
        assert _status(agent, probe_id) == "interrupted"
    finally:
        _cleanup(agent, record)


def test_sigkill_of_the_agent_leaves_no_engine(tmp_path: Path, receiver: Receiver) -> None:
    record = tmp_path / "record.json"
    agent = _agent(tmp_path / "data", receiver, record)
    agent.start()
    try:
        _, rec = _mid_load(agent, record)
        agent.kill()
        # the probe child dies with the agent; the engine's supervisor stops the group
        for pid in (rec["pid"], rec["child_pid"], rec["parent_pid"]):
            assert not alive(pid, 10), pid
    finally:
        _cleanup(agent, record)


def test_a_restarted_agent_reaps_the_engine_a_killed_one_left(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Nothing of the group is left to stop it (its supervisor killed as well): the next start
    finds the group in the probe's row and SIGKILLs it, identified by its token."""
    record = tmp_path / "record.json"
    agent = _agent(tmp_path / "data", receiver, record)
    agent.start()
    try:
        probe_id, rec = _mid_load(agent, record)
        os.kill(rec["parent_pid"], signal.SIGKILL)  # the supervisor
        agent.kill()
        time.sleep(1.0)
        assert _running(rec["pid"]) and _running(rec["child_pid"])  # orphaned, still serving
        agent.start()
        assert not alive(rec["pid"], 5) and not alive(rec["child_pid"], 5)
        assert _status(agent, probe_id) == "interrupted"
    finally:
        _cleanup(agent, record)
