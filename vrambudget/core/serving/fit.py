"""``/v1/fits`` for an ``llm_serving`` workload: per GPU type and device count, whether the
engine starts and holds the target concurrency; the largest max_model_len; the smallest device
count; the cheapest GPU type.

Every maximum is exact: max_model_len by bisection over integers of the engine's own start check
and concurrency (both monotone in max_model_len), device counts by trying each candidate in
order.
"""

from __future__ import annotations

import dataclasses
import math

import msgspec

from ..catalog import gpus
from ..components import Component
from ..device import DeviceContext, held_note, resolve_device
from ..errors import InvalidWorkload
from ..gpu_perf import perf_of
from ..interconnect import layout_interconnect
from ..latency import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
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
from ..resolve import resolve_model
from ..result import Cheapest, FitResponse, GPUFit, LatencyEstimate, LayoutFit, Maxima, MIGFit
from ..search import largest_true
from ..spec import FP8, GGUF_ENGINES, FitRequest, LatencyTarget, LLMServingWorkload, Parallelism
from ..verdict import free_percent, serving_verdict
from .budget import device_kv_band, held_accounts, old_driver_band, stage_values
from .engine_args import serving_quantization
from .engines_fit import MAX_GGUF_DEVICES, gguf_fits, gguf_layout, sglang_fits, sglang_layout
from .releases import engine_release
from .vllm import ServingAccount, account

__all__ = ["serving_fit"]


def _layout(w: LLMServingWorkload, n: int) -> LLMServingWorkload | None:
    """n GPUs per replica: tensor parallel within an 8-GPU node (the largest valid divisor of
    n), pipeline parallel across; None when no split is valid for the model."""
    arch = resolve_model(w.model)
    for t, p in node_splits(n):
        try:
            check_layout(arch, Parallelism(tensor=t, pipeline=p))
        except InvalidWorkload:
            continue
        return msgspec.structs.replace(
            w, parallelism=msgspec.structs.replace(w.parallelism, tensor=t, pipeline=p)
        )
    return None


def _account(w: LLMServingWorkload, ctx: DeviceContext, driver: str | None) -> ServingAccount:
    try:
        return account(
            w,
            resolve_model(w.model),
            ctx.memory_total_bytes,
            ctx.name,
            ctx.memory_in_use_bytes,
            driver,
        )
    except InvalidWorkload as exc:
        raise InvalidWorkload(f"workloads[0].{exc.field}", exc.message) from None


def _fits(a: ServingAccount, target: float | None) -> bool:
    return a.would_start and (target is None or a.max_concurrency >= target)


def _largest_len(
    w: LLMServingWorkload, ctx: DeviceContext, target: float | None, driver: str | None
) -> int:
    """Largest max_model_len in [1, model max] that starts with ``target`` concurrency; 0 if
    none (fewer tokens never need more KV, so the predicate is monotone)."""
    cap = resolve_model(w.model).max_positions

    def ok(x: int) -> bool:
        return _fits(_account(msgspec.structs.replace(w, max_model_len=x), ctx, driver), target)

    return largest_true(1, cap, ok)


def _values(a: ServingAccount) -> dict[Component, int]:
    """The most loaded stage's lines (weights, KV pool, activations, context, ...)."""
    first = max(a.stages, key=lambda s: s.weights_memory_bytes + s.activation_bytes)
    return stage_values(first, a.pool_bytes(first) if first.available_bytes > 0 else 0)


def mig_context(ctx: DeviceContext, d: MIGDevice) -> DeviceContext:
    """The GPU's context with a MIG instance's memory as its total (the engine sizes its pool
    from the total it sees) and the name CUDA gives the instance. Memory other processes hold
    on the whole GPU says nothing of one instance's: an instance starts empty (as the analytic
    MIG fit counts it)."""
    return dataclasses.replace(
        ctx,
        memory_total_bytes=d.capacity_bytes,
        name=d.name,
        memory_in_use_bytes=0,
        in_use_below=0,
        in_use_above=0,
        in_use_basis=None,
        nvidia_smi_total_mib=None,
    )


def _vllm_mig(
    w: LLMServingWorkload, ctx: DeviceContext, target: float | None, driver: str | None
) -> MIGFit | None:
    """The smallest MIG instance in which vLLM starts on one instance (and holds
    ``target_concurrency``)."""
    placed = _layout(w, 1)
    if placed is None:
        return None

    def check(d: MIGDevice) -> tuple[bool, int, Verdict]:
        a = _account(placed, mig_context(ctx, d), driver)
        ok = _fits(a, target)
        return ok, sum(_values(a).values()), "fits" if ok else "does_not_fit"

    return smallest_fitting(ctx.id, check)


