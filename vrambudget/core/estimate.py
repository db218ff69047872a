"""A budget for any workload: serving-engine workloads by the engine's own accounting
(:mod:`vrambudget.core.serving`), the others by the analytic tier
(:mod:`vrambudget.core.budget`)."""

from __future__ import annotations

import msgspec

from .budget.analytic import analytic_budget
from .calibration import ProfileSet
from .compat import compatibility, warnings_of
from .deployed import deploy_all
from .device import resolve_device, total_note
from .diffusion.budget import diffusion_budget
from .host import DEFAULT_DISK
from .result import Budget
from .serving.budget import serving_budget
from .serving.engine_args import deploy_serving
from .spec import (
    DeviceRef,
    DiskOptions,
    Headroom,
    LLMServingWorkload,
    Software,
    Workload,
    analytic_workloads,
)
from .spec.diffusion import ImageGenerationWorkload
from .verdict import with_fit

__all__ = ["estimate"]


def _serving(w: Workload) -> Workload:
    return deploy_serving(w) if isinstance(w, LLMServingWorkload) else w


def estimate(
    workloads: tuple[Workload, ...],
    device: DeviceRef | None = None,
    headroom: Headroom | None = None,
    profiles: ProfileSet | None = None,
    software: Software | None = None,
    disk: DiskOptions = DEFAULT_DISK,
    allocator_replay: bool = False,
) -> Budget:
    """The full answer for co-located workloads on one device type, with the device's
    compatibility verdict (:mod:`vrambudget.core.compat`); ``disk`` says which extra copies of
    the model files the disk budget counts; ``allocator_replay``: see
    :func:`vrambudget.core.budget.analytic.analytic_budget`."""
    if any(isinstance(w, ImageGenerationWorkload) for w in workloads):
        budget = diffusion_budget(workloads, device, headroom, profiles, software, disk)
        return _with_compatibility(budget, workloads, device, software)
    analytic = analytic_workloads(workloads)
    if analytic is None:
        serving = tuple(_serving(w) for w in workloads)
        return _with_compatibility(
            serving_budget(serving, device, software, disk), serving, device, software
        )
    deployed, notes = deploy_all(analytic, software)
    budget = analytic_budget(
        deployed, device, headroom, profiles, software, notes, disk, allocator_replay
    )
    return _with_compatibility(budget, deployed, device, software)


def _with_compatibility(
    budget: Budget,
    workloads: tuple[Workload, ...],
    device: DeviceRef | None,
    software: Software | None,
) -> Budget:
    """The budget with the device's compatibility verdict and whether it fits."""
    ctx = resolve_device(device)
    verdict = compatibility(workloads, ctx, software)
    if verdict is not None:
        budget = msgspec.structs.replace(
            budget, compatibility=verdict, warnings=budget.warnings + warnings_of(verdict)
        )
    note = total_note(ctx)
    if note is not None:
        budget = msgspec.structs.replace(budget, warnings=(*budget.warnings, note))
    return with_fit(budget, workloads)
