"""The CUDA path of a probe, for real: skipped (with the reason) on hosts without CUDA.

It checks what only a GPU can show: the torch view is present and ordered (allocated peak <=
reserved peak), NVML saw the load phase from the agent process, the CUDA context has a size,
and the trace tier's predicted peak allocated is within 10% of what the allocator reported.
"""

from __future__ import annotations

import msgspec
import pytest
import torch

from vrambudget.agent import nvml
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.runner import ProbeProcess
from vrambudget.agent.sampler import NVMLSampler
from vrambudget.agent.spec import ProbeRequest, ProbeResult
from vrambudget.core.spec import BudgetRequest, Workload
from vrambudget.trace.engine import trace_budget_with_replays

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (this host has none)"),
]

SPEC = {
    "kind": "inference",
    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
    "batch_size": 4,
    "prompt_tokens": 512,
    "generated_tokens": 16,
}


def test_cuda_probe_reports_both_views_and_matches_the_trace() -> None:
    req = msgspec.convert({"workload": SPEC, "iterations": 2}, ProbeRequest)
    handle, _ = nvml.resolve_device(0)
    p = ProbeProcess(
        msgspec.json.encode(req), ChildSettings(), 300, lambda pid: NVMLSampler(handle, pid=pid)
    )
    p.start()
    out = p.wait()
    assert out.status == "succeeded", out.error
    result = msgspec.json.decode(out.result_json or b"", type=ProbeResult)
    assert result.device == "cuda" and result.outputs_finite
    t = result.torch
    assert t.reserved_peak_bytes is not None and t.allocated_peak_bytes <= t.reserved_peak_bytes
    assert result.nvml is not None and result.nvml.samples > 10
    assert result.nvml.cuda_context_bytes > 0
    w = msgspec.convert(SPEC, Workload)
    _, (replay,) = trace_budget_with_replays(BudgetRequest(workloads=(w,), method="trace"))
    assert abs(replay.peak_allocated_bytes - t.allocated_peak_bytes) <= (
        0.10 * t.allocated_peak_bytes
    )
