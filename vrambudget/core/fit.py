"""Fit checks against GPUs, and solved maxima (largest batch, context, concurrency that fit;
smallest device count per GPU type).

Every solved maximum is tight by construction: the search keeps a bracket ``f(lo) <= capacity <
f(hi)`` of the monotone objective (the most loaded device's total, headroom included) and stops
when ``hi == lo + 1``. Steps interpolate inside the bracket (budgets are nearly linear in batch
and concurrency, quadratic at worst in context) and fall back to bisection when interpolation
stalls, so a search costs a handful of evaluations; evaluations are shared between GPUs whose
overheads are equal.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .calibration import ProfileSet
from .catalog import GPU, gpus
from .components import Component
from .errors import InvalidWorkload
from .estimate import (
    DeviceContext,
    device_totals,
    dtype_warnings,
    headroom_bytes,
    inference_total,
    resolve_device,
    statics_for,
    workload_stages,
)
from .layout import check_layout
from .overheads import Overheads
from .resolve import resolve_model
from .spec import (
    MAX_TOKENS,
    DeviceRef,
    GenericWorkload,
    Headroom,
    InferenceWorkload,
    LLMServingWorkload,
    Parallelism,
    Software,
    TrainingWorkload,
    Workload,
    check_serving_alone,
)

__all__ = ["Cheapest", "FitRequest", "FitResponse", "GPUFit", "LayoutFit", "Maxima", "Memo",
           "fit", "max_fitting"]

Variable = Literal["batch", "context", "concurrency", "device_count", "max_model_len"]
GPUS_PER_NODE = 8


class FitRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One workload (plus co-located ones) against many GPUs and device counts."""

    workloads: Annotated[
        tuple[Workload, ...],
        Meta(min_length=1, max_length=16, description="The workload to fit first (the one laid "
             "out on device_counts and solved for), then up to 15 co-located ones that keep "
             "their own layouts."),
    ]
    devices: Annotated[
        Annotated[tuple[DeviceRef, ...], Meta(max_length=256)] | None,
        Meta(description="Catalog GPUs and custom devices to check (at most 256); default "
             "(null): the whole catalog."),
    ] = None
    device_counts: Annotated[
        tuple[Annotated[int, Meta(ge=1, le=4096)], ...],
        Meta(min_length=1, max_length=16, description="Devices per replica to check. The first "
             "workload is laid out on them: inference as tensor parallel within 8-GPU nodes and "
             "pipeline parallel across; training as data parallel over its tensor x pipeline "
             "layout."),
    ] = (1,)
    headroom: Annotated[
        Headroom, Meta(description="Safety margin added to each device's subtotal.")
    ] = Headroom()
    solve: Annotated[
        tuple[Variable, ...],
        Meta(description="Maxima to solve. `max_model_len` (and `context`) of an `llm_serving` "
             "workload: the largest max_model_len at which the engine starts and holds "
             "`target_concurrency` sequences; `concurrency`: its maximum concurrency; "
             "`device_count`: the smallest GPU count that reaches `target_concurrency`."),
    ] = ("batch", "context", "concurrency", "device_count")
    target_concurrency: Annotated[
        Annotated[float, Meta(gt=0.0, le=float(1 << 24))] | None,
        Meta(description="`llm_serving` only: a layout fits when the engine starts and its "
             "maximum concurrency at max_model_len is at least this; default (null): when it "
             "starts."),
    ] = None
    prices: Annotated[
        Annotated[dict[Annotated[str, Meta(min_length=1, max_length=128)],
                       Annotated[float, Meta(ge=0.0, le=1e12)]], Meta(max_length=256)] | None,
        Meta(description="Price of one GPU (any unit, e.g. per hour) by catalog id or custom "
             "device name, to rank the cheapest GPU type for an `llm_serving` workload (price x "
             "smallest device count). Default (null): rank by total device memory (the catalog "
             "has no prices)."),
    ] = None

    def __post_init__(self) -> None:
        check_serving_alone(self.workloads)
    max_device_count: Annotated[
        int, Meta(ge=1, le=4096, description="Largest device count tried when solving "
                  "`device_count` (1 .. 8, then multiples of 8).")
    ] = 64
    software: Annotated[
        Software | None,
        Meta(description="Driver, CUDA and torch versions of the target: they choose each "
             "GPU's calibration profile (default: any profile of the GPU)."),
    ] = None


