"""The probe on a CUDA device: PyTorch's allocator counters (``torch.cuda.memory_stats``) per
iteration and over the run, the cuBLAS workspace, and the NVML fields the child can read (the
parent's sampler fills in the rest). Runs in the child; torch is imported lazily."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from vrambudget.core.allocator import MIN_BLOCK_SIZE_BYTES

from .alloc_conf import expandable_from
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
from .snapshots import keep_snapshot
from .spec import DeviceView, ProbeRequest, ProbeResult, TorchView


def _measure_cuda(
    req: ProbeRequest, child: ChildSettings, notify: Callable[[tuple[str, Any]], None]
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
    gemm: list[tuple[int, int]] = []  # measured once the workload's compute dtype is known
    program = _program(
        req, child, Marks(), device, before_build=lambda w: gemm.append(_gemm_workspace(w, device))
    )
    workspace, base = gemm[0]
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

    snapshot: dict[str, Any] = {}  # the result's snapshot fields (memory_snapshot)
    if child.snapshot_path is not None:  # the allocator's history from the warm-up on
        torch.cuda.memory._record_memory_history(
            max_entries=child.snapshot_max_entries, stacks="python"
        )
    try:
        for _ in range(req.warmup_iterations):
            run_one()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        # The agent (parent) samples NVML during the load phase: a sampler thread in this
        # process would compete for the GIL with the load threads and miss its 10 ms.
        _wait_for_others(child)
        notify(("load_start", _own_pid()))
        latencies, wall = _load(req, run_measured if req.concurrency == 1 else run_one)
        torch.cuda.synchronize()
        if child.snapshot_path is not None:
            snapshot = keep_snapshot(torch.cuda.memory._snapshot(), child, "measured")
    except torch.OutOfMemoryError as exc:
        status_oom = True
        message = str(exc)[:2000]
        if child.snapshot_path is not None:  # while the failed step's tensors are still held
            snapshot = keep_snapshot(torch.cuda.memory._snapshot(), child, "oom")
    finally:
        notify(("load_end", None))
        if child.snapshot_path is not None:
            torch.cuda.memory._record_memory_history(None)
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
        weights=getattr(program, "weights_source", None),
        expandable_segments=expandable_from(os.environ),
        **snapshot,
    )


def _gemm_workspace(w: Any, device: Any) -> tuple[int, int]:
    """(cuBLAS + cuBLASLt workspace bytes, allocated bytes before the model is built).

    A first GEMM makes cuBLAS (and, for a matmul with bias in 16-bit, cuBLASLt) allocate its
    workspace through the caching allocator; it stays allocated for the process's life. Run
    one tiny matmul of each kind in the workload's compute dtype, free the tensors, and what is
    left allocated is the workspace. ``w``: the workload as it runs (``deploy`` made its
    ``auto`` compute dtype concrete); a custom workload has no precision and gets fp32."""
    import torch

    from vrambudget.workloads.run import TORCH_DTYPES

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