def serving_fit(req: FitRequest) -> FitResponse:
    w = req.workloads[0]
    assert isinstance(w, LLMServingWorkload)
    refs = tuple(gpus().values()) if req.devices is None else req.devices
    targets = [
        c
        for c in (resolve_device(r, field=f"devices[{i}]") for i, r in enumerate(refs))
        if c is not None
    ]
    target = req.target_concurrency
    driver = req.software.driver_version if req.software is not None else None
    results = []
    if w.engine != "vllm":
        return _other_engine_fit(req, w, targets)
    version = engine_release("vllm", w.engine_version).requested
    for ctx in targets:
        layouts = []
        for n in req.device_counts:
            placed = _layout(w, n)
            if placed is None:
                continue
            a = _account(placed, ctx, driver)
            values = _values(a)
            used = sum(values.values())
            held = held_accounts(placed, ctx, driver=driver)  # beside an assumed hold's ends
            maxima: dict[str, object] = {}
            if "concurrency" in req.solve:
                a_high = a if held is None else held[0]
                conc = a_high.max_concurrency if a_high.would_start else 0.0
                maxima["max_concurrency"] = round(conc, 4)
                maxima["concurrent_requests"] = math.floor(conc)
            if "max_model_len" in req.solve or "context" in req.solve:
                maxima["max_model_len"] = _largest_len(
                    placed, ctx.at_hold(high=True), target, driver
                )
            warnings: tuple[str, ...] = () if a.would_start else (f"would not start: {a.reason}",)
            latency = None
            if req.latency_target is not None or req.prices is not None:
                latency = _latency(req, placed, ctx, a, n)
                if latency is None and req.latency_target is not None:
                    warnings = (*warnings, unknown_warning(ctx.name))
                elif latency is not None:
                    if w.speculative is not None:
                        warnings = (
                            *warnings,
                            "latency: speculative decoding is not modelled (each decode step "
                            "is one token per sequence through the target model alone)",
                        )
                    length = latency.prompt_tokens + latency.output_tokens
                    if length > a.resolved.max_model_len:
                        warnings = (
                            *warnings,
                            f"latency target: prompt + output ({length} tokens) exceeds "
                            f"max_model_len ({a.resolved.max_model_len}): no request of that "
                            "length runs (memory_max_batch 0)",
                        )
            par = placed.parallelism
            links, link_warnings = layout_interconnect(ctx.id, n, par.tensor, par.pipeline)
            warnings = warnings + link_warnings
            free = ctx.capacity_bytes - used
            fits = _fits(a, target)
            old = old_driver_band(placed, a, ctx, req.software, version)
            band = device_kv_band(placed, a, ctx, held, old)
            verdict = serving_verdict(fits, band, target if target is not None else 1.0)
            layouts.append(
                LayoutFit(
                    device_count=n,
                    tensor=par.tensor,
                    pipeline=par.pipeline,
                    data=par.data,
                    fits=fits,
                    verdict=verdict,
                    total_bytes=used,
                    capacity_bytes=ctx.capacity_bytes,
                    free_bytes=free,
                    free_percent=free_percent(free, ctx.capacity_bytes),
                    limiting_component=max(values, key=lambda c: values[c]),
                    warnings=warnings,
                    maxima=Maxima(**maxima),  # type: ignore[arg-type]
                    interconnect=links,
                    latency=latency,
                )
            )
        min_count = None
        if "device_count" in req.solve:
            for n in device_count_candidates(req.max_device_count):
                placed = _layout(w, n)
                high = ctx.at_hold(high=True)
                if placed is not None and _fits(_account(placed, high, driver), target):
                    min_count = n
                    break
        results.append(
            _gpu_fit(req, ctx, layouts, min_count, "start", _vllm_mig(w, ctx, target, driver))
        )
    ranking = cost_ranking(results, req.prices) if req.prices is not None else ()
    return FitResponse(
        gpus=tuple(results), cheapest=_cheapest(results, req.prices), cost_ranking=ranking
    )


