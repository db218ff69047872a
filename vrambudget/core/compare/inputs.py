"""What to estimate for a probe report: the workload as it ran and the device it ran on."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from ..catalog import match_gpu
from ..errors import InvalidWorkload
from ..probe_report import CustomWorkload, ProbeResource
from ..spec import CatalogDevice, CustomDevice, DeviceRef, InferenceWorkload, Workload

__all__ = ["COMPARABLE_STATUSES", "EstimateInput", "estimate_input"]

COMPARABLE_STATUSES = frozenset({"succeeded", "unreliable", "oom"})


@dataclass(frozen=True, slots=True)
class EstimateInput:
    """What to estimate for a report: the workload as run, the device, and why."""

    workload: Workload
    device: DeviceRef | None
    gpu_id: str | None
    notes: tuple[str, ...]


# --------------------------------------------------------------------------- the device ----


def estimate_input(report: ProbeResource, gpu_id: str | None = None) -> EstimateInput:
    """The workload and device to estimate for ``report`` (raises InvalidWorkload with the
    report's field when it cannot be compared)."""
    if report.status not in COMPARABLE_STATUSES or report.result is None:
        raise InvalidWorkload(
            "status",
            f"a probe with status {report.status!r} has no "
            f"measurement to compare; allowed: "
            f"{', '.join(sorted(COMPARABLE_STATUSES))}",
        )
    w = report.request.workload
    if isinstance(w, CustomWorkload):
        raise InvalidWorkload(
            "request.workload.kind",
            "a custom entry point has no workload "
            "spec to estimate; compare inference or training probes",
        )
    if report.result.torch is None:
        raise InvalidWorkload(
            "request.workload.kind",
            "an engine probe has no PyTorch view to compare; its result carries the engine's "
            "own figures beside the estimate's (result.engine.expected)",
        )
    notes: list[str] = []
    concurrency = report.request.concurrency
    workload: Workload = w
    if concurrency > 1 and isinstance(w, InferenceWorkload):
        # Each stream runs the whole request on its own cache: the estimate is of the streams'
        # sequences batched, which has the same KV cache and (to first order) the same working
        # set as the streams side by side.
        workload = msgspec.structs.replace(
            w, concurrent_requests=w.concurrent_requests * concurrency
        )
        notes.append(
            f"{concurrency} concurrent streams estimated as concurrent_requests x "
            f"{concurrency} on one device"
        )
    res = report.result
    device: DeviceRef | None = None
    if gpu_id is not None:
        device = CatalogDevice(id=gpu_id)
    elif res.device == "cuda":
        g = match_gpu(res.device_name, res.memory_total_bytes, res.compute_capability)
        if g is not None:
            gpu_id = g.id
            device = CatalogDevice(id=g.id)
        elif res.memory_total_bytes is not None:
            device = CustomDevice(
                name=res.device_name[:128] or "custom", memory_total_bytes=res.memory_total_bytes
            )
            notes.append(
                f"{res.device_name!r} matched no catalog GPU: estimated with generic "
                "overheads and the reported total memory"
            )
        else:
            notes.append(
                f"{res.device_name!r}: no total memory in the report and no catalog "
                "match; estimated without a device"
            )
    return EstimateInput(workload, device, gpu_id, tuple(notes))
