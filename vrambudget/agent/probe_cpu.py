"""The probe on a host without CUDA: the trace tier's dispatch-mode tracker, run on real
tensors, stands in for the allocator counters (``device: cpu``). Runs in the child; torch is
imported lazily."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .child import ChildSettings
from .probe_run import (
    _iterations,
    _kv_bytes,
    _load,
    _own_pid,
    _peak_rss_bytes,
    _program,
    _wait_for_others,
)
from .snapshots import recorder_snapshot_fields
from .spec import ProbeRequest, ProbeResult, TorchView


def _measure_cpu(
    req: ProbeRequest, child: ChildSettings, notify: Callable[[tuple[str, Any]], None]
) -> ProbeResult:
    import torch

    from vrambudget.trace.recorder import Recorder

    snapshot = child.snapshot_path is not None  # memory_snapshot: addresses and source lines
    recorder = Recorder(limit_bytes=req.memory_limit_bytes, sources=snapshot, addresses=snapshot)
    start = 0  # the snapshot's history begins with the warm-up
    device = torch.device("cpu")
    program: Any = None
    weights = 0
    units = req.workload.num_sequences if hasattr(req.workload, "num_sequences") else 1

    iteration_peaks: list[int] = []
    per_iteration = req.concurrency == 1

    def run_one() -> None:
        with recorder.recording():  # dispatch modes are per thread
            program.run(1)

    def run_measured() -> None:
        recorder.reset_peak()
        run_one()
        iteration_peaks.append(recorder.peak_bytes)

    state = {"phase": "load"}
    notified = False
    try:
        with recorder.recording():
            program = _program(req, child, recorder, device)
        weights = recorder.live_bytes
        start = len(recorder.trace.events)
        state["phase"] = "warm-up"
        for _ in range(req.warmup_iterations):
            run_one()
        recorder.reset_peak()
        state["phase"] = "load"
        _wait_for_others(child)
        notify(("load_start", _own_pid()))
        notified = True
        latencies, wall = _load(req, run_measured if per_iteration else run_one)
        notify(("load_end", None))
    except torch.OutOfMemoryError as exc:
        if notified:
            notify(("load_end", None))
        kv = _kv_bytes(program, req)
        return ProbeResult(
            device="cpu",
            device_name="cpu",
            torch_version=str(torch.__version__),
            cuda_version=None,
            driver_version=None,
            torch=TorchView(
                allocated_peak_bytes=recorder.peak_bytes,
                reserved_peak_bytes=None,
                num_alloc_retries=None,
                num_ooms=1,
                inactive_split_peak_bytes=None,
                weights_bytes=weights,
                kv_cache_bytes=kv,
            ),
            nvml=None,
            host_peak_rss_bytes=_peak_rss_bytes(),
            iterations=_iterations([], 0.0, 1, 0),
            outputs_finite=False,
            message=f"{state['phase']}: {exc}",
            weights=getattr(program, "weights_source", None),
            **recorder_snapshot_fields(recorder, child, start, "oom"),
        )
    kv = _kv_bytes(program, req)
    return ProbeResult(
        device="cpu",
        device_name="cpu",
        torch_version=str(torch.__version__),
        cuda_version=None,
        driver_version=None,
        torch=TorchView(
            allocated_peak_bytes=max(iteration_peaks) if iteration_peaks else recorder.peak_bytes,
            reserved_peak_bytes=None,
            num_alloc_retries=None,
            num_ooms=0,
            inactive_split_peak_bytes=None,
            weights_bytes=weights,
            kv_cache_bytes=kv,
            iteration_peak_bytes=tuple(iteration_peaks),
        ),
        nvml=None,
        host_peak_rss_bytes=_peak_rss_bytes(),
        iterations=_iterations(latencies, wall, 0, units * len(latencies)),
        outputs_finite=program.outputs_finite() if hasattr(program, "outputs_finite") else True,
        weights=getattr(program, "weights_source", None),
        **recorder_snapshot_fields(recorder, child, start, "measured"),
    )
