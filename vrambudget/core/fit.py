"""Fits of any workload against GPUs: serving-engine workloads by the engine's own accounting
(:mod:`vrambudget.core.serving.fit`), the others by the analytic tier
(:mod:`vrambudget.core.budget.fit`)."""

from __future__ import annotations

from .budget.fit import analytic_fit
from .calibration import ProfileSet
from .result import FitResponse
from .serving.fit import serving_fit
from .spec import FitRequest, analytic_workloads

__all__ = ["FitRequest", "FitResponse", "fit"]


def fit(req: FitRequest, profiles: ProfileSet | None = None) -> FitResponse:
    workloads = analytic_workloads(req.workloads)
    if workloads is None:
        return serving_fit(req)
    return analytic_fit(req, workloads, profiles)
