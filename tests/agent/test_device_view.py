"""The device view the agent reports and the headroom it advises from it: the child's baseline,
read before the workload, survives the parent's merge of its NVML samples (whose own first
reading, taken when the load phase began, is ``load_baseline_used_bytes``), so the peak is what
the device held for the whole workload, not what the load phase added."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec

from tests.support.workloads import INFER
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.engine.load import LoadResult
from vrambudget.agent.engine.run import _result as engine_result
from vrambudget.agent.overlap import _merge as overlap_merge
from vrambudget.agent.runner import ChildResult, ProbeProcess
from vrambudget.agent.sampler import SamplerResult
from vrambudget.core.compare.observed import observed_headroom
from vrambudget.core.probe_engine import EngineReport
from vrambudget.core.probe_report import (
    DeviceView,
    Iteration,
    ProbeRequest,
    ProbeResult,
    TorchView,
)

GiB, MiB = 1 << 30, 1 << 20
L4_TOTAL = 24 * GiB
_LATENCY = {"p50_s": 0.5, "p95_s": 0.6, "p99_s": 0.7, "count": 10}


def _samples(baseline: int, peak: int, process_peak: int | None = None) -> SamplerResult:
    return SamplerResult(
        baseline_used_bytes=baseline,
        peak_used_bytes=peak,
        min_used_bytes=baseline,
        final_used_bytes=baseline,
        samples=100,
        failed_samples=0,
        mean_interval_s=0.005,
        max_interval_s=0.01,
        memory_api="v2",
        process_peak_bytes=process_peak,
        others_changed_bytes=0,
        others_changed=False,
        others_visible=process_peak is not None,
    )


def _merged(child: ProbeResult, samples: SamplerResult) -> ProbeResult:
    """``ProbeProcess._merge`` as the agent runs it when the child's result arrives."""
    p = ProbeProcess(b"{}", ChildSettings(), 10)
    p._samples = samples
    out = p._merge("succeeded", msgspec.json.encode(child), None)
    assert out.status == "succeeded", out.error
    return msgspec.json.decode(out.result_json or b"", type=ProbeResult)


def _engine_child(baseline: int) -> ProbeResult:
    """The engine child's result, built by engine/run.py's own ``_result``."""
    report = msgspec.convert(
        {
            "engine": "vllm",
            "command": ["vllm", "serve", "x"],
            "started": True,
            "startup_s": 30.0,
            "exit_code": None,
            "startup": {},
            "expected": None,
            "requests": 10,
            "errors": 0,
            "preemptions": 0,
            "ttft": _LATENCY,
            "inter_token": _LATENCY,
            "end_to_end": _LATENCY,
            "output_tokens_per_s": 100.0,
            "requests_per_s": 2.0,
            "prompt_tokens": 1000,
            "output_tokens": 100,
        },
        EngineReport,
    )
    gpu = SimpleNamespace(name="NVIDIA L4", memory_total_bytes=L4_TOTAL, compute_capability="8.9")
    inv = SimpleNamespace(driver_version="550.54")
    return engine_result(None, inv, gpu, baseline, report, LoadResult(), None)  # type: ignore[arg-type]


