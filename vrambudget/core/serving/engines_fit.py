"""``/v1/fits`` for SGLang and the GGUF engines: per GPU type and device count, whether the
engine starts (and, for GGUF engines, holds every layer on the GPUs), and the maxima: the
largest context, the most GPU layers, the largest quantization that fits.

Every maximum is exact: bisection over integers of the engine's own check (monotone in the
context, the layer count and the quantization ladder)."""

from __future__ import annotations

import math

import msgspec

from ..components import Component
from ..device import DeviceContext
from ..errors import InvalidWorkload
from ..interconnect import layout_interconnect
from ..mig import Verdict
from ..resolve import resolve_model
from ..result import LayoutFit, Maxima
from ..search import largest_true
from ..spec import FitRequest, GGUFOptions, LLMServingWorkload
from ..verdict import free_percent, serving_verdict
from .engines_budget import _LADDER, gguf_engine, sglang_engine, sglang_kv_band
from .gguf.engine import GGUFAccount, concurrency

__all__ = ["gguf_layout", "sglang_layout"]

C = Component
MAX_GGUF_DEVICES = 64
"""The most GPUs a GGUF deployment is budgeted over (``gguf.devices``)."""


def _layout_fit(
    ctx: DeviceContext,
    n: int,
    tp: tuple[int, int],
    fits: bool,
    values: dict[Component, int],
    warnings: tuple[str, ...],
    maxima: dict[str, object],
    verdict: Verdict | None = None,
) -> LayoutFit:
    """One layout's row: ``values`` the most loaded GPU's lines, ``tp`` (tensor, pipeline);
    ``verdict`` where it is not ``fits`` by itself."""
    used = sum(values.values())
    free = ctx.capacity_bytes - used
    links, link_warnings = layout_interconnect(ctx.id, n, tp[0], tp[1])
    return LayoutFit(
        device_count=n,
        tensor=tp[0],
        pipeline=tp[1],
        data=1,
        fits=fits,
        verdict=verdict or ("fits" if fits else "does_not_fit"),
        total_bytes=used,
        capacity_bytes=ctx.capacity_bytes,
        free_bytes=free,
        free_percent=free_percent(free, ctx.capacity_bytes),
        limiting_component=max(values, key=lambda c: values[c]),
        warnings=warnings + link_warnings,
        maxima=Maxima(**maxima),  # type: ignore[arg-type]
        interconnect=links,
    )


def _opts(w: LLMServingWorkload) -> GGUFOptions:
    return w.gguf if w.gguf is not None else GGUFOptions()


def _with(w: LLMServingWorkload, **changes: object) -> LLMServingWorkload:
    return msgspec.structs.replace(w, gguf=msgspec.structs.replace(_opts(w), **changes))


def _whole(w: LLMServingWorkload, g: GGUFAccount) -> bool:
    """Starts with every layer on the GPUs (or with the layers the request fixed) and no
    expert weight that --fit moved to host memory (or those the request placed there)."""
    full = resolve_model(w.model).num_layers + 1
    o = _opts(w)
    layers = o.n_gpu_layers is not None or g.settings.n_gpu_layers >= full
    experts = o.n_cpu_moe > 0 or g.settings.n_cpu_moe == 0
    return g.would_start and layers and experts


def _try(w: LLMServingWorkload, ctx: DeviceContext) -> GGUFAccount | None:
    try:
        return gguf_engine(w, ctx)[1]
    except InvalidWorkload:
        return None


