"""One probe, run in a fresh spawned child process: build the workload with the shared torch
builders, warm up, reset the peaks, run the load phase, collect both views.

The agent process itself never imports torch or creates a CUDA context; everything here runs in
the child. Views are kept apart: PyTorch's allocator counters (``torch.cuda.memory_stats``; on
a host without CUDA the dispatch-mode tracker of the trace tier, run on real tensors) and NVML's
device counters. On the CPU path the result says ``device: cpu``.
"""

from __future__ import annotations

import importlib
import resource
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from vrambudget.core.allocator import MIN_BLOCK_SIZE_BYTES
from vrambudget.core.spec import TrainingWorkload

from .spec import (
    CustomWorkload,
    DeviceView,
    Iteration,
    ProbeRequest,
    ProbeResult,
    TorchView,
)

__all__ = ["UNRELIABLE_OTHERS_BYTES", "ChildOutcome", "child_main", "classify", "measure"]

# Other processes changing device memory by more than this during the measurement make the NVML
# view meaningless for this probe (status unreliable); the sampler's default threshold too.
UNRELIABLE_OTHERS_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    status: str
    result: ProbeResult | None
    error: str | None


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def _iterations(latencies: list[float], wall_s: float, errors: int, units: int) -> Iteration:
    return Iteration(
        p50_s=statistics.median(latencies) if latencies else 0.0,
        p95_s=_percentile(latencies, 0.95),
        count=len(latencies),
        throughput_per_s=units / wall_s if wall_s > 0 else 0.0,
        errors=errors,
    )


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _program(req: ProbeRequest, entry_points: dict[str, str], marks: Any, device: Any) -> Any:
    """The runnable program: the shared builders for a workload spec, or a configured entry
    point (``module:function(device=..., marks=..., **arguments)`` returning an object with
    ``run(iterations)``)."""
    w = req.workload
    if isinstance(w, CustomWorkload):
        target = entry_points[w.entry_point]  # checked by the API before the child starts
        module, _, name = target.partition(":")
        factory: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return factory(device=device, marks=marks, **w.arguments)
    from vrambudget.core.resolve import resolve_model
    from vrambudget.workloads.run import initialize, prepare

    program = prepare(w, resolve_model(w.model), marks, device)
    program.every_decode_step = True
    initialize(program.model)
    return program


