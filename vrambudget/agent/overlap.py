"""Several workloads at once on one device (a probe's ``overlap``): each in its own spawned
child, as separate jobs are separate processes, their load phases started together behind a
barrier, so what the device holds at its peak is what the jobs hold together.

``ProbeGroup`` has the interface of one ``ProbeProcess`` (start, wait, cancel, kill, pid): the
worker runs a probe with overlap exactly as one without.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from .child import ChildSettings
from .engine.group import EngineGroup
from .runner import ChildResult, ProbeProcess
from .spec import OverlapMember, ProbeRequest, ProbeResult

__all__ = ["ProbeGroup", "member_request"]


def member_request(request: ProbeRequest, index: int) -> ProbeRequest:
    """The request one overlapping workload runs: the probe's iteration settings, its own
    workload, nothing that reports anywhere (no callback, service, snapshot or quality check)."""
    return msgspec.structs.replace(
        request,
        workload=request.overlap[index],
        overlap=(),
        quality=None,
        memory_snapshot=False,
        callback=None,
        service_url=None,
        concurrency=1,
    )


class ProbeGroup:
    """The probe's own child and one child per overlapping workload."""

    def __init__(
        self,
        request: ProbeRequest,
        child: ChildSettings,
        sampler_factory: Callable[[frozenset[int], tuple[int, ...]], Any] | None,
        memory_limits: Callable[[list[ProbeRequest]], list[int | None]],
        on_engine: Callable[[EngineGroup], None] | None = None,
    ) -> None:
        """``memory_limits``: each job's host-memory limit, given every job's request (the
        probe's own first): jobs that run together share the host's cap."""
        ctx = mp.get_context("spawn")
        n = 1 + len(request.overlap)
        # Every child waits here after its warm-up: the load phases start together. The first
        # child to end breaks it, so none waits for a job that failed before its load phase.
        gate = ctx.Barrier(n, timeout=request.time_limit_s) if n > 1 else None
        self._gate = gate
        requests = [request] + [member_request(request, i) for i in range(len(request.overlap))]
        limits = memory_limits(requests)
        self._processes = [
            ProbeProcess(
                msgspec.json.encode(r),
                dataclasses.replace(
                    child, start_gate=gate, snapshot_path=child.snapshot_path if i == 0 else None
                ),
                request.time_limit_s,
                sampler_factory,
                memory_limit_bytes=limits[i],
                on_engine=on_engine if i == 0 else None,  # llm_serving is never an overlap
            )
            for i, r in enumerate(requests)
        ]

    @property
    def pid(self) -> int | None:
        return self._processes[0].pid

    def start(self) -> None:
        for p in self._processes:
            p.start()

    def cancel(self) -> None:
        for p in self._processes:
            p.cancel()

    def kill(self) -> None:
        for p in self._processes:
            p.kill()

    def _release(self) -> None:
        if self._gate is not None:
            self._gate.abort()

    def wait(self) -> ChildResult:
        """Every child's outcome; the probe's own result carries the others' (``overlap``), and
        its NVML device peak is the largest any child's sampler saw while the jobs ran."""
        main, *members = self._processes
        if not members:
            return main.wait()
        outcomes: list[ChildResult | None] = [None] * len(members)

        def wait_member(i: int) -> None:
            outcomes[i] = members[i].wait()
            self._release()

        threads = [threading.Thread(target=wait_member, args=(i,)) for i in range(len(members))]
        for t in threads:
            t.start()
        own = main.wait()
        self._release()
        if own.status == "cancelled":
            for m in members:
                m.cancel()
        for t in threads:
            t.join()
        return _merge(own, [o for o in outcomes if o is not None])


def _merge(own: ChildResult, others: list[ChildResult]) -> ChildResult:
    if own.result_json is None:
        return own
    result = msgspec.json.decode(own.result_json, type=ProbeResult)
    members = []
    nvml = result.nvml
    peaks = [nvml.peak_used_bytes] if nvml is not None else []
    baselines = [nvml.baseline_used_bytes] if nvml is not None else []
    for i, o in enumerate(others):
        r = msgspec.json.decode(o.result_json, type=ProbeResult) if o.result_json else None
        if r is not None and r.nvml is not None:
            peaks.append(r.nvml.peak_used_bytes)
            baselines.append(r.nvml.baseline_used_bytes)
        members.append(OverlapMember(index=i, status=o.status, error=o.error, result=r))
    if nvml is not None:
        # The jobs' children start together: the earliest of their pre-workload readings came
        # before any job's context, and it is the smallest unless another process freed memory.
        nvml = msgspec.structs.replace(
            nvml, peak_used_bytes=max(peaks), baseline_used_bytes=min(baselines)
        )
    result = msgspec.structs.replace(result, overlap=tuple(members), nvml=nvml)
    return ChildResult(own.status, msgspec.json.encode(result), own.error)
