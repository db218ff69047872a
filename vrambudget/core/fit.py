"""Fits of any workload against GPUs: serving-engine workloads by the engine's own accounting
(:mod:`vrambudget.core.serving.fit`), the others by the analytic tier
(:mod:`vrambudget.core.budget.fit`)."""

from __future__ import annotations

import msgspec

from .budget.fit import analytic_fit
from .calibration import ProfileSet
from .deployed import deploy_all
from .errors import InvalidWorkload
from .result import FitResponse
from .serving.engine_args import deploy_serving
from .serving.fit import serving_fit
from .spec import FitRequest, LLMServingWorkload, analytic_workloads
from .spec.diffusion import ImageGenerationWorkload

__all__ = ["FitRequest", "FitResponse", "fit"]


def fit(req: FitRequest, profiles: ProfileSet | None = None) -> FitResponse:
    for i, w in enumerate(req.workloads):
        if isinstance(w, ImageGenerationWorkload):
            raise InvalidWorkload(
                f"workloads[{i}].kind", "image_generation is budgeted, not fitted"
            )
    first = req.workloads[0]  # a latency target's workload kinds: spec/rules.py
    workloads = analytic_workloads(req.workloads)
    if workloads is None:
        serving = tuple(
            deploy_serving(w) if isinstance(w, LLMServingWorkload) else w for w in req.workloads
        )
        answer = serving_fit(msgspec.structs.replace(req, workloads=serving))
        engine = first.engine if isinstance(first, LLMServingWorkload) else "vllm"
        if req.latency_target is not None and engine != "vllm":
            note = (
                f"no latency estimate: modelled for engine vllm and inference workloads, "
                f"not {engine}"
            )
            answer = msgspec.structs.replace(answer, warnings=(*answer.warnings, note))
        return answer
    deployed, notes = deploy_all(workloads)
    answer = analytic_fit(msgspec.structs.replace(req, workloads=deployed), deployed, profiles)
    return msgspec.structs.replace(answer, warnings=notes) if notes else answer
