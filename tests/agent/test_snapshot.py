"""Private memory snapshots (``memory_snapshot: true``): real CPU probes through an in-process
agent app and its spawned child; the file, its modes, who may fetch it, what memory_viz makes of
it, the size cap, retention, DELETE, and that a callback carries metadata only."""

from __future__ import annotations

import base64
import json
import os
import pickle
import stat
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from tests.support.processes import Receiver
from tests.support.workloads import INFER
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.settings import AgentSettings, AgentSettingsError
from vrambudget.agent.snapshot_routes import settle_snapshot
from vrambudget.agent.snapshots import (
    expire_snapshots,
    recorder_snapshot,
    remove_snapshot,
    snapshot_file,
    snapshot_path,
    write_snapshot,
)
from vrambudget.agent.spec import Iteration, ProbeResult
from vrambudget.trace.events import ALLOC, FREE

AUTH = {"Authorization": "Bearer t"}
TERMINAL = {"succeeded", "oom", "timeout", "failed", "cancelled", "interrupted", "unreliable"}


def _wait(client: TestClient[Any], probe_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc: dict[str, Any] = client.get(f"/v1/probes/{probe_id}", headers=AUTH).json()
        if doc["status"] in TERMINAL:
            return doc
        time.sleep(0.1)
    raise AssertionError(f"probe {probe_id} did not finish: {doc['status']}")


def _submit(client: TestClient[Any], **fields: Any) -> str:
    body = {"workload": INFER, "warmup_iterations": 0, "iterations": 1, **fields}
    r = client.post("/v1/probes", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    probe_id: str = r.json()["id"]
    return probe_id


def _timeline_peak(snapshot: dict[str, Any]) -> int:
    """The largest live bytes along the history: live at its start (live at the end minus the
    history's net change), then every alloc and free_completed in order."""
    trace = snapshot["device_traces"][0]
    end = sum(seg["allocated_size"] for seg in snapshot["segments"])
    net = sum(e["size"] for e in trace if e["action"] == "alloc") - sum(
        e["size"] for e in trace if e["action"] == "free_completed"
    )
    live = peak = end - net
    for e in trace:
        if e["action"] == "alloc":
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            live -= e["size"]
    assert live == end
    return peak


def test_a_snapshot_is_private_served_to_token_holders_and_deleted_with_its_probe(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with Receiver() as receiver:
        settings = AgentSettings(
            data_dir=data_dir,
            tokens=(b"t",),
            callback_allow_list=(f"http://127.0.0.1:{receiver.port}",),
        )
        with TestClient(create_agent_app(settings)) as client:
            probe_id = _submit(
                client,
                memory_snapshot=True,
                callback={"url": f"http://127.0.0.1:{receiver.port}/hook"},
            )
            plain_id = _submit(client)  # no snapshot asked for
            doc = _wait(client, probe_id)
            assert doc["status"] == "succeeded", doc
            result = doc["result"]
            info = result["snapshot"]
            assert result["snapshot_error"] is None

            # The file: under data_dir/snapshots, the directory 0700, the file 0600.
            path = data_dir / "snapshots" / f"{probe_id}.pickle"
            assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            raw = path.read_bytes()
            assert info["bytes"] == len(raw)
            assert info["trigger"] == "measured"
            assert info["format"] == "torch.cuda.memory._snapshot pickle"
            assert info["expires_at"] == os.stat(path).st_mtime + settings.snapshot_retention_s

            # Only token holders get it.
            url = f"/v1/probes/{probe_id}/snapshot"
            assert client.get(url).status_code == 401
            assert client.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
            r = client.get(url, headers=AUTH)
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/octet-stream"
            assert r.headers["content-disposition"] == f'attachment; filename="{probe_id}.pickle"'
            assert r.content == raw

            # A snapshot memory_viz reads, whose timeline peaks at the measured peak.
            snapshot = pickle.loads(r.content)
            assert set(snapshot) == {"segments", "device_traces"}
            trace = snapshot["device_traces"][0]
            assert len(trace) == info["entries"] > 0
            assert {e["action"] for e in trace} == {"alloc", "free_requested", "free_completed"}
            assert _timeline_peak(snapshot) == result["torch"]["allocated_peak_bytes"]
            from torch.cuda import _memory_viz as viz

            assert "Active Memory Timeline" in viz.trace_plot(snapshot)
            assert "Allocator State History" in viz.segment_plot(snapshot)
            summary = viz.segsum(snapshot)
            assert f"segments: {len(snapshot['segments'])}" in summary
            assert viz.trace(snapshot).startswith("Device 0 ----------------")
            flame = viz.memory(snapshot, format_flamegraph=lambda lines: lines)
            assert sum(int(line.rsplit(" ", 1)[1]) for line in flame.splitlines()) == sum(
                seg["allocated_size"] for seg in snapshot["segments"]
            )

            # The callback carries the metadata and nothing of the file.
            deadline = time.monotonic() + 30
            while not receiver.requests and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(receiver.requests) == 1
            body = receiver.requests[0][1]
            payload = json.loads(body)
            assert payload["data"]["result"]["snapshot"] == info
            assert str(data_dir).encode() not in body
            assert base64.b64encode(raw[:48]) not in body and raw[:48] not in body
            assert len(body) < len(raw)

            # 404s name what is missing.
            r = client.get("/v1/probes/0123/snapshot", headers=AUTH)
            assert r.status_code == 404 and "no probe '0123'" in r.json()["detail"]
            assert r.headers["content-type"].startswith("application/problem+json")
            r = client.get(f"/v1/probes/{plain_id}/snapshot", headers=AUTH)
            assert r.status_code == 404
            assert "did not ask for a memory snapshot" in r.json()["detail"]

            # DELETE removes it, and the result says so.
            assert client.delete(f"/v1/probes/{probe_id}", headers=AUTH).status_code == 202
            assert not path.exists()
            r = client.get(url, headers=AUTH)
            assert r.status_code == 404 and "deleted by request" in r.json()["detail"]
            after = client.get(f"/v1/probes/{probe_id}", headers=AUTH).json()
            assert after["status"] == "succeeded"
            assert after["result"]["snapshot"] is None
            assert after["result"]["snapshot_error"] == "deleted by request"
            assert os.listdir(data_dir / "snapshots") == []
            _wait(client, plain_id)


def test_an_oversize_snapshot_is_not_kept_and_the_result_says_why(tmp_path: Path) -> None:
    settings = AgentSettings(data_dir=tmp_path, tokens=(b"t",), snapshot_max_bytes=1000)
    with TestClient(create_agent_app(settings)) as client:
        probe_id = _submit(client, memory_snapshot=True)
        doc = _wait(client, probe_id)
        assert doc["status"] == "succeeded", doc
        assert doc["result"]["snapshot"] is None
        error = doc["result"]["snapshot_error"]
        assert "over the agent's cap of 1000 (VRAMBUDGET_AGENT_SNAPSHOT_MAX_BYTES)" in error
        assert os.listdir(tmp_path / "snapshots") == []
        r = client.get(f"/v1/probes/{probe_id}/snapshot", headers=AUTH)
        assert r.status_code == 404 and "over the agent's cap of 1000" in r.json()["detail"]


def test_an_out_of_memory_keeps_an_oom_snapshot(tmp_path: Path) -> None:
    settings = AgentSettings(data_dir=tmp_path, tokens=(b"t",))
    with TestClient(create_agent_app(settings)) as client:
        probe_id = _submit(client, memory_snapshot=True, memory_limit_bytes=2 << 20)
        doc = _wait(client, probe_id)
        assert doc["status"] == "oom", doc
        assert doc["result"]["snapshot"]["trigger"] == "oom"
        r = client.get(f"/v1/probes/{probe_id}/snapshot", headers=AUTH)
        last = pickle.loads(r.content)["device_traces"][0][-1]
        # The tracker's message: "tried to allocate N bytes with L live of a 2097152-byte limit".
        message = doc["result"]["message"]
        requested = int(message.split("tried to allocate ")[1].split(" ")[0])
        live = int(message.split(" with ")[1].split(" ")[0])
        assert last == {
            "action": "oom",
            "size": requested,
            "device_free": (2 << 20) - live,
            "stream": 0,
            "frames": [],
        }


def test_expired_snapshots_are_deleted_at_start_periodically_and_when_asked_for(
    tmp_path: Path,
) -> None:
    """Polled, not slept: on a loaded machine the start or a sweep may come late. ``a`` is
    written just before the start, so it outlives the start's sweep by ``retention`` less the
    start-up time; ``b`` is expired from the first."""
    retention = 3.0
    child = ChildSettings(
        snapshot_path=snapshot_path(tmp_path, "a" * 32), snapshot_retention_s=retention
    )
    info, error = write_snapshot({"segments": [], "device_traces": [[]]}, child, "measured")
    assert error is None and info is not None
    old = Path(snapshot_path(tmp_path, "b" * 32))
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 3 * retention, time.time() - 3 * retention))
    settings = AgentSettings(data_dir=tmp_path, tokens=(b"t",), snapshot_retention_s=retention)
    listing = lambda: sorted(os.listdir(tmp_path / "snapshots"))  # noqa: E731
    with TestClient(create_agent_app(settings)):
        # at start: the expired one goes, the fresh one stays
        assert _within(retention / 2, lambda: listing() == [f"{'a' * 32}.pickle"]), listing()
        # the sweep runs every retention period when that is shorter than its default
        assert _within(3 * retention, lambda: listing() == []), listing()
    # On request, an expired file is deleted even before a sweep reaches it.
    fresh = Path(snapshot_path(tmp_path, "c" * 32))
    fresh.write_bytes(b"y")
    now = time.time()
    assert snapshot_file(tmp_path, "c" * 32, 60, now) == fresh
    assert snapshot_file(tmp_path, "c" * 32, 60, now + 61) is None
    assert not fresh.exists()
    assert expire_snapshots(tmp_path, 60, now) == []
    assert snapshot_file(tmp_path, "../x", 60, now) is None  # no path outside the directory


def _within(seconds: float, condition: Any) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_agent_keeps_a_file_only_when_the_stored_result_describes_it(tmp_path: Path) -> None:
    probe_id = "d" * 32
    path = Path(snapshot_path(tmp_path, probe_id))
    path.write_bytes(b"left by a killed child")
    assert settle_snapshot(AgentSettings(data_dir=tmp_path), probe_id, None) is None
    assert not path.exists()

    path.write_bytes(b"stray")
    bare = ProbeResult(
        device="cpu",
        device_name="cpu",
        torch_version=None,
        cuda_version=None,
        driver_version=None,
        torch=None,
        nvml=None,
        host_peak_rss_bytes=0,
        iterations=Iteration(p50_s=0, p95_s=0, count=0, throughput_per_s=0, errors=0),
        outputs_finite=True,
    )
    settled = settle_snapshot(
        AgentSettings(data_dir=tmp_path), probe_id, msgspec.json.encode(bare).decode()
    )
    assert settled is not None and not path.exists()
    assert msgspec.json.decode(settled, type=ProbeResult).snapshot_error == (
        "this probe recorded no memory snapshot (no PyTorch allocator in its child)"
    )
    assert not remove_snapshot(tmp_path, probe_id)


def test_the_recorder_snapshot_is_the_cuda_snapshot_shape() -> None:
    events = [
        (ALLOC, 1, 100, 0),  # before the history: live at the start, freed in it
        (ALLOC, 2, 0, 0),  # a zero-byte storage: owns no memory, left out
        (ALLOC, 3, 64, 1),
        (FREE, 1, 0, 1),
        (ALLOC, 4, 32, 1),
    ]
    addresses = {1: 4096, 2: 0, 3: 8192, 4: 4096}
    snap = recorder_snapshot(
        events,
        addresses,
        sources={3: "transformers/models/llama/modeling_llama.py:120 forward"},
        tags={3: "activations"},
        start=2,
    )
    frame = {"filename": "transformers/models/llama/modeling_llama.py", "line": 120}
    assert snap["device_traces"] == [
        [
            {
                "action": "alloc",
                "addr": 8192,
                "size": 64,
                "stream": 0,
                "frames": [{**frame, "name": "forward"}],
                "category": "activations",
            },
            {"action": "free_requested", "addr": 4096, "size": 100, "stream": 0, "frames": []},
            {"action": "free_completed", "addr": 4096, "size": 100, "stream": 0, "frames": []},
            {
                "action": "alloc",
                "addr": 4096,
                "size": 32,
                "stream": 0,
                "frames": [],
                "category": "unknown",
            },
        ]
    ]
    assert [(s["address"], s["total_size"]) for s in snap["segments"]] == [(4096, 32), (8192, 64)]
    assert all(
        s["blocks"] == [{"address": s["address"], "size": s["total_size"],
                         "requested_size": s["total_size"], "state": "active_allocated",
                         "frames": s["frames"]}]
        for s in snap["segments"]
    )  # fmt: skip
    newest = recorder_snapshot(events, addresses, start=2, max_entries=2, oom=(10, 5))
    assert [e["action"] for e in newest["device_traces"][0]] == ["alloc", "oom"]
    assert newest["device_traces"][0][1]["size"] == 10


def test_snapshot_settings_from_the_environment() -> None:
    s = AgentSettings.from_env(
        {
            "VRAMBUDGET_AGENT_SNAPSHOT_MAX_BYTES": "1048576",
            "VRAMBUDGET_AGENT_SNAPSHOT_MAX_ENTRIES": "500",
            "VRAMBUDGET_AGENT_SNAPSHOT_RETENTION_S": "3600",
        }
    )
    assert (s.snapshot_max_bytes, s.snapshot_max_entries, s.snapshot_retention_s) == (
        1 << 20,
        500,
        3600.0,
    )
    defaults = AgentSettings()
    assert (defaults.snapshot_max_bytes, defaults.snapshot_max_entries) == (256 << 20, 100_000)
    assert defaults.snapshot_retention_s == 7 * 86_400
    child = ChildSettings.of(s, snapshot_path="/x")
    assert (child.snapshot_max_bytes, child.snapshot_max_entries) == (1 << 20, 500)
    for name, value in (
        ("SNAPSHOT_MAX_BYTES", "0"),
        ("SNAPSHOT_MAX_ENTRIES", "0"),
        ("SNAPSHOT_RETENTION_S", "0"),
        ("SNAPSHOT_MAX_BYTES", "lots"),
    ):
        with pytest.raises(AgentSettingsError, match=f"VRAMBUDGET_AGENT_{name}"):
            AgentSettings.from_env({f"VRAMBUDGET_AGENT_{name}": value})
