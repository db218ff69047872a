"""Fit checks of model and generic workloads against GPUs, and solved maxima (largest batch,
context, concurrency that fit; smallest device count per GPU type), by the analytic tier.

The maxima come from :func:`vrambudget.core.search.max_fitting` over the most loaded device's
total (headroom included); evaluations are shared between GPUs whose overheads are equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from ..bands import BandRule, band_of, band_rule, resolve_headroom, workload_class
from ..calibration import ProfileSet
from ..catalog import GPU, gpus
from ..components import Component
from ..device import DeviceContext, held_note, resolve_device
from ..errors import InvalidWorkload
from ..formulas.headroom import headroom_bytes
from ..formulas.kv_cache import elem_bytes
from ..gpu_perf import perf_of
from ..interconnect import layout_interconnect
from ..latency import (
    Point,
    compute_format,
    cost_ranking,
    estimate,
    model_cost,
    price_of,
    unknown_warning,
)
from ..layout import check_layout, device_count_candidates, node_splits
from ..mig import MIGDevice, Verdict, smallest_fitting
from ..overheads import Overheads
from ..resolve import resolve_model
from ..result import FitResponse, GPUFit, LatencyEstimate, LayoutFit, Maxima, MIGFit
from ..search import Memo, max_fitting
from ..spec import (
    FP8,
    MAX_TOKENS,
    AnalyticWorkload,
    DeviceRef,
    FitRequest,
    FitVariable,
    GenericWorkload,
    Headroom,
    InferenceWorkload,
    LatencyTarget,
    Parallelism,
    TrainingWorkload,
)
from ..stack import resolve_stack
from ..statics import statics_for
from ..verdict import free_percent, memory_verdict
from .analytic import device_counted, device_subtotal, device_totals, workload_stages
from .inference import plan_of, plan_total
from .stage import top_stage

__all__ = ["analytic_fit", "layout_for"]


def layout_for(w: AnalyticWorkload, n: int) -> Parallelism | None:
    """The first workload's parallelism on ``n`` devices, or None when n cannot be realised."""
    if isinstance(w, GenericWorkload):
        return Parallelism() if n == 1 else None
    arch = resolve_model(w.model)
    par = w.parallelism
    if isinstance(w, TrainingWorkload):
        per_replica = par.tensor * par.pipeline
        if n % per_replica:
            return None
        candidate = msgspec.structs.replace(par, data=n // per_replica)
        return candidate
    for t, p in node_splits(n):
        candidate = msgspec.structs.replace(
            par,
            tensor=t,
            pipeline=p,
            data=1,
            virtual_stages=1,
            pipeline_schedule="1f1b",
            expert=math.gcd(par.expert, t),
        )
        try:
            check_layout(arch, candidate)
        except InvalidWorkload:
            continue
        return candidate
    return None


def _with(w: AnalyticWorkload, **changes: object) -> AnalyticWorkload:
    return msgspec.structs.replace(w, **changes)


def _variable_setter(
    w: AnalyticWorkload, variable: FitVariable
) -> tuple[Callable[[int], AnalyticWorkload], int, int | None] | None:
    """(make workload for x, request limit, model limit) or None if the variable does not apply."""
    match variable, w:
        case "batch", InferenceWorkload():
            return (lambda x: _with(w, batch_size=x)), 1 << 24, None
        case "batch", TrainingWorkload():
            return (lambda x: _with(w, micro_batch_size=x)), 1 << 24, None
        case "batch", GenericWorkload():
            return (lambda x: _with(w, batch_size=x)), 1 << 24, None
        case "concurrency", InferenceWorkload():
            return (lambda x: _with(w, concurrent_requests=x)), 1 << 24, None
        case "context", InferenceWorkload():
            arch = resolve_model(w.model)
            model_cap = (
                arch.max_positions - w.generated_tokens
                if arch.kind == "decoder"
                else (arch.max_positions)
            )
            return (lambda x: _with(w, prompt_tokens=x)), MAX_TOKENS, max(model_cap, 0)
        case "context", TrainingWorkload():
            arch = resolve_model(w.model)
            return (lambda x: _with(w, sequence_length=x)), MAX_TOKENS, arch.max_positions
    return None


def _objective_of(w: AnalyticWorkload, variable: FitVariable) -> str:
    """The objective a variable's search walks: an inference workload's batch and concurrency
    multiply into its number of sequences, the only thing either changes in its budget
    (:func:`vrambudget.core.budget.inference.inference_terms`), so where the other factor is
    1 both searches walk one function and share its evaluations."""
    if isinstance(w, InferenceWorkload) and (
        (variable == "batch" and w.concurrent_requests == 1)
        or (variable == "concurrency" and w.batch_size == 1)
    ):
        return "sequences"
    return variable


def _targets(req: FitRequest, profiles: ProfileSet | None) -> list[DeviceContext]:
    refs: tuple[DeviceRef | GPU, ...] = (
        tuple(gpus().values()) if req.devices is None else req.devices
    )
    out = []
    for i, ref in enumerate(refs):
        ctx = resolve_device(ref, profiles, req.software, field=f"devices[{i}]")
        assert ctx is not None
        out.append(ctx)
    return out


def _limiting(workloads: tuple[AnalyticWorkload, ...], ctx: DeviceContext) -> Component:
    values: dict[Component, int] = {}
    for i, w in enumerate(workloads):
        top = top_stage(workload_stages(w, ctx.overheads, i))
        for c, v in top.values.items():
            values[c] = values.get(c, 0) + v
    return max(values, key=lambda c: values[c])


def analytic_fit(
    req: FitRequest, workloads: tuple[AnalyticWorkload, ...], profiles: ProfileSet | None = None
) -> FitResponse:
    """Fits of an inference, training or generic workload (and co-located ones): ``workloads``
    are the request's, as the analytic tier's."""
    primary, rest = workloads[0], workloads[1:]
    targets = _targets(req, profiles)
    stack = resolve_stack(req.software)
    layouts: dict[int, Parallelism | None] = {
        n: layout_for(primary, n) for n in sorted(set(req.device_counts))
    }
    # Per (device count, overheads, variable): the solver's objective, the variable's bound,
    # the model's limit and the objective's memo (x -> total bytes); None where the variable
    # does not apply.
    searches: dict[
        tuple[int, int, str], tuple[Callable[[int], int], int, int | None, Memo] | None
    ] = {}
    totals: dict[tuple[int, int], int] = {}
    # GPUs with equal overheads (they hash by value) share evaluations: each target's class,
    # by its overheads' identity, so the dataclass is hashed once per target, not per lookup.
    classes: dict[Overheads, int] = {}
    class_by_id: dict[int, int] = {}

    def _overhead_key(ctx: DeviceContext) -> int:
        ov = ctx.overheads
        c = class_by_id.get(id(ov))
        if c is None:
            c = class_by_id[id(ov)] = classes.setdefault(ov, len(classes))
        return c

    placements: dict[int, AnalyticWorkload | None] = {}

    def placed(n: int) -> AnalyticWorkload | None:
        """The primary workload laid out on n devices (None: no layout), once per n: every
        GPU asks for the same layouts."""
        if n not in placements:
            par = layouts.get(n) if n in layouts else layout_for(primary, n)
            placements[n] = (
                None
                if par is None
                else primary
                if isinstance(primary, GenericWorkload)
                else _with(primary, parallelism=par)
            )
        return placements[n]

    rest_subtotals: dict[int, int] = {}
    rules: dict[int, tuple[BandRule, Headroom]] = {}

    def rule_on(n: int, w0: AnalyticWorkload) -> tuple[BandRule, Headroom]:
        """The band of the layout on n devices (its class follows the layout: one device or
        several) and the headroom it sets by default."""
        if n not in rules:
            band = band_rule(tuple(workload_class(w) for w in (w0, *rest)), stack)
            rules[n] = band, resolve_headroom(req.headroom, band)
        return rules[n]

    def total(w0: AnalyticWorkload, ctx: DeviceContext, headroom: Headroom) -> int:
        return device_totals((w0, *rest), ctx, headroom)

    def subtotal(w0: AnalyticWorkload, ctx: DeviceContext) -> int:
        return device_subtotal((w0, *rest), ctx)

    def objective(
        make: Callable[[int], AnalyticWorkload],
        w0: AnalyticWorkload,
        ctx: DeviceContext,
        headroom: Headroom,
    ) -> Callable[[int], int]:
        """f(x) for the solver: only the primary workload varies, so the co-located ones are
        summed once, and an inference workload skips building its explained budget."""
        if not isinstance(w0, InferenceWorkload):
            return lambda x: total(make(x), ctx, headroom)
        okey = _overhead_key(ctx)
        if okey not in rest_subtotals:
            rest_subtotals[okey] = sum(
                max(sum(s.values.values()) for s in workload_stages(w, ctx.overheads, i + 1))
                for i, w in enumerate(rest)
            )
        base = rest_subtotals[okey]
        arch = resolve_model(w0.model)
        ov = ctx.overheads
        # the variable changes no plan: one per stage for the whole search
        plans = [plan_of(w0, arch, st, ov) for st in statics_for(w0, arch, ov.stack)]

        def f(x: int) -> int:
            w = make(x)
            sub = base + max([plan_total(w, p) for p in plans])  # type: ignore[arg-type]
            return sub + headroom_bytes(sub, headroom)

        return f

    limiting: dict[tuple[int, int], Component] = {}

    with_headroom: dict[tuple[int, int], int] = {}

    def total_on(n: int, w0: AnalyticWorkload, ctx: DeviceContext) -> int:
        """The placed workload's total on n devices of this overhead class (memoized)."""
        tkey = (n, _overhead_key(ctx))
        t = with_headroom.get(tkey)
        if t is None:
            sub = subtotal_on(n, w0, ctx)
            t = with_headroom[tkey] = sub + headroom_bytes(sub, rule_on(n, w0)[1])
        return t

    def subtotal_on(n: int, w0: AnalyticWorkload, ctx: DeviceContext) -> int:
        tkey = (n, _overhead_key(ctx))
        if tkey not in totals:
            totals[tkey] = subtotal(w0, ctx)
        return totals[tkey]

    ends: dict[tuple[int, int], tuple[int, int]] = {}

    def verdict_on(
        n: int,
        w0: AnalyticWorkload,
        ctx: DeviceContext,
        capacity: int,
        spread: tuple[int, int] = (0, 0),
    ) -> Verdict:
        """The layout's verdict: its total against ``capacity`` and its band, whose low end
        never falls below the bytes counted from the model's tensors (the band's ends
        memoized per layout and overhead class: only the capacity differs between GPUs)."""
        tkey = (n, _overhead_key(ctx))
        band = ends.get(tkey)
        if band is None:
            b = band_of(
                rule_on(n, w0)[0], subtotal_on(n, w0, ctx), device_counted((w0, *rest), ctx)
            )
            band = ends[tkey] = (b.low_bytes, b.high_bytes)
        return memory_verdict(total_on(n, w0, ctx), capacity, band[0], band[1], spread)

    def mig_fit(target: DeviceContext) -> MIGFit | None:
        """The smallest MIG instance of the target's GPU type holding the one-device layout
        (its total does not depend on the capacity: only the comparison does)."""
        w1 = placed(1)
        if w1 is None:
            return None

        def check(d: MIGDevice) -> tuple[bool, int, Verdict]:
            t = total_on(1, w1, target)
            return t <= d.capacity_bytes, t, verdict_on(1, w1, target, d.capacity_bytes)

        return smallest_fitting(target.id, check)

    results = []
    candidates = device_count_candidates(req.max_device_count)
    for target in targets:
        key = _overhead_key(target)
        layout_fits = []
        for n in req.device_counts:
            w0 = placed(n)
            if w0 is None:
                continue
            tkey = (n, key)
            t = total_on(n, w0, target)
            capacity = target.capacity_bytes
            fits = t <= capacity
            headroom = rule_on(n, w0)[1]
            verdict = verdict_on(
                n, w0, target, capacity, (target.in_use_below, target.in_use_above)
            )
            maxima: dict[str, object] = {}
            for variable in req.solve:
                if variable == "device_count":
                    continue
                okey = (n, key, _objective_of(w0, variable))
                if okey not in searches:
                    # the objective of a layout, overhead class and variable, and its memo: the
                    # GPUs of one class differ only in capacity
                    setter = _variable_setter(w0, variable)
                    if setter is None:
                        searches[okey] = None
                    else:
                        make, limit, model_limit = setter
                        bound = min(limit, model_limit) if model_limit is not None else limit
                        searches[okey] = (
                            objective(make, w0, target, headroom),
                            bound,
                            model_limit,
                            Memo(),
                        )
                search = searches[okey]
                if search is None:
                    continue
                f, bound, model_limit, memo = search
                best = (
                    max_fitting(
                        f,
                        target.capacity_low_bytes,  # at an assumed hold's high end
                        max(bound, 1),
                        memo,
                    )
                    if bound >= 1
                    else 0
                )
                if variable == "batch":
                    maxima["batch_size"] = best
                elif variable == "concurrency":
                    maxima["concurrent_requests"] = best
                else:
                    extra = w0.generated_tokens if isinstance(w0, InferenceWorkload) else 0
                    maxima["context_tokens"] = best + extra if best else 0
                    if model_limit is not None and best >= model_limit:
                        maxima["context_limited_by_model"] = True
            warnings: list[str] = []
            latency = None
            if (req.latency_target is not None or req.prices is not None) and isinstance(
                w0, InferenceWorkload
            ):
                latency = _latency(req, w0, target, n, maxima, fits)
                if latency is None and req.latency_target is not None:
                    warnings.append(unknown_warning(target.name))
            par = w0.parallelism if not isinstance(w0, GenericWorkload) else Parallelism()
            links, link_warnings = layout_interconnect(target.id, n, par.tensor, par.pipeline)
            warnings.extend(link_warnings)
            free = target.capacity_bytes - t
            layout_fits.append(
                LayoutFit(
                    device_count=n,
                    tensor=par.tensor,
                    pipeline=par.pipeline,
                    data=par.data,
                    fits=fits,
                    verdict=verdict,
                    total_bytes=t,
                    capacity_bytes=target.capacity_bytes,
                    free_bytes=free,
                    free_percent=free_percent(free, target.capacity_bytes),
                    limiting_component=limiting[tkey]
                    if tkey in limiting
                    else limiting.setdefault(tkey, _limiting((w0, *rest), target)),
                    maxima=Maxima(**maxima),  # type: ignore[arg-type]
                    warnings=tuple(warnings),
                    interconnect=links,
                    latency=latency,
                )
            )
        min_count = None
        if "device_count" in req.solve:
            low = target.capacity_low_bytes
            for n in candidates:
                w0 = placed(n)
                if w0 is not None and total_on(n, w0, target) <= low:
                    min_count = n
                    break
        gpu_warnings: tuple[str, ...] = ()
        if "device_count" in req.solve and min_count is None:
            gpu_warnings = (
                f"does not fit on any layout of up to {req.max_device_count} "
                f"devices of {target.name}",
            )
        if target.in_use_basis is not None:
            gpu_warnings += (held_note(target),)
        results.append(
            GPUFit(
                gpu_id=target.id,
                name=target.name,
                memory_total_bytes=target.memory_total_bytes,
                layouts=tuple(layout_fits),
                min_device_count=min_count,
                warnings=gpu_warnings,
                mig=mig_fit(target),
            )
        )
    ranking = cost_ranking(results, req.prices) if req.prices is not None else ()
    return FitResponse(gpus=tuple(results), cost_ranking=ranking)


def _latency(
    req: FitRequest,
    w: InferenceWorkload,
    ctx: DeviceContext,
    n: int,
    maxima: dict[str, object],
    fits: bool,
) -> LatencyEstimate | None:
    """The roofline estimate of the layout (:mod:`vrambudget.core.latency`): the weights each
    device reads are the budget's weights and quantization metadata summed over pipeline
    stages; the memory-limited batch is the solved concurrency x batch_size (else the
    workload's own, when it fits)."""
    perf = perf_of(ctx.id)
    if perf is None:
        return None
    target = req.latency_target or LatencyTarget()
    arch = resolve_model(w.model)
    stages = workload_stages(w, ctx.overheads)
    weight_bytes = sum(
        s.values.get(Component.WEIGHTS, 0) + s.values.get(Component.QUANTIZATION_METADATA, 0)
        for s in stages
    )
    cost = model_cost(arch, w.parallelism.tensor, weight_bytes, elem_bytes(w))
    solved = maxima.get("concurrent_requests")
    if isinstance(solved, int):
        memory_max = solved * w.batch_size
    else:
        memory_max = w.batch_size * w.concurrent_requests if fits else 0
    point = Point(
        prompt_tokens=target.prompt_tokens or w.prompt_tokens,
        output_tokens=target.output_tokens or max(w.generated_tokens, 1),
    )
    fp8 = w.precision.weights == "fp8" or isinstance(w.precision.quantization, FP8)
    fmt = compute_format(w.precision.compute, fp8, perf)
    price = price_of(req.prices, ctx.id, ctx.name)
    return estimate(perf, fmt, cost, target, point, memory_max, price, n)
