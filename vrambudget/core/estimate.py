"""A budget for any workload: serving-engine workloads by the engine's own accounting
(:mod:`vrambudget.core.serving`), the others by the analytic tier
(:mod:`vrambudget.core.budget`)."""

from __future__ import annotations

from .budget.analytic import analytic_budget
from .calibration import ProfileSet
from .deployed import deploy_all
from .diffusion.budget import diffusion_budget
from .result import Budget
from .serving.budget import serving_budget
from .serving.engine_args import deploy_serving
from .spec import DeviceRef, Headroom, LLMServingWorkload, Software, Workload, analytic_workloads
from .spec.diffusion import ImageGenerationWorkload

__all__ = ["estimate"]


def _serving(w: Workload) -> Workload:
    return deploy_serving(w) if isinstance(w, LLMServingWorkload) else w


def estimate(
    workloads: tuple[Workload, ...],
    device: DeviceRef | None = None,
    headroom: Headroom | None = None,
    profiles: ProfileSet | None = None,
    software: Software | None = None,
) -> Budget:
    """The full answer for co-located workloads on one device type."""
    if any(isinstance(w, ImageGenerationWorkload) for w in workloads):
        return diffusion_budget(workloads, device, headroom, profiles, software)
    analytic = analytic_workloads(workloads)
    if analytic is None:
        return serving_budget(tuple(_serving(w) for w in workloads), device, software)
    deployed, notes = deploy_all(analytic)
    return analytic_budget(deployed, device, headroom, profiles, software, notes)
