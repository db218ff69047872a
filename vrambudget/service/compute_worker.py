"""The worker side of the compute pool (:mod:`vrambudget.service.compute`): what a pool worker
process imports and runs -- the analytic budget, fit or comparison of one canonical request --
returning only bytes, strings and numbers across the process boundary. Imports the core only
(no Litestar, no torch): a worker starts in a fraction of a second."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import msgspec

from vrambudget.core.calibration import ProfileSet, profiles_from
from vrambudget.core.cluster import cluster_requests
from vrambudget.core.compare import compare, estimate_input
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import FitRequest, fit
from vrambudget.core.probe_report import ProbeResource
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest, Headroom, Software, driver_version
from vrambudget.core.spec.cluster import ClusterRequest

from .outcome import outcome
from .resolutions import Resolutions, with_resolutions

__all__ = ["TASKS", "init_worker", "run_task", "software_of"]

_ENCODER = msgspec.json.Encoder()
_profiles: list[ProfileSet | None] = [None]
"""In a worker: the calibration profiles, loaded once by :func:`init_worker`."""


def init_worker(profiles_dir: str | None) -> None:
    """pebble initializer, once per worker before its first task. It must not raise (pebble
    would make that a broken pool); the settings validated the directory at start-up."""
    try:
        _profiles[0] = profiles_from(profiles_dir)
    except Exception:  # noqa: BLE001 -- the server checked it; fall back to the defaults
        _profiles[0] = profiles_from(None)


def software_of(report: ProbeResource) -> Software | None:
    """The target's versions and allocator setting as the report measured them (CUDA probes
    only)."""
    res = report.result
    if res is None or res.device != "cuda":
        return None
    return Software(
        # an engine probe reports no torch: the engine release's own pin then applies
        torch_version=(res.torch_version or "")[:64] or None,
        cuda_version=(res.cuda_version or "")[:32] or None,
        driver_version=driver_version(res.driver_version),
        expandable_segments=res.expandable_segments,
    )


def _budget(payload: bytes, resolutions: Resolutions = ()) -> Any:
    req = msgspec.json.decode(payload, type=BudgetRequest)
    workloads = with_resolutions(req.workloads, resolutions)
    return estimate(
        workloads,
        req.device,
        req.headroom,
        _profiles[0],
        req.software,
        req.disk,
        req.allocator_replay,
    )


def _fit(payload: bytes, resolutions: Resolutions = ()) -> Any:
    req = msgspec.json.decode(payload, type=FitRequest)
    workloads = with_resolutions(req.workloads, resolutions)
    return fit(msgspec.structs.replace(req, workloads=workloads), _profiles[0])


def _cluster(payload: bytes, resolutions: Resolutions = ()) -> Any:
    req = msgspec.json.decode(payload, type=ClusterRequest)
    if resolutions:
        inner = req.source.request
        inner = msgspec.structs.replace(
            inner, workloads=with_resolutions(inner.workloads, resolutions)
        )
        req = msgspec.structs.replace(
            req, source=msgspec.structs.replace(req.source, request=inner)
        )
    return cluster_requests(req, _profiles[0])


def _comparison(
    payload: bytes,
    gpu: str | None,
    tolerance_percent: float,
    tolerance_bytes: int,
    traced: bytes | None,
    resolutions: Resolutions = (),
) -> Any:
    report = msgspec.json.decode(payload, type=ProbeResource)
    inp = estimate_input(report, gpu)
    if resolutions:
        inp = dataclasses.replace(inp, workload=with_resolutions((inp.workload,), resolutions)[0])
    estimates = {
        "analytic": estimate(
            (inp.workload,), inp.device, Headroom(fraction=0.0), _profiles[0], software_of(report)
        )
    }
    if traced is not None:
        estimates["trace"] = msgspec.json.decode(traced, type=Budget)
    return compare(
        report, estimates, inp, tolerance_percent=tolerance_percent, tolerance_bytes=tolerance_bytes
    )


TASKS: dict[str, Callable[..., Any]] = {
    "budget": _budget,
    "fit": _fit,
    "comparison": _comparison,
    "cluster": _cluster,
}


def run_task(task: str, max_answer_bytes: int, payload: bytes, *args: Any) -> tuple[Any, ...]:
    """The task a worker runs. Returns only bytes, strings and numbers:

    ``("ok", answer, seconds)`` | ``("too-large", size, seconds)`` |
    ``("invalid", field, message, seconds)`` | ``("unknown-model", id, seconds)`` |
    ``("unknown-gpu", id, seconds)`` | ``("budget-error", message, seconds)`` |
    ``("memory", message, seconds)`` | ``("error", summary, traceback, seconds)``
    """
    result = outcome(lambda: _ENCODER.encode(TASKS[task](payload, *args)))
    if result[0] == "ok" and len(result[1]) > max_answer_bytes:
        return ("too-large", len(result[1]), result[2])
    return result
