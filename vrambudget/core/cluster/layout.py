"""Which budget a cluster request renders: the budget it names, or the fit's chosen layout
budgeted as the fit laid it out; a layout that does not exist or does not fit is refused naming
the field."""

from __future__ import annotations

import msgspec

from ..budget.fit import layout_for
from ..calibration import ProfileSet
from ..errors import InvalidWorkload
from ..estimate import estimate
from ..fit import fit
from ..result import Budget, LayoutFit
from ..spec import (
    BudgetRequest,
    CatalogDevice,
    CustomDevice,
    DeviceRef,
    GenericWorkload,
    GGUFOptions,
    LLMServingWorkload,
    Workload,
)
from ..spec.cluster import ClusterRequest, FromBudget, FromFit
from ..spec.diffusion import ImageGenerationWorkload
from ..spec.serving import GGUF_ENGINES
from .objects import ClusterAnswer, render

__all__ = ["cluster_requests"]


def _devices_of(budget: Budget) -> int:
    """GPUs of one replica of the layout (co-located workloads and instances share them)."""
    return max(w.devices_per_instance for w in budget.workloads)


def _fits(budget: Budget) -> str | None:
    """Why the budget does not fit its device (None: it fits)."""
    if budget.serving is not None:
        return None if budget.serving.would_start else budget.serving.reason or "would not start"
    d = budget.device
    if d is not None and budget.total_bytes > d.capacity_bytes:
        held = (
            f" left beside the {d.memory_in_use_bytes} B others hold"
            if d.memory_in_use_bytes
            else ""
        )
        return (
            f"the most loaded device needs {budget.total_bytes} B, more than the "
            f"{d.capacity_bytes} B{held} of {d.name}"
        )
    return None


def _placed(w: Workload, lay: LayoutFit) -> Workload:
    """The fit's first workload on the chosen layout, as the fit laid it out."""
    if isinstance(w, GenericWorkload | ImageGenerationWorkload):  # one device; never fitted
        return w
    if isinstance(w, LLMServingWorkload):
        if w.engine in GGUF_ENGINES:  # the fit splits the layers over n GPUs
            opts = w.gguf if w.gguf is not None else GGUFOptions()
            split = opts.tensor_split if opts.devices == lay.device_count else None
            gguf = msgspec.structs.replace(opts, devices=lay.device_count, tensor_split=split)
            return msgspec.structs.replace(w, gguf=gguf)
        par = msgspec.structs.replace(
            w.parallelism, tensor=lay.tensor, pipeline=lay.pipeline, data=lay.data
        )
        return msgspec.structs.replace(w, parallelism=par)
    par_a = layout_for(w, lay.device_count)
    assert par_a is not None  # the fit laid it out on this count
    return msgspec.structs.replace(w, parallelism=par_a)


def _from_fit(src: FromFit, profiles: ProfileSet | None) -> tuple[BudgetRequest, DeviceRef, int]:
    answer = fit(src.request, profiles)
    names = [g.gpu_id if g.gpu_id is not None else g.name for g in answer.gpus]
    try:
        i = names.index(src.gpu_id)
    except ValueError:
        raise InvalidWorkload(
            "source.gpu_id", f"{src.gpu_id!r} is not a GPU of the fit (allowed: {', '.join(names)})"
        ) from None
    g = answer.gpus[i]
    counts = [lay.device_count for lay in g.layouts]
    if src.device_count not in counts:
        raise InvalidWorkload(
            "source.device_count",
            f"the fit has no layout of {src.device_count} devices on {g.name} (allowed: "
            f"{', '.join(map(str, counts)) or 'none'}; add it to device_counts)",
        )
    lay = g.layouts[counts.index(src.device_count)]
    if not lay.fits:
        fitting = [str(x.device_count) for x in g.layouts if x.fits]
        raise InvalidWorkload(
            "source.device_count",
            f"the workload does not fit {src.device_count} x {g.name} (allowed: the fitting "
            f"counts {', '.join(fitting) or 'none'}; smallest that fits: "
            f"{g.min_device_count})",
        )
    ref: DeviceRef
    devices = src.request.devices or ()
    if g.gpu_id is not None:
        # the request's own entry (with the memory other processes hold), else the catalog's
        ref = next(
            (d for d in devices if isinstance(d, CatalogDevice) and d.id == g.gpu_id),
            CatalogDevice(id=g.gpu_id),
        )
    else:
        ref = next(d for d in devices if isinstance(d, CustomDevice) and d.name == g.name)
    req = src.request
    workloads = (_placed(req.workloads[0], lay), *req.workloads[1:])
    budget_req = BudgetRequest(
        workloads=workloads, device=ref, headroom=req.headroom, software=req.software, disk=req.disk
    )
    return budget_req, ref, src.device_count


def cluster_requests(req: ClusterRequest, profiles: ProfileSet | None = None) -> ClusterAnswer:
    """The Kubernetes requests of a budget, or of one layout of a fit. A field the inner
    budget or fit names is prefixed with ``source.request.``."""
    try:
        return _cluster_requests(req, profiles)
    except InvalidWorkload as exc:
        if exc.field.startswith(("source.", "mig_profile", "vendor")):
            raise
        raise InvalidWorkload(f"source.request.{exc.field}", exc.message) from None


def _cluster_requests(req: ClusterRequest, profiles: ProfileSet | None) -> ClusterAnswer:
    match req.source:
        case FromBudget(request=b):
            if b.method != "analytic":
                raise InvalidWorkload(
                    "source.request.method", "trace is not rendered; use analytic (the default)"
                )
            if b.device is None:
                raise InvalidWorkload(
                    "source.request.device",
                    "a cluster request needs the device: a catalog GPU or a custom device",
                )
            budget_req, ref, field = b, b.device, "source.request.workloads[0].parallelism"
            budget = estimate(b.workloads, b.device, b.headroom, profiles, b.software, b.disk)
            devices = _devices_of(budget)
        case FromFit():
            budget_req, ref, devices = _from_fit(req.source, profiles)
            field = "source.device_count"
            budget = estimate(
                budget_req.workloads,
                ref,
                budget_req.headroom,
                profiles,
                budget_req.software,
                budget_req.disk,
            )
    why = _fits(budget)
    if why is not None:
        target = "source.request.device" if isinstance(req.source, FromBudget) else field
        raise InvalidWorkload(target, f"the layout does not fit: {why}")
    return render(req, budget, budget_req.workloads, ref, devices, field)
