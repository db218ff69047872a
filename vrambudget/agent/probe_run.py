"""What both measurement paths of the probe child share: the runnable program (the shared
builders or a configured entry point), the load phase with its latencies, and the numbers every
result carries (iteration statistics, the KV cache's bytes, peak RSS, the child's pid). Runs in
the child; imports no torch itself."""

from __future__ import annotations

import importlib
import resource
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.spec import HFConfigModel, TrainingWorkload

from .child import ChildSettings
from .spec import CustomWorkload, Iteration, ProbeRequest, WeightsSource


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


def _program(
    req: ProbeRequest,
    child: ChildSettings,
    marks: Any,
    device: Any,
    before_build: Callable[[Any], None] | None = None,
) -> Any:
    """The runnable program: the shared builders for a workload spec, or a configured entry
    point (``module:function(device=..., marks=..., **arguments)`` returning an object with
    ``run(iterations)``). ``before_build`` is called with the workload as it will run (its
    model resolved and its ``auto`` precisions made concrete by ``deploy``; a custom workload
    as given) just before anything is allocated for it."""
    w = req.workload
    if isinstance(w, CustomWorkload):
        if before_build is not None:
            before_build(w)
        target = child.entry_points[w.entry_point]  # checked by the API before the child starts
        module, _, name = target.partition(":")
        factory: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return factory(device=device, marks=marks, **w.arguments)
    from vrambudget.core.deployed import deploy, deployed_quantization
    from vrambudget.core.resolve import resolve_model
    from vrambudget.trace.models import resolve_models
    from vrambudget.workloads.hf.program import (
        FrameworkProgram,
        framework_unsupported,
        prepare_framework,
    )
    from vrambudget.workloads.run import Program, initialize, prepare

    source, w = _weights(req, child, w)
    (w,) = resolve_models((w,))
    w = deploy(w)
    if getattr(w, "checkpointing", None) == "offloaded":
        raise InvalidWorkload(
            "workload.checkpointing",
            "must not be 'offloaded': the probe's programs keep layer inputs on the device",
        )
    arch = resolve_model(w.model)
    if before_build is not None:
        before_build(w)
    if source.kind == "checkpoint" and deployed_quantization(w.precision.quantization):
        why = "real weights of a quantized deployment need the format's kernels"
        if req.weights == "checkpoint":
            raise InvalidWorkload("weights", f"no usable checkpoint: {why}")
        source = msgspec.structs.replace(source, kind="synthetic", reason=why)
    program: FrameworkProgram | Program
    framework = req.code == "framework" and framework_unsupported(w) is None
    if source.kind == "checkpoint":
        if not framework:
            raise InvalidWorkload(
                "weights",
                "real weights load through the framework program (code: framework), which "
                f"cannot run this workload: {framework_unsupported(w) or 'code is builtin'}",
            )
        # The framework's own code, as the trace tier runs it, with the real weights.
        program = prepare_framework(w, arch, marks, device, emulate=False, checkpoint=source.path)
    else:
        if framework:  # the framework's own code, as the trace tier runs it, for real
            program = prepare_framework(w, arch, marks, device, emulate=False)
        else:
            program = prepare(w, arch, marks, device)
        initialize(program.model)
    program.every_decode_step = True
    program.weights_source = source  # type: ignore[union-attr]
    return program


def _weights(req: ProbeRequest, child: ChildSettings, w: Any) -> tuple[WeightsSource, Any]:
    """Which weights the probe runs, and the workload with its model read from that checkpoint
    (so the host's own files, not a Hub fetch, define it)."""
    from vrambudget.trace.checkpoints import Found, find_checkpoint
    from vrambudget.trace.models import local_checkpoint_model

    found = find_checkpoint(w.model, child.model_dirs)
    if not isinstance(found, Found):
        if req.weights == "checkpoint":
            raise InvalidWorkload("weights", f"no usable checkpoint: {found.reason}")
        reason = (
            "the request asked for synthetic weights"
            if req.weights == "synthetic"
            else found.reason
        )
        return WeightsSource(kind="synthetic", reason=reason), w
    # The host's own files define the model (no Hub fetch), whichever weights run.
    local = msgspec.convert(local_checkpoint_model(str(found.path)), type=HFConfigModel)
    w = msgspec.structs.replace(w, model=local)
    where = dict(path=str(found.path), revision=found.revision)
    if req.weights == "synthetic":
        return WeightsSource(
            kind="synthetic", reason="the request asked for synthetic weights", **where
        ), w
    if req.code != "framework":
        why = "code builtin runs the service's own builders, which have their own tensor names"
        if req.weights == "checkpoint":
            raise InvalidWorkload("weights", f"no usable checkpoint: {why}")
        return WeightsSource(kind="synthetic", reason=why, **where), w
    return WeightsSource(kind="checkpoint", reason=f"found in the {found.where}", **where), w


def _wait_for_others(child: ChildSettings) -> None:
    """An overlapping job waits for the probe's other jobs to finish their warm-up, so the load
    phases run together (a job that ended early breaks the barrier: the rest go on)."""
    if child.start_gate is not None:
        try:
            child.start_gate.wait()
        except threading.BrokenBarrierError:
            pass


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


def _kv_bytes(program: Any, req: ProbeRequest) -> int | None:
    """The KV cache's known allocation: the cache tensors one request allocates (each rounded
    to the allocator's block), times the streams that each hold one. (Not the tracker's
    per-component peak: with several streams, one thread's kv_cache scope would tag the other
    threads' allocations too.) None for a program that reports no cache (custom entry points)."""
    if isinstance(req.workload, TrainingWorkload):
        return 0  # training holds no KV cache
    per_stream = getattr(program, "kv_cache_bytes", None)
    return None if per_stream is None else per_stream * req.concurrency


def _own_pid() -> int:
    import os

    return os.getpid()