def gguf_layout(w: LLMServingWorkload, ctx: DeviceContext, n: int, req: FitRequest) -> LayoutFit:
    placed = _with(
        w, devices=n, tensor_split=None if n != _opts(w).devices else _opts(w).tensor_split
    )
    _, g = gguf_engine(placed, ctx)
    arch = resolve_model(w.model)
    d = max(g.account.devices, key=lambda x: x.buffers_bytes)
    values = {
        C.WEIGHTS: d.weights_bytes,
        C.KV_CACHE: d.kv_bytes,
        C.ACTIVATIONS: d.compute_bytes,
        C.CUDA_CONTEXT: g.context_bytes,
    }
    slots = concurrency(g)
    target = req.target_concurrency
    fits = _whole(placed, g) and (target is None or slots >= target)
    # the maxima hold beside the high end of an assumed hold (a desktop session's)
    high = ctx.at_hold(high=True)
    g_high = _try(placed, high) if high is not ctx else g
    maxima: dict[str, object] = {}
    if "concurrency" in req.solve:
        slots_high = concurrency(g_high) if g_high is not None and g_high.would_start else 0.0
        maxima["max_concurrency"] = round(slots_high, 4)
        maxima["concurrent_requests"] = math.floor(slots_high)
    if "context" in req.solve or "max_model_len" in req.solve:

        def ctx_ok(x: int) -> bool:
            g2 = _try(_with(placed, n_ctx=x), high)
            return g2 is not None and _whole(placed, g2)

        cap = arch.max_positions * (g.settings.n_parallel if w.engine == "llama_cpp" else 1)
        best = largest_true(1, cap, ctx_ok)
        maxima["context_tokens"] = best
        maxima["context_limited_by_model"] = best >= cap
    if "gpu_layers" in req.solve:
        full = arch.num_layers + 1

        def ngl_ok(x: int) -> bool:
            g2 = _try(_with(placed, n_gpu_layers=x), high)
            return g2 is not None and g2.would_start

        maxima["n_gpu_layers"] = max(largest_true(0, full, ngl_ok), 0) if ngl_ok(0) else 0
    if "file_type" in req.solve and _opts(w).tensors is None:
        best_ft = None
        for ft in _LADDER:
            g2 = _try(_with(placed, file_type=ft), high)
            if g2 is not None and _whole(placed, g2):
                best_ft = ft
                break
        maxima["file_type"] = best_ft
    verdict: Verdict | None = None
    if (
        fits
        and high is not ctx
        and (
            g_high is None
            or not _whole(placed, g_high)
            or g_high.settings.n_ctx < g.settings.n_ctx  # --fit shrank the context
            or (target is not None and concurrency(g_high) < target)
        )
    ):
        verdict = "fits_if_low"  # not beside the high end of the desktop's assumed hold
    warnings: list[str] = []
    if not g.would_start:
        warnings.append(f"would not start: {g.reason}")
    elif not _whole(placed, g):
        if g.settings.n_gpu_layers > arch.num_layers:
            warnings.append(
                f"every layer fits on the GPUs only with the expert weights of "
                f"{g.account.host_expert_layers} layers in host memory, where llama.cpp's --fit "
                "places them"
            )
        else:
            warnings.append(
                f"only {g.settings.n_gpu_layers} of {arch.num_layers + 1} layers fit on the "
                f"GPUs ({g.fitted})"
            )
    return _layout_fit(ctx, n, (1, n), fits, values, tuple(warnings), maxima, verdict)


def gguf_fits(w: LLMServingWorkload, ctx: DeviceContext, n: int, target: float | None) -> bool:
    if n > MAX_GGUF_DEVICES:
        return False
    g = _try(_with(w, devices=n, tensor_split=None), ctx.at_hold(high=True))
    return g is not None and _whole(w, g) and (target is None or concurrency(g) >= target)


def _sglang_ok(w: LLMServingWorkload, ctx: DeviceContext, target: float | None) -> bool:
    try:
        run = sglang_engine(w, ctx)
    except InvalidWorkload:
        return False
    a = run.account
    conc = a.max_total_num_tokens / max(run.context_len, 1)
    return a.would_start and conc >= (target if target is not None else 1.0)


def sglang_placed(w: LLMServingWorkload, n: int) -> LLMServingWorkload | None:
    arch = resolve_model(w.model)
    if n > 8 or arch.num_heads % n:
        return None
    return msgspec.structs.replace(w, parallelism=msgspec.structs.replace(w.parallelism, tensor=n))


def sglang_fits(w: LLMServingWorkload, ctx: DeviceContext, n: int, target: float | None) -> bool:
    """Starts on ``n`` GPUs with ``target`` concurrency (beside an assumed hold's high end)."""
    placed = sglang_placed(w, n)
    return placed is not None and _sglang_ok(placed, ctx.at_hold(high=True), target)


def sglang_layout(
    w: LLMServingWorkload, ctx: DeviceContext, n: int, req: FitRequest
) -> LayoutFit | None:
    placed = sglang_placed(w, n)
    if placed is None:
        return None
    run = sglang_engine(placed, ctx)
    a = run.account
    values = {
        C.WEIGHTS: a.weights_bytes,
        C.KV_CACHE: a.pool_bytes,
        C.ACTIVATIONS: a.graph_bytes,
        C.CUDA_CONTEXT: run.cuda_context + run.nccl,  # the capacity leaves out what others hold
    }
    target = req.target_concurrency
    # the maxima hold beside the high end of an assumed hold (a desktop session's): the band's
    # low end is the pool there
    high = ctx.at_hold(high=True)
    band = sglang_kv_band(placed, run, ctx)
    tokens = band.low if band is not None else a.max_total_num_tokens
    conc = tokens / max(run.context_len, 1)
    maxima: dict[str, object] = {}
    if "concurrency" in req.solve:
        maxima["max_concurrency"] = round(conc, 4)
        maxima["concurrent_requests"] = math.floor(conc)
    if "max_model_len" in req.solve or "context" in req.solve:
        cap = resolve_model(w.model).max_positions
        maxima["max_model_len"] = largest_true(
            1,
            cap,
            lambda x: _sglang_ok(msgspec.structs.replace(placed, max_model_len=x), high, target),
        )
    fits = _sglang_ok(placed, ctx, target)
    warnings = () if a.would_start else (f"would not start: {a.reason}",)
    verdict = serving_verdict(fits, band, target if target is not None else 1.0)
    return _layout_fit(ctx, n, (n, 1), fits, values, warnings, maxima, verdict)