def _load(req: ProbeRequest, run_one: Callable[[], None]) -> tuple[list[float], float]:
    """The load phase: ``iterations`` (or ``duration_s``) per stream, ``concurrency`` streams.
    Returns per-iteration latencies and wall time; a stream's error is raised."""
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    deadline = None if req.duration_s is None else time.perf_counter() + req.duration_s

    def stream() -> None:
        done = 0
        while done < req.iterations or (deadline is not None and time.perf_counter() < deadline):
            t = time.perf_counter()
            try:
                run_one()
            except BaseException as exc:  # noqa: BLE001 -- reported, and OOM re-raised below
                with lock:
                    errors.append(exc)
                return
            with lock:
                latencies.append(time.perf_counter() - t)
            done += 1

    start = time.perf_counter()
    if req.concurrency == 1:
        stream()
    else:
        threads = [threading.Thread(target=stream) for _ in range(req.concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    wall = time.perf_counter() - start
    for exc in errors:
        if type(exc).__name__ == "OutOfMemoryError":
            raise exc
    if errors:
        raise errors[0]
    return latencies, wall


def _measure_cpu(
    req: ProbeRequest, entry_points: dict[str, str], notify: Callable[[tuple[str, Any]], None]
) -> ProbeResult:
    import torch

    from vrambudget.trace.recorder import Recorder

    recorder = Recorder(limit_bytes=req.memory_limit_bytes)
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
            program = _program(req, entry_points, recorder, device)
        weights = recorder.live_bytes
        state["phase"] = "warm-up"
        for _ in range(req.warmup_iterations):
            run_one()
        recorder.reset_peak()
        state["phase"] = "load"
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
    )


def _kv_bytes(program: Any, req: ProbeRequest) -> int | None:
    """The KV cache's known allocation: the cache tensors one request allocates (each rounded
    to the allocator's block), times the streams that each hold one. (Not the tracker's
    per-component peak: with several streams, one thread's kv_cache scope would tag the other
    threads' allocations too.) None for a program that reports no cache (custom entry points)."""
    if isinstance(req.workload, TrainingWorkload):
        return 0  # training holds no KV cache
    per_stream = getattr(program, "kv_cache_bytes", None)
    return None if per_stream is None else per_stream * req.concurrency


def _measure_cuda(
    req: ProbeRequest, entry_points: dict[str, str], notify: Callable[[tuple[str, Any]], None]
) -> ProbeResult:
    import torch

    from vrambudget.workloads.marks import Marks

    from . import nvml

    inventory = nvml.inventory()
    handle = index = None
    if inventory.available:
        handle, index = nvml.resolve_device(req.device)
    elif isinstance(req.device, int):
        index = req.device
    baseline = nvml.device_used_bytes(handle) if handle is not None else None
    torch.cuda.set_device(index or 0)
    torch.cuda.init()
    torch.cuda.synchronize()
    context = (
        (nvml.device_used_bytes(handle) - baseline)
        if handle is not None and (baseline is not None)
        else 0
    )
    if req.memory_limit_bytes is not None:
        total = torch.cuda.get_device_properties(index or 0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, req.memory_limit_bytes / total))
    device = torch.device("cuda", index or 0)
    workspace, base = _gemm_workspace(req, device)
    program = _program(req, entry_points, Marks(), device)
    if hasattr(program, "kv_rounding"):
        program.kv_rounding = MIN_BLOCK_SIZE_BYTES  # the caching allocator's block size
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated() - base
    units = req.workload.num_sequences if hasattr(req.workload, "num_sequences") else 1
    streams: dict[int, Any] = {}

    def run_one() -> None:
        tid = threading.get_ident()
        stream = streams.setdefault(
            tid, torch.cuda.Stream() if req.concurrency > 1 else torch.cuda.current_stream()
        )
        with torch.cuda.stream(stream):
            program.run(1)
        stream.synchronize()

    message = None
    status_oom = False
    latencies: list[float] = []
    wall = 0.0
    peaks: list[tuple[int, int, int]] = []  # (allocated, reserved, inactive split) per iteration

    def run_measured() -> None:
        torch.cuda.reset_peak_memory_stats()
        run_one()
        st = torch.cuda.memory_stats()
        peaks.append(
            (
                st.get("allocated_bytes.all.peak", 0),
                st.get("reserved_bytes.all.peak", 0),
                st.get("inactive_split_bytes.all.peak", 0),
            )
        )

    try:
        for _ in range(req.warmup_iterations):
            run_one()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        # The agent (parent) samples NVML during the load phase: a sampler thread in this
        # process would compete for the GIL with the load threads and miss its 10 ms.
        notify(("load_start", _own_pid()))
        latencies, wall = _load(req, run_measured if req.concurrency == 1 else run_one)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as exc:
        status_oom = True
        message = str(exc)[:2000]
    finally:
        notify(("load_end", None))
    stats = torch.cuda.memory_stats()
    allocated_peak = stats.get("allocated_bytes.all.peak", 0)
    reserved_peak = stats.get("reserved_bytes.all.peak", 0)
    inactive_peak = stats.get("inactive_split_bytes.all.peak", 0)
    if peaks:  # peaks were reset per iteration: the run's peak is the largest of them
        allocated_peak = max(allocated_peak, *(a for a, _, _ in peaks))
        reserved_peak = max(reserved_peak, *(r for _, r, _ in peaks))
        inactive_peak = max(inactive_peak, *(i for _, _, i in peaks))
    props = torch.cuda.get_device_properties(index or 0)
    view = (
        DeviceView(  # the sampler's fields are filled in by the parent (runner.py)
            baseline_used_bytes=baseline or 0,
            peak_used_bytes=0,
            samples=0,
            sample_interval_s=0.0,
            max_sample_interval_s=0.0,
            process_peak_used_bytes=None,
            accounting_max_memory_bytes=nvml.accounting_max_memory(handle, _own_pid()),
            cuda_context_bytes=context,
            others_changed_bytes=0,
            others_visible=False,
        )
        if handle is not None
        else None
    )
    return ProbeResult(
        device="cuda",
        device_name=torch.cuda.get_device_name(index or 0),
        torch_version=str(torch.__version__),
        cuda_version=torch.version.cuda,
        driver_version=inventory.driver_version if inventory.available else None,
        torch=TorchView(
            allocated_peak_bytes=allocated_peak,
            reserved_peak_bytes=reserved_peak,
            num_alloc_retries=stats.get("num_alloc_retries", 0),
            num_ooms=stats.get("num_ooms", 0),
            inactive_split_peak_bytes=inactive_peak,
            weights_bytes=weights,
            kv_cache_bytes=_kv_bytes(program, req),
            workspace_bytes=workspace,
            iteration_peak_bytes=tuple(a for a, _, _ in peaks),
        ),
        nvml=view,
        host_peak_rss_bytes=_peak_rss_bytes(),
        iterations=_iterations(latencies, wall, 1 if status_oom else 0, units * len(latencies)),
        outputs_finite=(not status_oom)
        and (program.outputs_finite() if hasattr(program, "outputs_finite") else True),
        message=message,
        memory_total_bytes=props.total_memory,
        compute_capability=f"{props.major}.{props.minor}",
    )