class Maxima(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Largest values that still fit (0: not even 1 fits; null: not solved / not applicable).
    ``*_limited`` says the value hit the request limit or the model's context length."""

    batch_size: int | None = None
    context_tokens: int | None = None
    context_limited_by_model: bool = False
    concurrent_requests: int | None = None
    max_model_len: int | None = None
    """``llm_serving``: the largest max_model_len at which the engine starts (and holds
    ``target_concurrency`` sequences)."""
    max_concurrency: float | None = None
    """``llm_serving``: the engine's maximum concurrency at the workload's max_model_len."""


class LayoutFit(msgspec.Struct, frozen=True, kw_only=True):
    device_count: int
    tensor: int
    pipeline: int
    data: int
    fits: bool
    total_bytes: int
    capacity_bytes: int
    free_bytes: int
    free_percent: float
    limiting_component: Component
    warnings: tuple[str, ...] = ()
    maxima: Maxima


class GPUFit(msgspec.Struct, frozen=True, kw_only=True):
    gpu_id: str | None
    name: str
    memory_total_bytes: int
    layouts: tuple[LayoutFit, ...]
    min_device_count: int | None
    """Smallest device count (up to max_device_count) at which the workload fits; null if none."""
    warnings: tuple[str, ...] = ()


class Cheapest(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU type whose smallest fitting device count costs least (``llm_serving``)."""

    gpu_id: str | None
    name: str
    device_count: int
    basis: Literal["price", "total_memory"]
    """`price`: price x device_count from the request's prices; `total_memory`: no prices
    given, ranked by device_count x memory_total_bytes (the catalog has no prices)."""
    cost: float | None
    total_memory_bytes: int


class FitResponse(msgspec.Struct, frozen=True, kw_only=True):
    gpus: tuple[GPUFit, ...]
    cheapest: Cheapest | None = None
    """``llm_serving`` workloads with `device_count` solved: the cheapest GPU type that fits."""


# ---------------------------------------------------------------------------- the search --


class Memo:
    """Evaluations of one monotone objective, kept sorted so a new search starts from the
    tightest bracket that earlier searches (other GPUs' capacities) already established."""

    __slots__ = ("values", "xs")

    def __init__(self) -> None:
        self.xs: list[int] = []
        self.values: dict[int, int] = {}

    def get(self, x: int, f: Callable[[int], int]) -> int:
        v = self.values.get(x)
        if v is None:
            v = self.values[x] = f(x)
            bisect.insort(self.xs, x)
        return v

    def bracket(self, capacity: int) -> tuple[int, int]:
        """(largest known x that fits, smallest known x that does not; 0 if none)."""
        xs, values = self.xs, self.values
        lo_i, hi_i = 0, len(xs)
        while lo_i < hi_i:  # first index whose value exceeds capacity (values rise with x)
            mid = (lo_i + hi_i) // 2
            if values[xs[mid]] <= capacity:
                lo_i = mid + 1
            else:
                hi_i = mid
        lo = xs[lo_i - 1] if lo_i > 0 else 0
        hi = xs[lo_i] if lo_i < len(xs) else 0
        return lo, hi


def max_fitting(f: Callable[[int], int], capacity: int, limit: int,
                known: Memo | None = None) -> int:
    """Largest x in [1, limit] with f(x) <= capacity for a non-decreasing f; 0 if f(1) does not
    fit. ``known`` memoizes f between searches of the same objective."""
    memo = known if known is not None else Memo()

    def at(x: int) -> int:
        return memo.get(x, f)

    if at(1) > capacity:
        return 0
    lo, hi = memo.bracket(capacity)
    flo = at(lo)
    fhi = at(hi) if hi else 0
    prev_x, prev_f = lo, flo
    while hi == 0:  # extrapolate until the bracket closes
        if lo >= limit:
            return limit
        if prev_x != lo and flo > prev_f:
            slope = (flo - prev_f) / (lo - prev_x)
        else:
            nxt = min(lo + 1, limit)
            slope = max(at(nxt) - flo, 1) if nxt > lo else 1
        guess = lo + int((capacity - flo) / slope) + 1
        guess = min(max(guess, lo + 1), limit)
        v = at(guess)
        prev_x, prev_f = lo, flo
        if v <= capacity:
            lo, flo = guess, v
        else:
            hi, fhi = guess, v
    bisect_next = False
    while hi - lo > 1:
        if bisect_next or fhi == flo:
            g = (lo + hi) // 2
        else:
            g = lo + int((capacity - flo) * (hi - lo) / (fhi - flo))
            g = min(max(g, lo + 1), hi - 1)
        width = hi - lo
        v = at(g)
        if v <= capacity:
            lo, flo = g, v
        else:
            hi, fhi = g, v
        bisect_next = (hi - lo) * 2 > width  # interpolation did not halve the bracket
    return lo


# ------------------------------------------------------------------------------ layouts ---


def _divisors_desc(n: int, cap: int) -> list[int]:
    return [d for d in range(min(n, cap), 0, -1) if n % d == 0]


def layout_for(w: Workload, n: int) -> Parallelism | None:
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
    for t in _divisors_desc(n, GPUS_PER_NODE):
        p = n // t
        candidate = msgspec.structs.replace(par, tensor=t, pipeline=p, data=1,
                                            virtual_stages=1, pipeline_schedule="1f1b",
                                            expert=math.gcd(par.expert, t))
        try:
            check_layout(arch, candidate)
        except InvalidWorkload:
            continue
        return candidate
    return None


def _with(w: Workload, **changes: object) -> Workload:
    return msgspec.structs.replace(w, **changes)


def _variable_setter(w: Workload, variable: Variable) -> tuple[Callable[[int], Workload], int,
                                                                 int | None] | None:
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
            model_cap = arch.max_positions - w.generated_tokens if arch.kind == "decoder" else (
                arch.max_positions)
            return (lambda x: _with(w, prompt_tokens=x)), MAX_TOKENS, max(model_cap, 0)
        case "context", TrainingWorkload():
            arch = resolve_model(w.model)
            return (lambda x: _with(w, sequence_length=x)), MAX_TOKENS, arch.max_positions
    return None


def _targets(req: FitRequest, profiles: ProfileSet | None) -> list[DeviceContext]:
    refs: tuple[DeviceRef | GPU, ...] = (tuple(gpus().values()) if req.devices is None
                                         else req.devices)
    out = []
    for ref in refs:
        ctx = resolve_device(ref, profiles, req.software)
        assert ctx is not None
        out.append(ctx)
    return out


def _limiting(workloads: tuple[Workload, ...], ctx: DeviceContext) -> Component:
    values: dict[Component, int] = {}
    for i, w in enumerate(workloads):
        top = max(workload_stages(w, ctx.overheads, i),
                  key=lambda s: sum(s.values.values()))
        for c, v in top.values.items():
            values[c] = values.get(c, 0) + v
    return max(values, key=lambda c: values[c])


def _overhead_key(ctx: DeviceContext) -> Overheads:
    """GPUs with equal overheads share evaluations (the overheads hash by value)."""
    return ctx.overheads


def fit(req: FitRequest, profiles: ProfileSet | None = None) -> FitResponse:
    if isinstance(req.workloads[0], LLMServingWorkload):
        from .serving.fit import serving_fit  # the engine's own accounting

        return serving_fit(req)
    primary, rest = req.workloads[0], req.workloads[1:]
    targets = _targets(req, profiles)
    layouts: dict[int, Parallelism | None] = {n: layout_for(primary, n) for n in
                                              sorted(set(req.device_counts))}
    # Objective memo per (device count, overheads, variable): x -> total bytes.
    memos: dict[tuple[int, Overheads, str], Memo] = {}
    totals: dict[tuple[int, Overheads], int] = {}

    def placed(n: int) -> Workload | None:
        par = layouts.get(n) if n in layouts else layout_for(primary, n)
        if par is None:
            return None
        return primary if isinstance(primary, GenericWorkload) else _with(primary,
                                                                          parallelism=par)

    rest_subtotals: dict[Overheads, int] = {}

    def total(w0: Workload, ctx: DeviceContext) -> int:
        return device_totals((w0, *rest), ctx, req.headroom)

    def objective(make: Callable[[int], Workload], w0: Workload, ctx: DeviceContext
                  ) -> Callable[[int], int]:
        """f(x) for the solver: only the primary workload varies, so the co-located ones are
        summed once, and an inference workload skips building its explained budget."""
        if not isinstance(w0, InferenceWorkload):
            return lambda x: total(make(x), ctx)
        okey = _overhead_key(ctx)
        if okey not in rest_subtotals:
            rest_subtotals[okey] = sum(
                max(sum(s.values.values()) for s in workload_stages(w, ctx.overheads, i + 1))
                for i, w in enumerate(rest))
        base = rest_subtotals[okey]
        arch = resolve_model(w0.model)
        statics = statics_for(w0, arch)
        ov, headroom = ctx.overheads, req.headroom

        def f(x: int) -> int:
            w = make(x)
            sub = base + max(inference_total(w, arch, st, ov) for st in statics)  # type: ignore[arg-type]
            return sub + headroom_bytes(sub, headroom)

        return f

    limiting: dict[tuple[int, Overheads], Component] = {}

    def total_on(n: int, w0: Workload, ctx: DeviceContext) -> int:
        """The placed workload's total on n devices of this overhead class (memoized)."""
        tkey = (n, _overhead_key(ctx))
        if tkey not in totals:
            totals[tkey] = total(w0, ctx)
        return totals[tkey]

    results = []
    for target in targets:
        key = _overhead_key(target)
        layout_fits = []
        for n in req.device_counts:
            w0 = placed(n)
            if w0 is None:
                continue
            tkey = (n, key)
            t = total_on(n, w0, target)
            fits = t <= target.memory_total_bytes
            maxima: dict[str, object] = {}
            for variable in req.solve:
                if variable == "device_count":
                    continue
                setter = _variable_setter(w0, variable)
                if setter is None:
                    continue
                make, limit, model_limit = setter
                bound = min(limit, model_limit) if model_limit is not None else limit
                memo = memos.get((n, key, variable)) or memos.setdefault((n, key, variable), Memo())
                best = max_fitting(objective(make, w0, target), target.memory_total_bytes,
                                   max(bound, 1), memo) if bound >= 1 else 0
                if variable == "batch":
                    maxima["batch_size"] = best
                elif variable == "concurrency":
                    maxima["concurrent_requests"] = best
                else:
                    extra = w0.generated_tokens if isinstance(w0, InferenceWorkload) else 0
                    maxima["context_tokens"] = best + extra if best else 0
                    if model_limit is not None and best >= model_limit:
                        maxima["context_limited_by_model"] = True
            warnings = _fit_warnings(w0, target, n)
            par = w0.parallelism if not isinstance(w0, GenericWorkload) else Parallelism()
            free = target.memory_total_bytes - t
            layout_fits.append(LayoutFit(
                device_count=n, tensor=par.tensor, pipeline=par.pipeline, data=par.data,
                fits=fits, total_bytes=t, capacity_bytes=target.memory_total_bytes, free_bytes=free,
                free_percent=round(100.0 * free / target.memory_total_bytes, 3),
                limiting_component=limiting[tkey] if tkey in limiting else limiting.setdefault(
                    tkey, _limiting((w0, *rest), target)),
                warnings=tuple(warnings), maxima=Maxima(**maxima)))  # type: ignore[arg-type]
        min_count = None
        if "device_count" in req.solve:
            for n in _count_candidates(req.max_device_count):
                w0 = placed(n)
                if w0 is not None and total_on(n, w0, target) <= target.memory_total_bytes:
                    min_count = n
                    break
        gpu_warnings: tuple[str, ...] = ()
        if "device_count" in req.solve and min_count is None:
            gpu_warnings = (f"does not fit on any layout of up to {req.max_device_count} "
                            f"devices of {target.name}",)
        results.append(GPUFit(gpu_id=target.id, name=target.name,
                              memory_total_bytes=target.memory_total_bytes,
                              layouts=tuple(layout_fits),
                              min_device_count=min_count, warnings=gpu_warnings))
    return FitResponse(gpus=tuple(results))


def _count_candidates(limit: int) -> list[int]:
    small = [n for n in (1, 2, 3, 4, 5, 6, 7, 8) if n <= limit]
    return small + list(range(16, limit + 1, 8))


def _fit_warnings(w: Workload, target: DeviceContext, n: int) -> list[str]:
    if isinstance(w, GenericWorkload):
        return []
    return dtype_warnings(w, target)
