"""Headroom from observation (vrambudget/core/compare/observed.py), against hand computations."""

from __future__ import annotations

import msgspec

from tests.support.workloads import INFER, TRAIN
from vrambudget.core.compare.observed import observed_headroom, peak_of, same_workload
from vrambudget.core.probe_report import (
    DeviceView,
    Iteration,
    OverlapMember,
    ProbeRequest,
    ProbeResult,
    TorchView,
)


def _result(
    allocated: int,
    iterations: tuple[int, ...] = (),
    reserved: int | None = None,
    nvml: tuple[int, int] | None = None,
    *,
    load_baseline: int | None = 0,
    process_peak: int | None = None,
) -> ProbeResult:
    return ProbeResult(
        device="cuda" if reserved is not None else "cpu",
        device_name="x",
        torch_version="2.13.0",
        cuda_version=None,
        driver_version=None,
        torch=TorchView(
            allocated_peak_bytes=allocated,
            reserved_peak_bytes=reserved,
            num_alloc_retries=None,
            num_ooms=0,
            inactive_split_peak_bytes=None,
            weights_bytes=0,
            kv_cache_bytes=None,
            iteration_peak_bytes=iterations,
        ),
        nvml=None
        if nvml is None
        else DeviceView(
            baseline_used_bytes=nvml[0],
            peak_used_bytes=nvml[1],
            samples=10,
            sample_interval_s=0.005,
            max_sample_interval_s=0.01,
            process_peak_used_bytes=process_peak,
            accounting_max_memory_bytes=None,
            cuda_context_bytes=0,
            others_changed_bytes=0,
            others_visible=True,
            load_baseline_used_bytes=load_baseline,
        ),
        host_peak_rss_bytes=0,
        iterations=Iteration(
            p50_s=0.1, p95_s=0.1, count=len(iterations), throughput_per_s=1.0, errors=0
        ),
        outputs_finite=True,
    )


def test_iteration_spread_plus_floor() -> None:
    # peaks 1000, 1100, 1050: spread 100; floor ceil(0.02 x 1100) = 22; advised 122.
    h = observed_headroom(_result(1100, (1000, 1100, 1050)), [])
    assert h is not None
    assert (h.peak_bytes, h.iteration_spread_bytes, h.probe_spread_bytes) == (1100, 100, None)
    assert (h.advised_bytes, h.iterations, h.probes) == (122, 3, 1)
    assert h.advised_fraction == round(122 / 1100, 6)
    assert "3 measured iterations varied by 100 B" in h.basis


def test_probe_spread_takes_the_larger_and_the_top_peak() -> None:
    # This probe 1100 (iterations spread 10), earlier 900 and 1300: probe spread 400 over the
    # top 1300; floor ceil(26) = 26; advised 426.
    h = observed_headroom(
        _result(1100, (1090, 1100)), [_result(900, (900, 900)), _result(1300, (1300,))]
    )
    assert h is not None
    assert (h.peak_bytes, h.probe_spread_bytes, h.iteration_spread_bytes) == (1300, 400, 10)
    assert (h.advised_bytes, h.probes) == (426, 3)


def test_views_are_not_mixed_and_nvml_wins() -> None:
    cuda = _result(1000, (1000,), reserved=1200, nvml=(500, 2500))
    assert peak_of(cuda) == (2000, "NVML device used")
    assert peak_of(_result(1000, reserved=1200)) == (1200, "PyTorch reserved")
    # An earlier CPU-view result does not count beside an NVML one.
    h = observed_headroom(cuda, [_result(5000)])
    assert h is not None and h.probes == 1 and h.probe_spread_bytes is None
    # One observation: the floor alone, said in words.
    assert h.advised_bytes == 40 and "one observation" in h.basis


def test_the_device_view_counts_from_the_pre_workload_baseline() -> None:
    # Baseline 1 GiB before the workload, 20 GiB when the load began, peak 21 GiB + 40 MiB:
    # the workload held 20 GiB + 40 MiB, not the 40 MiB the load phase added.
    gib, mib = 1 << 30, 1 << 20
    r = _result(1000, reserved=1200, nvml=(gib, 21 * gib + 40 * mib), load_baseline=21 * gib)
    assert peak_of(r) == (20 * gib + 40 * mib, "NVML device used")


def test_the_process_view_where_nvml_saw_the_one_process() -> None:
    r = _result(1000, reserved=1200, nvml=(500, 2500), process_peak=1800)
    assert peak_of(r) == (1800, "NVML process used")
    # an engine probe's memory sits in its workers, an overlap's in every job: the device view
    from vrambudget.core.probe_engine import EngineReport

    engine = msgspec.structs.replace(r, engine=msgspec.convert(_ENGINE, EngineReport))
    assert peak_of(engine) == (2000, "NVML device used")
    overlap = msgspec.structs.replace(r, overlap=(OverlapMember(index=0, status="succeeded"),))
    assert peak_of(overlap) == (2000, "NVML device used")


def test_a_device_view_the_sampler_did_not_fill_is_not_used() -> None:
    # no load-phase reading: no sampler ran (or the row predates the field, when the baseline
    # stored was the load phase's): PyTorch's view
    r = _result(1000, reserved=1200, nvml=(500, 2500), load_baseline=None, process_peak=1800)
    assert peak_of(r) == (1200, "PyTorch reserved")


def test_same_workload() -> None:
    a = msgspec.convert({"workload": INFER}, ProbeRequest)
    assert same_workload(a, msgspec.convert({"workload": INFER, "iterations": 9}, ProbeRequest))
    assert not same_workload(a, msgspec.convert({"workload": TRAIN}, ProbeRequest))
    assert not same_workload(
        a, msgspec.convert({"workload": INFER, "concurrency": 2}, ProbeRequest)
    )


_LATENCY = {"p50_s": 0.1, "p95_s": 0.1, "p99_s": 0.1, "count": 1}
_ENGINE = {
    "engine": "vllm",
    "command": ["vllm", "serve"],
    "started": True,
    "startup_s": 1.0,
    "exit_code": None,
    "startup": {},
    "expected": None,
    "requests": 1,
    "errors": 0,
    "preemptions": None,
    "ttft": _LATENCY,
    "inter_token": _LATENCY,
    "end_to_end": _LATENCY,
    "output_tokens_per_s": 1.0,
    "requests_per_s": 1.0,
    "prompt_tokens": 1,
    "output_tokens": 1,
}
