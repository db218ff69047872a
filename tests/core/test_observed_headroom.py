"""Headroom from observation (vrambudget/core/compare/observed.py), against hand computations."""

from __future__ import annotations

import msgspec

from tests.support.workloads import INFER, TRAIN
from vrambudget.core.compare.observed import observed_headroom, peak_of, same_workload
from vrambudget.core.probe_report import DeviceView, Iteration, ProbeRequest, ProbeResult, TorchView


def _result(
    allocated: int,
    iterations: tuple[int, ...] = (),
    reserved: int | None = None,
    nvml: tuple[int, int] | None = None,
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
            process_peak_used_bytes=None,
            accounting_max_memory_bytes=None,
            cuda_context_bytes=0,
            others_changed_bytes=0,
            others_visible=True,
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


def test_same_workload() -> None:
    a = msgspec.convert({"workload": INFER}, ProbeRequest)
    assert same_workload(a, msgspec.convert({"workload": INFER, "iterations": 9}, ProbeRequest))
    assert not same_workload(a, msgspec.convert({"workload": TRAIN}, ProbeRequest))
    assert not same_workload(
        a, msgspec.convert({"workload": INFER, "concurrency": 2}, ProbeRequest)
    )
