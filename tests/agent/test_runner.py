"""The parent side of a probe: the NVML sampler runs in the agent around the child's load
phase (start/stop messages from the child), and its samples land in the device view."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from tests.support.workloads import TINIEST
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.runner import ProbeProcess
from vrambudget.agent.spec import DeviceView, ProbeRequest, ProbeResult

TINY = TINIEST


class _FakeSampler:
    calls: ClassVar[list[str]] = []

    def __init__(self, pids: frozenset[int], devices: tuple[int, ...]) -> None:
        self.pids, self.devices = pids, devices

    def start(self) -> None:
        (pid,) = self.pids  # the child's own, on the probe's device
        _FakeSampler.calls.append(f"start {pid > 0} {self.devices}")

    def stop(self) -> object:
        _FakeSampler.calls.append("stop")
        return msgspec.Struct  # never read on the CPU path (no device view to merge into)


def test_sampler_brackets_the_load_phase() -> None:
    _FakeSampler.calls = []
    req = msgspec.convert(
        {
            "workload": {
                "kind": "inference",
                "model": TINY,
                "prompt_tokens": 8,
                "generated_tokens": 2,
            },
            "iterations": 1,
        },
        ProbeRequest,
    )
    p = ProbeProcess(msgspec.json.encode(req), ChildSettings(), 60, _FakeSampler)
    p.start()
    out = p.wait()
    assert out.status == "succeeded", out.error
    assert _FakeSampler.calls == ["start True ()", "stop"]


def test_merge_fills_the_device_view_and_flags_others() -> None:
    class Samples:
        baseline_used_bytes, peak_used_bytes, samples = 1000, 9000, 42
        mean_interval_s, max_interval_s, process_peak_bytes = 0.005, 0.009, 7000
        others_changed_bytes, others_visible = 100 << 20, True

    view = DeviceView(
        baseline_used_bytes=0,
        peak_used_bytes=0,
        samples=0,
        sample_interval_s=0,
        max_sample_interval_s=0,
        process_peak_used_bytes=None,
        accounting_max_memory_bytes=None,
        cuda_context_bytes=5,
        others_changed_bytes=0,
        others_visible=False,
    )
    result = msgspec.convert(
        {
            "device": "cuda",
            "device_name": "x",
            "torch_version": "2.13",
            "cuda_version": "12.8",
            "driver_version": None,
            "nvml": msgspec.to_builtins(view),
            "host_peak_rss_bytes": 1,
            "torch": {
                "allocated_peak_bytes": 1,
                "reserved_peak_bytes": 2,
                "num_alloc_retries": 0,
                "num_ooms": 0,
                "inactive_split_peak_bytes": 0,
                "weights_bytes": 1,
                "kv_cache_bytes": None,
            },
            "iterations": {"p50_s": 0, "p95_s": 0, "count": 1, "throughput_per_s": 1, "errors": 0},
            "outputs_finite": True,
        },
        ProbeResult,
    )
    p = ProbeProcess(b"{}", ChildSettings(), 1)
    p._samples = Samples()
    out = p._merge("succeeded", msgspec.json.encode(result), None)
    merged = msgspec.json.decode(out.result_json or b"", type=ProbeResult)
    assert merged.nvml is not None and merged.nvml.peak_used_bytes == 9000
    assert merged.nvml.samples == 42 and merged.nvml.cuda_context_bytes == 5
    assert out.status == "unreliable" and "104857600 bytes" in (out.error or "")