def _gemm_workspace(req: ProbeRequest, device: Any) -> tuple[int, int]:
    """(cuBLAS + cuBLASLt workspace bytes, allocated bytes before the model is built).

    A first GEMM makes cuBLAS (and, for a matmul with bias in 16-bit, cuBLASLt) allocate its
    workspace through the caching allocator; it stays allocated for the process's life. Run
    one tiny matmul of each kind in the workload's compute dtype, free the tensors, and what is
    left allocated is the workspace."""
    import torch

    from vrambudget.workloads.run import TORCH_DTYPES

    w = req.workload
    dtype = TORCH_DTYPES[w.precision.compute] if hasattr(w, "precision") else torch.float32
    before = torch.cuda.memory_allocated()
    a = torch.ones(16, 16, dtype=dtype, device=device)
    bias = torch.ones(16, dtype=dtype, device=device)
    out = a @ a
    out2 = torch.nn.functional.linear(a, a, bias)
    torch.cuda.synchronize()
    del a, bias, out, out2
    after = torch.cuda.memory_allocated()
    return after - before, after


def _own_pid() -> int:
    import os

    return os.getpid()


def _ignore(message: tuple[str, Any]) -> None:
    pass


def measure(
    req: ProbeRequest,
    entry_points: dict[str, str],
    notify: Callable[[tuple[str, Any]], None] = _ignore,
) -> ChildOutcome:
    """Run the probe in this process (the child) and classify the outcome; ``notify`` tells
    the parent when the load phase starts and ends."""
    import torch

    run = _measure_cuda if torch.cuda.is_available() else _measure_cpu
    result = run(req, entry_points, notify)
    if result.message is not None:  # both paths set a message only on out-of-memory
        return ChildOutcome("oom", result, result.message)
    return ChildOutcome("succeeded", result, None)


def classify(status: str, result: ProbeResult | None) -> tuple[str, str | None]:
    """After the parent merged its NVML samples: a measurement during which other processes
    changed device memory by more than ``UNRELIABLE_OTHERS_BYTES`` is ``unreliable``."""
    nv = result.nvml if result is not None else None
    if (
        status == "succeeded"
        and nv is not None
        and nv.others_visible
        and (abs(nv.others_changed_bytes) > UNRELIABLE_OTHERS_BYTES)
    ):
        return "unreliable", (
            f"other processes changed device memory by "
            f"{nv.others_changed_bytes} bytes during the measurement"
        )
    return status, None


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when the agent dies (PR_SET_PDEATHSIG), so a killed agent
    leaves no probe running on the GPU."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def child_main(request_json: bytes, entry_points: dict[str, str], conn: Connection) -> None:
    """Entry point of the spawned child: measure, send (status, result JSON, error) back."""
    _die_with_parent()
    try:
        req = msgspec.json.decode(request_json, type=ProbeRequest)
        outcome = measure(req, entry_points, conn.send)
        payload = (
            outcome.status,
            msgspec.json.encode(outcome.result) if outcome.result else None,
            outcome.error,
        )
    except BaseException as exc:  # noqa: BLE001 -- everything becomes a failed result
        payload = ("failed", None, "".join(traceback.format_exception_only(exc)).strip()[:4000])
    conn.send(payload)
    conn.close()
