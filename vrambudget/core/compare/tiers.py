"""One tier's estimate (analytic or trace) against the measurement: the quantities of the
mapping table (:mod:`vrambudget.core.compare`) and each component's row, within the tolerances."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..comparison import ComponentComparison, QuantityComparison, TierComparison, Verdict
from ..components import Component
from ..formulas.allocator_overhead import ROUNDING_PART
from ..formulas.cuda_context import KERNEL_IMAGES_PART
from ..probe_report import ProbeResult, measured_torch
from ..result import DeviceBudget, Line

__all__ = ["DEFAULT_TOLERANCE_BYTES", "DEFAULT_TOLERANCE_PERCENT"]

C = Component
DEFAULT_TOLERANCE_PERCENT = 10.0
# Differences below this are allocator granularity, not disagreement (one 1 MiB small-pool
# segment... the CUDA caching allocator's smallest segment is 2 MiB, NVML reports 1 MiB units).
DEFAULT_TOLERANCE_BYTES = 1 << 20
_BLAS = ("cuBLAS", "cuBLASLt", "hipBLAS")

_RESIDENT = (C.WEIGHTS, C.QUANTIZATION_METADATA, C.ADAPTERS)
_WORKING = (C.ACTIVATIONS, C.LOGITS, C.GRADIENTS, C.OPTIMIZER_STATE, C.MASTER_WEIGHTS)


# ------------------------------------------------------------------------- comparisons -----


def _verdict(
    estimate: int, measured: int, tolerance_percent: float, tolerance_bytes: int
) -> Verdict:
    diff = estimate - measured
    if abs(diff) <= tolerance_bytes or abs(diff) <= abs(measured) * tolerance_percent / 100:
        return "within"
    return "over" if diff > 0 else "under"


def _percent(diff: int, measured: int) -> float | None:
    return None if measured == 0 else round(diff / measured * 100, 2)


@dataclass(frozen=True, slots=True)
class _Tol:
    percent: float
    bytes: int


def _quantity(
    name: str,
    comps: Iterable[Component],
    estimate: int | None,
    measured: int | None,
    measured_by: str,
    tol: _Tol,
    *,
    unavailable: Verdict = "not_measured",
    note: str | None = None,
) -> QuantityComparison:
    if estimate is None or measured is None:
        return QuantityComparison(
            name=name,
            components=tuple(comps),
            estimate_bytes=estimate,
            measured_bytes=measured,
            difference_bytes=None,
            difference_percent=None,
            verdict=unavailable,
            measured_by=measured_by,
            note=note,
        )
    diff = estimate - measured
    return QuantityComparison(
        name=name,
        components=tuple(comps),
        estimate_bytes=estimate,
        measured_bytes=measured,
        difference_bytes=diff,
        difference_percent=_percent(diff, measured),
        verdict=_verdict(estimate, measured, tol.percent, tol.bytes),
        measured_by=measured_by,
        note=note,
    )


def _parts(line: Line) -> dict[str, int]:
    return {p.name: p.bytes for p in line.parts}


def _split_workspace(line: Line) -> tuple[int, int]:
    """(the BLAS workspaces, the rest: QLoRA dequantization, autocast cache)."""
    if not line.parts:
        return line.bytes, 0
    blas = sum(b for n, b in _parts(line).items() if n.startswith(_BLAS))
    return blas, line.bytes - blas


STREAM_OUTSIDE_BYTES = 89_059_055
"""Device memory outside the allocator and the context per further load thread of a
concurrency probe (its CUDA stream, its cuBLAS/cuBLASLt handles): measured on one H200, torch
2.11 cu130, as (1,516,699,648 - 180,813,824) / 15 B -- the outside-allocator bytes of a
16-thread generate probe less those of the same workload on one thread, per extra thread
(research/data/gpu/gpu_campaign_2026-12-04T164803_h200-sxm-141gb.json)."""


def _split_context(line: Line) -> tuple[int, int]:
    """(the context as created, the kernel images loaded after it: every part so named, a
    co-located workload's prefixed with its name)."""
    images = sum(p.bytes for p in line.parts if p.name.endswith(KERNEL_IMAGES_PART))
    return line.bytes - images, images


def _tier(
    method: str, dev: DeviceBudget, res: ProbeResult, tol: _Tol, streams: int = 1
) -> tuple[TierComparison, dict[str, int | None]]:
    lines = {ln.component: ln for ln in dev.lines}
    est = {c: ln.bytes for c, ln in lines.items()}
    cuda = res.device == "cuda"
    t = measured_torch(res)
    nv = res.nvml
    rounding = _parts(lines[C.ALLOCATOR_OVERHEAD]).get(ROUNDING_PART, 0) if cuda else 0
    blas, ws_rest = _split_workspace(lines[C.RUNTIME_WORKSPACE])
    context_est, images_est = _split_context(lines[C.CUDA_CONTEXT])
    stream_ws = stream_outside = 0
    if cuda and streams > 1:
        # cuBLAS keeps one workspace per (handle, stream): each extra stream of the load phase
        # allocates another, after the measured first one, inside the working set; and each
        # further load thread's stream and library handles take memory outside the allocator.
        stream_ws = (streams - 1) * blas
        stream_outside = (streams - 1) * STREAM_OUTSIDE_BYTES
    kv_measured = t.kv_cache_bytes
    ws_measured = t.workspace_bytes if cuda else None

    q: list[QuantityComparison] = []
    resident_est = sum(est[c] for c in _RESIDENT) + rounding
    q.append(
        _quantity(
            "resident_after_load",
            _RESIDENT,
            resident_est,
            t.weights_bytes,
            "torch allocated after the model was built, minus allocated before it"
            if cuda
            else "tracker's live bytes after the model was built",
            tol,
        )
    )
    q.append(
        _quantity(
            "kv_cache",
            (C.KV_CACHE,),
            est[C.KV_CACHE],
            kv_measured,
            "the cache tensors' bytes, rounded to 512-byte blocks"
            if cuda
            else "tracker's largest live KV-cache bytes",
            tol,
            note=None
            if kv_measured is not None
            else "no KV view in the report: counted in working_set_peak",
        )
    )
    if cuda:
        q.append(
            _quantity(
                "runtime_workspace",
                (C.RUNTIME_WORKSPACE,),
                blas,
                ws_measured,
                "torch allocated by a first 16x16 GEMM, minus its output",
                tol,
            )
        )
    else:
        q.append(
            _quantity(
                "runtime_workspace",
                (C.RUNTIME_WORKSPACE,),
                blas,
                None,
                "(CPU: no cuBLAS)",
                tol,
                unavailable="not_applicable",
            )
        )
    working_comps = list(_WORKING) + ([C.KV_CACHE] if kv_measured is None else [])
    working_est = sum(est[c] for c in working_comps) + ws_rest + stream_ws
    working_meas = (
        t.allocated_peak_bytes - t.weights_bytes - (kv_measured or 0) - (ws_measured or 0)
    )
    q.append(
        _quantity(
            "working_set_peak",
            working_comps,
            working_est,
            working_meas,
            "allocated peak (after warm-up) - resident_after_load - kv_cache - runtime_workspace",
            tol,
            note=f"includes {streams - 1} more stream(s)' cuBLAS workspaces ({stream_ws} B)"
            if stream_ws
            else None,
        )
    )
    allocated_comps = (*_RESIDENT, C.KV_CACHE, *_WORKING) + ((C.RUNTIME_WORKSPACE,) if cuda else ())
    allocated_est = (
        sum(est[c] for c in allocated_comps) + rounding + (0 if cuda else ws_rest) + stream_ws
    )
    q.append(
        _quantity(
            "allocated_peak",
            allocated_comps,
            allocated_est,
            t.allocated_peak_bytes,
            "torch.cuda.max_memory_allocated()" if cuda else "tracker's peak",
            tol,
        )
    )
    frag_est = est[C.ALLOCATOR_OVERHEAD] - rounding
    if cuda and t.reserved_peak_bytes is not None:
        q.append(
            _quantity(
                "allocator_overhead",
                (C.ALLOCATOR_OVERHEAD,),
                frag_est,
                t.reserved_peak_bytes - t.allocated_peak_bytes,
                "max_memory_reserved() - max_memory_allocated() (the two peaks may "
                "fall at different moments)",
                tol,
            )
        )
    else:
        q.append(
            _quantity(
                "allocator_overhead",
                (C.ALLOCATOR_OVERHEAD,),
                frag_est,
                None,
                "(CPU: no caching allocator)"
                if not cuda
                else "(no reserved counter in the report)",
                tol,
                unavailable="not_applicable" if not cuda else "not_measured",
            )
        )
    if not cuda:
        q.append(
            _quantity(
                "cuda_context",
                (C.CUDA_CONTEXT,),
                est[C.CUDA_CONTEXT],
                None,
                "(CPU: no CUDA context)",
                tol,
                unavailable="not_applicable",
            )
        )
    else:
        q.append(
            _quantity(
                "cuda_context",
                (C.CUDA_CONTEXT,),
                context_est,
                nv.cuda_context_bytes if nv else None,
                "NVML device used after torch.cuda.init() - baseline",
                tol,
                note=None if nv else "no NVML view in the report",
            )
        )
    comm = est[C.COMMUNICATION_BUFFERS]
    q.append(
        _quantity(
            "communication_buffers",
            (C.COMMUNICATION_BUFFERS,),
            comm,
            None,
            "(a single-process probe creates no communicator)",
            tol,
            unavailable="not_measured" if comm else "not_applicable",
        )
    )
    device_comps = tuple(c for c in Component if c is not C.HEADROOM)
    device_est = sum(est[c] for c in device_comps) + stream_ws + stream_outside
    used = None
    if nv is not None:
        used = (
            nv.process_peak_used_bytes
            if nv.process_peak_used_bytes is not None
            else (nv.peak_used_bytes - nv.baseline_used_bytes)
        )
    q.append(
        _quantity(
            "device_used_peak",
            device_comps,
            device_est,
            used,
            "NVML: this process's peak used memory (else device peak - baseline)",
            tol,
            unavailable="not_applicable" if not cuda else "not_measured",
        )
    )
    unexplained = None
    if used is not None and nv is not None and t.reserved_peak_bytes is not None:
        unexplained = used - t.reserved_peak_bytes - nv.cuda_context_bytes
    q.append(
        _quantity(
            "unexplained",
            (),
            images_est + stream_outside if unexplained is not None else None,
            unexplained,
            "device_used_peak - max_memory_reserved() - cuda_context",
            tol,
            unavailable="not_applicable" if not cuda else "not_measured",
            note="device memory outside the allocator and the context: the kernel images the "
            "workload's ops load (estimated: the context line's part), each further load "
            "thread's stream and handles (estimated per thread), other libraries (NCCL, cuDNN "
            "handles), the sampler's granularity",
        )
    )

    by_name = {x.name: x for x in q}
    exact = {
        C.KV_CACHE: "kv_cache",
        C.CUDA_CONTEXT: "cuda_context",
        C.COMMUNICATION_BUFFERS: "communication_buffers",
    }
    if not ws_rest:
        exact[C.RUNTIME_WORKSPACE] = "runtime_workspace"
    if images_est:  # the context line also holds the kernel images ("unexplained" measures them)
        exact.pop(C.CUDA_CONTEXT)
    containing: dict[Component, str] = {}
    for x in q:
        for c in x.components:
            containing.setdefault(c, x.name)
    if kv_measured is None:
        exact.pop(C.KV_CACHE)
        containing[C.KV_CACHE] = "working_set_peak"
    rows = []
    for c in Component:
        name = exact.get(c)
        if name is not None and by_name[name].measured_bytes is not None:
            m = by_name[name]
            rows.append(
                ComponentComparison(
                    component=c,
                    estimate_bytes=est[c],
                    measured_bytes=m.measured_bytes,
                    difference_bytes=m.difference_bytes,
                    difference_percent=m.difference_percent,
                    verdict=m.verdict,
                    quantity=name,
                )
            )
            continue
        quantity = name or containing.get(c)
        verdict: Verdict = "grouped"
        if c is C.HEADROOM:
            verdict = "not_applicable"
        elif quantity is None or by_name[quantity].verdict in ("not_applicable", "not_measured"):
            verdict = by_name[quantity].verdict if quantity else "not_measured"
        rows.append(
            ComponentComparison(
                component=c,
                estimate_bytes=est[c],
                measured_bytes=None,
                difference_bytes=None,
                difference_percent=None,
                verdict=verdict,
                quantity=quantity,
            )
        )
    subtotal = dev.total_bytes - est[C.HEADROOM]
    tier = TierComparison(
        method=method,  # type: ignore[arg-type]
        estimate_subtotal_bytes=subtotal,
        quantities=tuple(q),
        components=tuple(rows),
    )
    # What the report's device can be compared with: on the CPU only what the tracker sees.
    comparable = subtotal + stream_ws + stream_outside if cuda else allocated_est
    return tier, {"device_used": used, "working_set": working_meas, "comparable": comparable}
