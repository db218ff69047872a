"""Fits of any workload against GPUs: serving-engine workloads by the engine's own accounting
(:mod:`vrambudget.core.serving.fit`), the others by the analytic tier
(:mod:`vrambudget.core.budget.fit`)."""

from __future__ import annotations

import msgspec

from .budget.fit import analytic_fit
from .budget.inputs import warnings as workload_warnings
from .calibration import ProfileSet
from .catalog import gpus
from .compat import evaluate_on, needs_of, not_supported, warnings_of
from .deployed import deploy_all
from .device import resolve_device, total_note
from .errors import InvalidWorkload
from .resolve import resolve_model
from .result import Compatibility, ExcludedDevice, FitResponse
from .serving.engine_args import deploy_serving
from .serving.fit import serving_fit
from .spec import (
    AnalyticWorkload,
    CatalogDevice,
    DeviceRef,
    FitRequest,
    GenericWorkload,
    LLMServingWorkload,
    Workload,
    analytic_workloads,
)
from .spec.diffusion import ImageGenerationWorkload
from .stack import resolve_stack

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
        offered, verdicts, excluded = _compatible(req, serving)
        answer = serving_fit(msgspec.structs.replace(req, workloads=serving, devices=offered))
        engine = first.engine if isinstance(first, LLMServingWorkload) else "vllm"
        if req.latency_target is not None and engine != "vllm":
            note = (
                f"no latency estimate: modelled for engine vllm and inference workloads, "
                f"not {engine}"
            )
            answer = msgspec.structs.replace(answer, warnings=(*answer.warnings, note))
        return _with_verdicts(answer, verdicts, excluded)
    deployed, notes = deploy_all(workloads, req.software)
    offered, verdicts, excluded = _compatible(req, deployed)
    answer = analytic_fit(
        msgspec.structs.replace(req, workloads=deployed, devices=offered), deployed, profiles
    )
    said = tuple(dict.fromkeys((*notes, *_workload_warnings(deployed, req))))
    if said:
        answer = msgspec.structs.replace(answer, warnings=said)
    return _with_verdicts(answer, verdicts, excluded)


def _workload_warnings(workloads: tuple[AnalyticWorkload, ...], req: FitRequest) -> list[str]:
    """What a budget of each workload would warn that holds on any GPU (the experts a stack
    leaves unquantized, LoRA targets that match nothing ...): often why nothing fits."""
    stack = resolve_stack(req.software)
    out = []
    for w in workloads:
        if isinstance(w, GenericWorkload):
            continue
        out += workload_warnings(w, resolve_model(w.model), None, stack)
    return out


def _compatible(
    req: FitRequest, workloads: tuple[Workload, ...]
) -> tuple[
    tuple[DeviceRef, ...], dict[tuple[str | None, str], Compatibility], tuple[ExcludedDevice, ...]
]:
    """The device types the workloads can run on (the rules run once per type, before any
    search), their verdicts by (catalog id, name), and the excluded ones with the rules that
    fail."""
    refs: tuple[DeviceRef, ...] = (
        tuple(CatalogDevice(id=g) for g in gpus()) if req.devices is None else req.devices
    )
    needs = needs_of(workloads, req.software)
    offered: list[DeviceRef] = []
    verdicts: dict[tuple[str | None, str], Compatibility] = {}
    excluded: list[ExcludedDevice] = []
    for i, ref in enumerate(refs):
        ctx = resolve_device(ref, field=f"devices[{i}]")
        assert ctx is not None
        verdict = evaluate_on(needs, ctx)
        if verdict.verdict == "unsupported":
            excluded.append(
                ExcludedDevice(gpu_id=ctx.id, name=ctx.name, compatibility=not_supported(verdict))
            )
        else:
            offered.append(ref)
            verdicts[(ctx.id, ctx.name)] = verdict
    return tuple(offered), verdicts, tuple(excluded)


def _total_note(gpu_id: str | None) -> str | None:
    """:func:`~.device.total_note` of a catalog GPU (the device resolved only where the entry's
    total is not the runtime's)."""
    g = gpus().get(gpu_id) if gpu_id is not None else None
    if g is None or g.memory_total_basis != "nvidia_smi":
        return None
    return total_note(resolve_device(CatalogDevice(id=g.id)))


def _with_verdicts(
    answer: FitResponse,
    verdicts: dict[tuple[str | None, str], Compatibility],
    excluded: tuple[ExcludedDevice, ...],
) -> FitResponse:
    """Each offered GPU with its verdict (the checks that are not ``supported``)."""
    out = []
    for g in answer.gpus:
        v = verdicts.get((g.gpu_id, g.name))
        if v is not None:
            g = msgspec.structs.replace(
                g, compatibility=not_supported(v), warnings=g.warnings + warnings_of(v)
            )
        note = _total_note(g.gpu_id)
        if note is not None:
            g = msgspec.structs.replace(g, warnings=(*g.warnings, note))
        out.append(g)
    return msgspec.structs.replace(answer, gpus=tuple(out), excluded=excluded)