def test_an_engine_probe_s_headroom_rests_on_what_the_engine_held() -> None:
    # 1 GiB in use before the engine; the engine took 20 GiB (weights, KV pool, graphs) before
    # the load began, and 40 MiB more under load.
    res = _merged(_engine_child(1 * GiB), _samples(21 * GiB, 21 * GiB + 40 * MiB))
    assert res.nvml is not None
    assert res.nvml.baseline_used_bytes == 1 * GiB
    assert res.nvml.load_baseline_used_bytes == 21 * GiB
    assert res.nvml.peak_used_bytes == 21 * GiB + 40 * MiB
    h = observed_headroom(res, [])
    assert h is not None
    held = 20 * GiB + 40 * MiB  # 21 GiB + 40 MiB - 1 GiB
    assert h.peak_bytes == held and h.basis.startswith(f"NVML device used peak {held} B")
    # one observation: the 2 % floor, ceil(0.02 x held)
    assert h.advised_bytes == -(-2 * held // 100)
    # AGENT.md's verdict check now says what it means: 20.04 GiB + 2 % fits 24 GiB ...
    assert h.peak_bytes + h.advised_bytes <= L4_TOTAL
    # ... and an engine of 23.6 GiB does not (the load-phase-only peak said 40 MiB for both).
    big = _merged(_engine_child(1 * GiB), _samples(24 * GiB + 600 * MiB, 24 * GiB + 640 * MiB))
    hb = observed_headroom(big, [])
    assert hb is not None and hb.peak_bytes + hb.advised_bytes > L4_TOTAL


def test_an_engine_probe_whose_device_did_not_grow_under_load_still_has_headroom() -> None:
    res = _merged(_engine_child(1 * GiB), _samples(21 * GiB, 21 * GiB))
    h = observed_headroom(res, [])
    assert h is not None and h.peak_bytes == 20 * GiB


def _cuda_child(baseline: int, context: int) -> ProbeResult:
    """A CUDA PyTorch probe's child result, its DeviceView as probe_cuda.py builds it."""
    return ProbeResult(
        device="cuda",
        device_name="NVIDIA L4",
        torch_version="2.13.0",
        cuda_version="13.0",
        driver_version="580",
        torch=TorchView(
            allocated_peak_bytes=15 * GiB,
            reserved_peak_bytes=16 * GiB,
            num_alloc_retries=0,
            num_ooms=0,
            inactive_split_peak_bytes=0,
            weights_bytes=14 * GiB,
            kv_cache_bytes=None,
            iteration_peak_bytes=(15 * GiB, 15 * GiB),
        ),
        nvml=DeviceView(
            baseline_used_bytes=baseline,
            peak_used_bytes=0,
            samples=0,
            sample_interval_s=0.0,
            max_sample_interval_s=0.0,
            process_peak_used_bytes=None,
            accounting_max_memory_bytes=None,
            cuda_context_bytes=context,
            others_changed_bytes=0,
            others_visible=False,
        ),
        host_peak_rss_bytes=0,
        iterations=Iteration(p50_s=0.1, p95_s=0.1, count=2, throughput_per_s=10.0, errors=0),
        outputs_finite=True,
        memory_total_bytes=L4_TOTAL,
    )


def test_a_cuda_probe_s_headroom_counts_its_weights() -> None:
    # Before: 500 MiB in use; the context 400 MiB; weights and cache to 16 GiB reserved; the
    # load began at 17 GiB + 400 MiB (already holding the weights) and peaked 300 MiB higher.
    child = _cuda_child(500 * MiB, 400 * MiB)
    peak = 17 * GiB + 700 * MiB
    # NVML listed the process: its own peak (the whole process: context, cache, weights)
    own = 17 * GiB + 200 * MiB
    res = _merged(child, _samples(17 * GiB + 400 * MiB, peak, process_peak=own))
    assert res.nvml is not None and res.nvml.baseline_used_bytes == 500 * MiB
    assert res.nvml.cuda_context_bytes == 400 * MiB  # measured against the same baseline
    h = observed_headroom(res, [])
    assert h is not None and (h.peak_bytes, h.basis.split(" peak")[0]) == (own, "NVML process used")
    # a PID namespace hides the process: the device's peak over the pre-workload baseline
    res = _merged(child, _samples(17 * GiB + 400 * MiB, peak))
    h = observed_headroom(res, [])
    assert h is not None and h.peak_bytes == peak - 500 * MiB
    assert h.basis.startswith("NVML device used")


def test_an_overlap_counts_from_the_earliest_job_s_baseline() -> None:
    req = msgspec.convert({"workload": INFER, "overlap": [INFER]}, ProbeRequest)
    assert len(req.overlap) == 1
    main = _merged(_cuda_child(2 * GiB, 400 * MiB), _samples(30 * GiB, 33 * GiB, 16 * GiB))
    # the member read its baseline first (500 MiB), before either job's context
    member = _merged(_cuda_child(500 * MiB, 400 * MiB), _samples(30 * GiB, 34 * GiB, 15 * GiB))
    out = overlap_merge(
        ChildResult("succeeded", msgspec.json.encode(main), None),
        [ChildResult("succeeded", msgspec.json.encode(member), None)],
    )
    res = msgspec.json.decode(out.result_json or b"", type=ProbeResult)
    assert res.nvml is not None
    assert (res.nvml.baseline_used_bytes, res.nvml.peak_used_bytes) == (500 * MiB, 34 * GiB)
    h = observed_headroom(res, [])
    # both jobs together, not the main process's 16 GiB
    assert h is not None and h.peak_bytes == 34 * GiB - 500 * MiB
    assert h.basis.startswith("NVML device used")
