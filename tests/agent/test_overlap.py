"""Several workloads at once on one device (vrambudget/agent/overlap.py): each in its own child,
their load phases started together; the probe's result carries each one's."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from tests.support.workloads import INFER, TRAIN
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.overlap import ProbeGroup, member_request
from vrambudget.agent.runner import ProbeProcess
from vrambudget.core.probe_report import ProbeRequest, ProbeResult

pytest.importorskip("torch")


def _solo(workload: dict[str, object]) -> ProbeResult:
    req = msgspec.convert({"workload": workload, "iterations": 2}, ProbeRequest)
    p = ProbeProcess(msgspec.json.encode(req), ChildSettings(), 120)
    p.start()
    out = p.wait()
    assert out.status == "succeeded", out.error
    assert out.result_json is not None
    return msgspec.json.decode(out.result_json, type=ProbeResult)


def test_overlapping_jobs_each_report_their_own_peak() -> None:
    """On the CPU each job's tracker sees its own process only: each overlapping job's
    allocated peak equals the same workload's peak run alone, to the byte."""
    req = msgspec.convert(
        {"workload": INFER, "iterations": 2, "overlap": [TRAIN, INFER]}, ProbeRequest
    )
    group = ProbeGroup(req, ChildSettings(), None, lambda jobs: [None] * len(jobs))
    group.start()
    out = group.wait()
    assert out.status == "succeeded", out.error
    assert out.result_json is not None
    result = msgspec.json.decode(out.result_json, type=ProbeResult)
    assert [m.index for m in result.overlap] == [0, 1]
    assert [m.status for m in result.overlap] == ["succeeded", "succeeded"]
    solo_infer, solo_train = _solo(INFER), _solo(TRAIN)
    assert result.torch is not None and solo_infer.torch is not None
    assert result.torch.allocated_peak_bytes == solo_infer.torch.allocated_peak_bytes
    train = result.overlap[0].result
    assert train is not None and train.torch is not None and solo_train.torch is not None
    assert train.torch.allocated_peak_bytes == solo_train.torch.allocated_peak_bytes
    infer = result.overlap[1].result
    assert infer is not None and infer.torch is not None
    assert infer.torch.allocated_peak_bytes == solo_infer.torch.allocated_peak_bytes


def test_a_job_that_fails_before_its_load_does_not_hold_the_others() -> None:
    """The failing job ends; the barrier is broken, so the others run without waiting for the
    time limit."""
    bad = {**INFER, "model": {"source": "preset", "id": "llama-3.1-8b"}, "batch_size": 1}
    req = msgspec.convert(
        {
            "workload": INFER,
            "iterations": 1,
            "overlap": [bad],
            "time_limit_s": 120,
            # A cap that the 8B model's weights cannot fit: its job fails in the build.
            "memory_limit_bytes": 64 << 20,
        },
        ProbeRequest,
    )
    assert member_request(req, 0).workload == req.overlap[0]
    t0 = time.monotonic()
    group = ProbeGroup(req, ChildSettings(), None, lambda jobs: [None] * len(jobs))
    group.start()
    out = group.wait()
    elapsed = time.monotonic() - t0
    assert out.status == "succeeded", out.error
    assert out.result_json is not None
    result = msgspec.json.decode(out.result_json, type=ProbeResult)
    (member,) = result.overlap
    assert member.status in ("oom", "failed")
    assert elapsed < 60, elapsed


def test_member_requests_report_nowhere() -> None:
    req = msgspec.convert(
        {
            "workload": INFER,
            "overlap": [TRAIN],
            "memory_snapshot": True,
            "callback": {"url": "https://hooks.example.com/x"},
            "service_url": "https://vrambudget.example.com",
            "concurrency": 2,
        },
        ProbeRequest,
    )
    m = member_request(req, 0)
    assert (m.callback, m.service_url, m.memory_snapshot, m.overlap, m.quality) == (
        None,
        None,
        False,
        (),
        None,
    )
    assert m.concurrency == 1 and m.iterations == req.iterations


def test_overlap_members_are_checked_at_submission(tmp_path: Path) -> None:
    """A refused overlapping job is a 422 naming its position, like the probe's own."""
    from litestar.testing import TestClient

    from vrambudget.agent.api import create_agent_app
    from vrambudget.agent.settings import AgentSettings

    app = create_agent_app(AgentSettings(tokens=(b"t",), data_dir=tmp_path))
    auth = {"Authorization": "Bearer t"}
    unknown = {**INFER, "model": {"source": "preset", "id": "no-such-model"}}
    custom = {"kind": "custom", "entry_point": "nope"}
    with TestClient(app) as client:
        r = client.post(
            "/v1/probes", json={"workload": INFER, "overlap": [INFER, unknown]}, headers=auth
        )
        assert r.status_code == 422, r.text
        assert "$.overlap[1].model" in r.text
        r = client.post("/v1/probes", json={"workload": INFER, "overlap": [custom]}, headers=auth)
        assert r.status_code == 422 and "$.overlap[0].entry_point" in r.text
        r = client.post(
            "/v1/probes", json={"workload": INFER, "overlap": [INFER] * 8}, headers=auth
        )
        assert r.status_code in (400, 422) and "overlap" in r.text
