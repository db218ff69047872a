"""Engine probes through a real agent process on 127.0.0.1, with the fake engine as the host's
vLLM launcher: a probe runs to completion (figures, latencies, the requested concurrency, the
engine gone afterwards, no agent secret in the engine's environment), a DELETE mid-load stops
the engine, and the submission refusals arrive as 422s naming the field."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent.test_engine_probe import FAKE, alive
from tests.support.processes import AUTH, Agent, Receiver


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine") / "record.json"


@pytest.fixture(scope="module")
def agent(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver, record: Path
) -> Iterator[Agent]:
    a = Agent(
        tmp_path_factory.mktemp("agent"),
        receiver.port,
        VRAMBUDGET_AGENT_ENGINES=json.dumps({"vllm": [sys.executable, FAKE]}),
        FAKE_ENGINE_RECORD=str(record),
        FAKE_ENGINE_TOKEN_S="0.005",
    )
    a.start()
    yield a
    a.stop()


def _probe(load: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "workload": {
            "kind": "llm_serving",
            "engine": "vllm",
            "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "max_model_len": 1024,
        },
        "recipe_gpu": "l4-24gb",
        "engine": load,
        **extra,
    }


def test_an_engine_probe_through_the_agent(agent: Agent, record: Path) -> None:
    r = agent.submit(_probe({"concurrency": 3, "requests": 9, "output_tokens": 8}))
    assert r.status_code == 202, r.text
    doc = agent.wait(r.json()["id"])
    assert doc["status"] == "succeeded", doc
    res = doc["result"]
    assert res["torch"] is None and res["torch_version"] is None and res["device"] == "cpu"
    e = res["engine"]
    assert e["started"] is True and e["exit_code"] is None and e["errors"] == 0
    assert e["startup"]["kv_cache_tokens"] == 8 * 1024
    assert e["startup"]["weights_bytes"] is not None and e["expected"]["would_start"] is True
    assert e["requests"] == 9 and e["prompt_tokens"] == 1024 - 8
    ttft = e["ttft"]
    assert 0 < ttft["p50_s"] <= ttft["p95_s"] <= ttft["p99_s"]
    rec = json.loads(record.read_text())
    assert rec["max_in_flight"] == 3
    assert not [k for k in rec["env"] if k.upper().startswith("VRAMBUDGET_AGENT_")]
    assert not alive(rec["pid"]) and not alive(rec["child_pid"])


def test_cancel_mid_load_stops_the_engine(agent: Agent, record: Path) -> None:
    record.unlink(missing_ok=True)
    r = agent.submit(_probe({"concurrency": 2, "requests": 100_000, "output_tokens": 64}))
    assert r.status_code == 202, r.text
    probe_id = r.json()["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if record.exists() and json.loads(record.read_text())["requests"] >= 2:
            break
        time.sleep(0.1)
    rec = json.loads(record.read_text())
    assert alive(rec["pid"], 0)
    d = httpx.delete(f"{agent.url}/v1/probes/{probe_id}", headers=AUTH, timeout=30)
    assert d.status_code == 202
    assert agent.wait(probe_id)["status"] == "cancelled"
    assert not alive(rec["pid"]) and not alive(rec["child_pid"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**_probe({}), "recipe_gpu": None}, "$.recipe_gpu"),
        (
            {**_probe({}), "workload": {**_probe({})["workload"], "engine": "sglang"}},
            "$.workload.engine",
        ),
        ({**_probe({"prompt_tokens": 2000})}, "$.engine.prompt_tokens"),
    ],
)
def test_refused_at_submission(agent: Agent, body: dict[str, Any], field: str) -> None:
    r = agent.submit(body)
    assert r.status_code == 422, r.text
    assert f'"{field}"' in r.text