def _latency(
    req: FitRequest, w: LLMServingWorkload, ctx: DeviceContext, a: ServingAccount, n: int
) -> LatencyEstimate | None:
    """The roofline estimate of a vLLM layout (:mod:`vrambudget.core.latency`): each device
    reads its stages' weights and quantization metadata as loaded; memory holds
    ``min(max_num_seqs, KV-cache tokens // (prompt + output))`` sequences."""
    perf = perf_of(ctx.id)
    if perf is None:
        return None
    target = req.latency_target or LatencyTarget()
    point = Point(
        prompt_tokens=target.prompt_tokens or DEFAULT_PROMPT_TOKENS,
        output_tokens=target.output_tokens or DEFAULT_OUTPUT_TOKENS,
    )
    r = a.resolved
    weight_bytes = sum(s.weights_bytes + s.metadata_bytes for s in a.stages)
    cost = model_cost(resolve_model(w.model), r.tensor, weight_bytes, r.kv_bytes)
    context = point.prompt_tokens + point.output_tokens
    fits_len = a.would_start and context <= r.max_model_len
    memory_max = min(r.max_num_seqs, a.kv_tokens // context) if fits_len else 0
    fmt = compute_format(r.dtype, isinstance(serving_quantization(w), FP8), perf)
    return estimate(
        perf, fmt, cost, target, point, memory_max, price_of(req.prices, ctx.id, ctx.name), n
    )


def _other_engine_fit(
    req: FitRequest, w: LLMServingWorkload, targets: list[DeviceContext]
) -> FitResponse:
    """SGLang (tensor parallel layouts) and the GGUF engines (layers split over n GPUs)."""
    gguf = w.engine in GGUF_ENGINES
    target = req.target_concurrency
    results = []
    for ctx in targets:
        layouts = []
        for n in req.device_counts:
            if gguf:
                if n > MAX_GGUF_DEVICES:
                    continue
                layouts.append(gguf_layout(w, ctx, n, req))
            else:
                lay = sglang_layout(w, ctx, n, req)
                if lay is not None:
                    layouts.append(lay)
        min_count = None
        if "device_count" in req.solve:
            for n in device_count_candidates(req.max_device_count):
                ok = gguf_fits(w, ctx, n, target) if gguf else sglang_fits(w, ctx, n, target)
                if ok:
                    min_count = n
                    break
        verb = "fit whole" if gguf else "start"
        results.append(_gpu_fit(req, ctx, layouts, min_count, verb, _other_mig(req, w, ctx)))
    return FitResponse(gpus=tuple(results), cheapest=_cheapest(results, req.prices))


def _other_mig(req: FitRequest, w: LLMServingWorkload, ctx: DeviceContext) -> MIGFit | None:
    """SGLang and the GGUF engines on one MIG instance: the one-GPU row, no maxima solved."""
    bare = msgspec.structs.replace(req, solve=())
    gguf = w.engine in GGUF_ENGINES

    def check(d: MIGDevice) -> tuple[bool, int, Verdict]:
        mctx = mig_context(ctx, d)
        try:
            row = gguf_layout(w, mctx, 1, bare) if gguf else sglang_layout(w, mctx, 1, bare)
        except InvalidWorkload:
            return False, 0, "does_not_fit"
        if row is None:
            return False, 0, "does_not_fit"
        return row.fits, row.total_bytes, "fits" if row.fits else "does_not_fit"

    return smallest_fitting(ctx.id, check)


def _gpu_fit(
    req: FitRequest,
    ctx: DeviceContext,
    layouts: list[LayoutFit],
    min_count: int | None,
    verb: str,
    mig: MIGFit | None = None,
) -> GPUFit:
    warnings: tuple[str, ...] = ()
    if "device_count" in req.solve and min_count is None:
        warnings = (
            f"does not {verb} (or reach the target concurrency) on any layout of up to "
            f"{req.max_device_count} devices of {ctx.name}",
        )
    if ctx.in_use_basis is not None:
        warnings += (held_note(ctx),)
    return GPUFit(
        gpu_id=ctx.id,
        name=ctx.name,
        memory_total_bytes=ctx.memory_total_bytes,
        layouts=tuple(layouts),
        min_device_count=min_count,
        warnings=warnings,
        mig=mig,
    )


def _cheapest(results: list[GPUFit], prices: dict[str, float] | None) -> Cheapest | None:
    best: tuple[tuple[float, int, str], Cheapest] | None = None
    for g in results:
        if g.min_device_count is None:
            continue
        total_memory = g.memory_total_bytes * g.min_device_count
        if prices is not None:
            price = prices.get(g.gpu_id) if g.gpu_id is not None else None
            if price is None:
                price = prices.get(g.name)
            if price is None:
                continue  # no price given: not ranked
            key = (price * g.min_device_count, total_memory, g.name)
            entry = Cheapest(
                gpu_id=g.gpu_id,
                name=g.name,
                device_count=g.min_device_count,
                basis="price",
                cost=price * g.min_device_count,
                total_memory_bytes=total_memory,
            )
        else:
            # No prices: no cost is implied. The fewest devices, then the least memory per
            # device (the smallest card that does it), then the name.
            key = (float(g.min_device_count), g.memory_total_bytes, g.name)
            entry = Cheapest(
                gpu_id=g.gpu_id,
                name=g.name,
                device_count=g.min_device_count,
                basis="device_count",
                cost=None,
                total_memory_bytes=total_memory,
            )
        if best is None or key < best[0]:
            best = (key, entry)
    return best[1] if best else None
