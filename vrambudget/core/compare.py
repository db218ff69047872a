"""Compare a probe report with the estimate of the same workload (pure: no I/O, no torch).

The mapping from measurements onto components (docs/COMPARISON.md has it as a table):

========================  ===========================================  ==========================
quantity                  estimate components                          measured as
========================  ===========================================  ==========================
``resident_after_load``   weights, quantization_metadata, adapters     allocated after the build
                          (+ their 512-byte rounding on CUDA)          minus allocated before it
``kv_cache``              kv_cache                                     the cache tensors' bytes
``runtime_workspace``     runtime_workspace (cuBLAS/cuBLASLt part)     allocated by a first GEMM
``working_set_peak``      activations, logits, gradients,              allocated peak - resident
                          optimizer_state, master_weights (+ the       - KV cache - workspace
                          workspace's other parts; + kv_cache when
                          the report has no KV view)
``allocated_peak``        all of the above                             allocated peak
``allocator_overhead``    allocator_overhead (fragmentation part)      reserved peak - allocated
                                                                       peak
``cuda_context``          cuda_context                                 NVML used after context
                                                                       creation - baseline
``communication_buffers`` communication_buffers                        (not measured: one
                                                                       process, no communicator)
``device_used_peak``      every component but headroom                 NVML process peak (else
                                                                       device peak - baseline)
``unexplained``           (none)                                       device_used_peak -
                                                                       reserved peak - context
========================  ===========================================  ==========================

Nothing the device view shows is folded silently into a line: what neither the allocator's
reserved peak nor the CUDA context explains is reported as ``unexplained``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from .catalog import match_gpu
from .comparison import (
    Comparison,
    ComponentComparison,
    HeadroomAdvice,
    QuantityComparison,
    TierComparison,
    Verdict,
)
from .components import Component
from .errors import InvalidWorkload
from .formulas.allocator_overhead import ROUNDING_PART
from .probe_report import CustomWorkload, ProbeResource, ProbeResult
from .result import Budget, DeviceBudget, Line
from .spec import CatalogDevice, CustomDevice, DeviceRef, InferenceWorkload, Workload

__all__ = [
    "COMPARABLE_STATUSES",
    "DEFAULT_TOLERANCE_BYTES",
    "DEFAULT_TOLERANCE_PERCENT",
    "HEADROOM_FLOOR_FRACTION",
    "EstimateInput",
    "compare",
    "estimate_input",
]

C = Component
DEFAULT_TOLERANCE_PERCENT = 10.0
# Differences below this are allocator granularity, not disagreement (one 1 MiB small-pool
# segment... the CUDA caching allocator's smallest segment is 2 MiB, NVML reports 1 MiB units).
DEFAULT_TOLERANCE_BYTES = 1 << 20
# A floor on the advised headroom: one probe is one run; kernels' workspaces, driver versions
# and load vary from run to run by more than a single measurement can show.
HEADROOM_FLOOR_FRACTION = 0.02
MAX_HEADROOM_FRACTION = 0.9  # the largest Headroom.fraction a request may carry (spec.Fraction)
COMPARABLE_STATUSES = frozenset({"succeeded", "unreliable", "oom"})
_BLAS = ("cuBLAS", "cuBLASLt", "hipBLAS")

_RESIDENT = (C.WEIGHTS, C.QUANTIZATION_METADATA, C.ADAPTERS)
_WORKING = (C.ACTIVATIONS, C.LOGITS, C.GRADIENTS, C.OPTIMIZER_STATE, C.MASTER_WEIGHTS)


@dataclass(frozen=True, slots=True)
class EstimateInput:
    """What to estimate for a report: the workload as run, the device, and why."""

    workload: Workload
    device: DeviceRef | None
    gpu_id: str | None
    notes: tuple[str, ...]


# --------------------------------------------------------------------------- the device ----


def estimate_input(report: ProbeResource, gpu_id: str | None = None) -> EstimateInput:
    """The workload and device to estimate for ``report`` (raises InvalidWorkload with the
    report's field when it cannot be compared)."""
    if report.status not in COMPARABLE_STATUSES or report.result is None:
        raise InvalidWorkload("status", f"a probe with status {report.status!r} has no "
                              f"measurement to compare; allowed: "
                              f"{', '.join(sorted(COMPARABLE_STATUSES))}")
    w = report.request.workload
    if isinstance(w, CustomWorkload):
        raise InvalidWorkload("request.workload.kind", "a custom entry point has no workload "
                              "spec to estimate; compare inference or training probes")
    notes: list[str] = []
    concurrency = report.request.concurrency
    workload: Workload = w
    if concurrency > 1 and isinstance(w, InferenceWorkload):
        # Each stream runs the whole request on its own cache: the estimate is of the streams'
        # sequences batched, which has the same KV cache and (to first order) the same working
        # set as the streams side by side.
        workload = msgspec.structs.replace(w, concurrent_requests=w.concurrent_requests *
                                           concurrency)
        notes.append(f"{concurrency} concurrent streams estimated as concurrent_requests x "
                     f"{concurrency} on one device")
    res = report.result
    device: DeviceRef | None = None
    if gpu_id is not None:
        device = CatalogDevice(id=gpu_id)
    elif res.device == "cuda":
        g = match_gpu(res.device_name, res.memory_total_bytes, res.compute_capability)
        if g is not None:
            gpu_id = g.id
            device = CatalogDevice(id=g.id)
        elif res.memory_total_bytes is not None:
            device = CustomDevice(name=res.device_name[:128] or "custom",
                                  memory_total_bytes=res.memory_total_bytes)
            notes.append(f"{res.device_name!r} matched no catalog GPU: estimated with generic "
                         "overheads and the reported total memory")
        else:
            notes.append(f"{res.device_name!r}: no total memory in the report and no catalog "
                         "match; estimated without a device")
    return EstimateInput(workload, device, gpu_id, tuple(notes))


# ------------------------------------------------------------------------- comparisons -----


def _verdict(estimate: int, measured: int, tolerance_percent: float, tolerance_bytes: int
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


def _quantity(name: str, comps: Iterable[Component], estimate: int | None,
              measured: int | None, measured_by: str, tol: _Tol, *,
              unavailable: Verdict = "not_measured", note: str | None = None
              ) -> QuantityComparison:
    if estimate is None or measured is None:
        return QuantityComparison(name=name, components=tuple(comps), estimate_bytes=estimate,
                                  measured_bytes=measured, difference_bytes=None,
                                  difference_percent=None, verdict=unavailable,
                                  measured_by=measured_by, note=note)
    diff = estimate - measured
    return QuantityComparison(name=name, components=tuple(comps), estimate_bytes=estimate,
                              measured_bytes=measured, difference_bytes=diff,
                              difference_percent=_percent(diff, measured),
                              verdict=_verdict(estimate, measured, tol.percent, tol.bytes),
                              measured_by=measured_by, note=note)


def _parts(line: Line) -> dict[str, int]:
    return {p.name: p.bytes for p in line.parts}


def _split_workspace(line: Line) -> tuple[int, int]:
    """(the BLAS workspaces, the rest: QLoRA dequantization, autocast cache)."""
    if not line.parts:
        return line.bytes, 0
    blas = sum(b for n, b in _parts(line).items() if n.startswith(_BLAS))
    return blas, line.bytes - blas


def _tier(method: str, dev: DeviceBudget, res: ProbeResult, tol: _Tol, streams: int = 1
          ) -> tuple[TierComparison, dict[str, int | None]]:
    lines = {ln.component: ln for ln in dev.lines}
    est = {c: ln.bytes for c, ln in lines.items()}
    cuda = res.device == "cuda"
    t = res.torch
    nv = res.nvml
    rounding = _parts(lines[C.ALLOCATOR_OVERHEAD]).get(ROUNDING_PART, 0) if cuda else 0
    blas, ws_rest = _split_workspace(lines[C.RUNTIME_WORKSPACE])
    stream_ws = 0
    if cuda and streams > 1:
        # cuBLAS keeps one workspace per (handle, stream): each extra stream of the load phase
        # allocates another, after the measured first one, inside the working set.
        stream_ws = (streams - 1) * blas
    kv_measured = t.kv_cache_bytes
    ws_measured = t.workspace_bytes if cuda else None

    q: list[QuantityComparison] = []
    resident_est = sum(est[c] for c in _RESIDENT) + rounding
    q.append(_quantity(
        "resident_after_load", _RESIDENT, resident_est, t.weights_bytes,
        "torch allocated after the model was built, minus allocated before it"
        if cuda else "tracker's live bytes after the model was built", tol))
    q.append(_quantity("kv_cache", (C.KV_CACHE,), est[C.KV_CACHE], kv_measured,
                       "the cache tensors' bytes, rounded to 512-byte blocks" if cuda else
                       "tracker's largest live KV-cache bytes", tol,
                       note=None if kv_measured is not None else
                       "no KV view in the report: counted in working_set_peak"))
    if cuda:
        q.append(_quantity("runtime_workspace", (C.RUNTIME_WORKSPACE,), blas, ws_measured,
                           "torch allocated by a first 16x16 GEMM, minus its output", tol))
    else:
        q.append(_quantity("runtime_workspace", (C.RUNTIME_WORKSPACE,), blas, None,
                           "(CPU: no cuBLAS)", tol, unavailable="not_applicable"))
    working_comps = list(_WORKING) + ([C.KV_CACHE] if kv_measured is None else [])
    working_est = sum(est[c] for c in working_comps) + ws_rest + stream_ws
    working_meas = t.allocated_peak_bytes - t.weights_bytes - (kv_measured or 0) - (
        ws_measured or 0)
    q.append(_quantity("working_set_peak", working_comps, working_est, working_meas,
                       "allocated peak (after warm-up) - resident_after_load - kv_cache - "
                       "runtime_workspace", tol,
                       note=f"includes {streams - 1} more stream(s)' cuBLAS workspaces "
                       f"({stream_ws} B)" if stream_ws else None))
    allocated_comps = (*_RESIDENT, C.KV_CACHE, *_WORKING) + (
        (C.RUNTIME_WORKSPACE,) if cuda else ())
    allocated_est = sum(est[c] for c in allocated_comps) + rounding + (0 if cuda else ws_rest)
    q.append(_quantity("allocated_peak", allocated_comps, allocated_est,
                       t.allocated_peak_bytes,
                       "torch.cuda.max_memory_allocated()" if cuda else "tracker's peak", tol))
    frag_est = est[C.ALLOCATOR_OVERHEAD] - rounding
    if cuda and t.reserved_peak_bytes is not None:
        q.append(_quantity("allocator_overhead", (C.ALLOCATOR_OVERHEAD,), frag_est,
                           t.reserved_peak_bytes - t.allocated_peak_bytes,
                           "max_memory_reserved() - max_memory_allocated() (the two peaks may "
                           "fall at different moments)", tol))
    else:
        q.append(_quantity("allocator_overhead", (C.ALLOCATOR_OVERHEAD,), frag_est, None,
                           "(CPU: no caching allocator)" if not cuda else
                           "(no reserved counter in the report)", tol,
                           unavailable="not_applicable" if not cuda else "not_measured"))
    if not cuda:
        q.append(_quantity("cuda_context", (C.CUDA_CONTEXT,), est[C.CUDA_CONTEXT], None,
                           "(CPU: no CUDA context)", tol, unavailable="not_applicable"))
    else:
        q.append(_quantity("cuda_context", (C.CUDA_CONTEXT,), est[C.CUDA_CONTEXT],
                           nv.cuda_context_bytes if nv else None,
                           "NVML device used after torch.cuda.init() - baseline", tol,
                           note=None if nv else "no NVML view in the report"))
    comm = est[C.COMMUNICATION_BUFFERS]
    q.append(_quantity("communication_buffers", (C.COMMUNICATION_BUFFERS,), comm, None,
                       "(a single-process probe creates no communicator)", tol,
                       unavailable="not_measured" if comm else "not_applicable"))
    device_comps = tuple(c for c in Component if c is not C.HEADROOM)
    device_est = sum(est[c] for c in device_comps)
    used = None
    if nv is not None:
        used = nv.process_peak_used_bytes if nv.process_peak_used_bytes is not None else (
            nv.peak_used_bytes - nv.baseline_used_bytes)
    q.append(_quantity("device_used_peak", device_comps, device_est, used,
                       "NVML: this process's peak used memory (else device peak - baseline)",
                       tol, unavailable="not_applicable" if not cuda else "not_measured"))
    unexplained = None
    if used is not None and nv is not None and t.reserved_peak_bytes is not None:
        unexplained = used - t.reserved_peak_bytes - nv.cuda_context_bytes
    q.append(_quantity("unexplained", (), 0 if unexplained is not None else None, unexplained,
                       "device_used_peak - max_memory_reserved() - cuda_context", tol,
                       unavailable="not_applicable" if not cuda else "not_measured",
                       note="device memory outside the allocator and the context: other "
                       "libraries (NCCL, cuDNN handles), the sampler's granularity"))

    by_name = {x.name: x for x in q}
    exact = {C.KV_CACHE: "kv_cache", C.CUDA_CONTEXT: "cuda_context",
             C.COMMUNICATION_BUFFERS: "communication_buffers"}
    if not ws_rest:
        exact[C.RUNTIME_WORKSPACE] = "runtime_workspace"
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
            rows.append(ComponentComparison(
                component=c, estimate_bytes=est[c], measured_bytes=m.measured_bytes,
                difference_bytes=m.difference_bytes, difference_percent=m.difference_percent,
                verdict=m.verdict, quantity=name))
            continue
        quantity = name or containing.get(c)
        verdict: Verdict = "grouped"
        if c is C.HEADROOM:
            verdict = "not_applicable"
        elif quantity is None or by_name[quantity].verdict in ("not_applicable",
                                                               "not_measured"):
            verdict = by_name[quantity].verdict if quantity else "not_measured"
        rows.append(ComponentComparison(component=c, estimate_bytes=est[c], measured_bytes=None,
                                        difference_bytes=None, difference_percent=None,
                                        verdict=verdict, quantity=quantity))
    subtotal = dev.total_bytes - est[C.HEADROOM]
    tier = TierComparison(method=method, estimate_subtotal_bytes=subtotal,  # type: ignore[arg-type]
                          quantities=tuple(q), components=tuple(rows))
    # What the report's device can be compared with: on the CPU only what the tracker sees.
    comparable = subtotal if cuda else allocated_est
    return tier, {"device_used": used, "working_set": working_meas, "comparable": comparable}


def _headroom(report: ProbeResource, analytic: TierComparison, observed: dict[str, int | None]
              ) -> HeadroomAdvice:
    res = report.result
    assert res is not None
    t = res.torch
    reasons: list[str] = []
    subtotal = observed["comparable"] or analytic.estimate_subtotal_bytes
    if observed["device_used"] is not None:
        measured_total = observed["device_used"]
        basis = "NVML device used peak"
    elif t.reserved_peak_bytes is not None:
        measured_total = t.reserved_peak_bytes + (res.nvml.cuda_context_bytes if res.nvml else 0)
        basis = "reserved peak (+ CUDA context)"
    else:
        measured_total = t.allocated_peak_bytes
        basis = "allocated peak"
    assert measured_total is not None
    shortfall = max(0, measured_total - subtotal)
    total = 0
    if shortfall:
        reasons.append(f"the analytic estimate ({subtotal} B) is {shortfall} B below the "
                       f"measured {basis} ({measured_total} B)")
        total += shortfall
    peaks = t.iteration_peak_bytes
    if len(peaks) >= 2:
        spread = max(peaks) - min(peaks)
        if spread:
            reasons.append(f"the allocated peak varied by {spread} B across {len(peaks)} "
                           "measured iterations")
            total += spread
    elif report.request.concurrency > 1:
        reasons.append(f"{report.request.concurrency} overlapping streams: no per-iteration "
                       "spread is measurable; the peak seen depends on how streams interleave")
    if t.num_alloc_retries:
        stranded = t.inactive_split_peak_bytes or 0
        reasons.append(f"the allocator freed its cache and retried {t.num_alloc_retries} "
                       f"times (the run was near its limit); {stranded} B sat in inactive "
                       "split blocks at the peak")
        total += stranded
    if report.status == "oom":
        reasons.append("the probe ran out of memory: the measured peak is a lower bound")
    # Exact integers (millionths of a byte): a float quotient rounds 7/100 up to 8%, and the
    # floor's own byte rounding must not lift a 2% floor to 3%.
    floor_ppm = round(HEADROOM_FLOOR_FRACTION * 1_000_000) * max(measured_total, subtotal)
    floor = -(-floor_ppm // 1_000_000)
    total_ppm = total * 1_000_000
    if total < floor:
        reasons.append(f"floor of {HEADROOM_FLOOR_FRACTION:.0%} of the larger of estimate and "
                       f"measurement ({floor} B): run-to-run variation one probe cannot show")
        total, total_ppm = floor, floor_ppm
    fraction = -(-total_ppm * 100 // (subtotal * 1_000_000)) / 100 if subtotal > 0 else 0.0
    if fraction > MAX_HEADROOM_FRACTION:
        reasons.append(f"{fraction:.0%} is above the {MAX_HEADROOM_FRACTION:.0%} a request's "
                       f"headroom.fraction may be: pass headroom.min_bytes = {total} instead")
    return HeadroomAdvice(fraction=fraction, bytes=total, reasons=tuple(reasons))


def compare(report: ProbeResource, estimates: dict[str, Budget], inp: EstimateInput, *,
            tolerance_percent: float = DEFAULT_TOLERANCE_PERCENT,
            tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES) -> Comparison:
    """The comparison of ``report`` with the estimates of ``inp`` (``analytic`` required;
    ``trace`` optional), on the estimate's most loaded device."""
    res = report.result
    if res is None:
        raise InvalidWorkload("result", "the report has no result to compare")
    tol = _Tol(tolerance_percent, tolerance_bytes)
    tiers = []
    observed: dict[str, int | None] = {}
    for method in ("analytic", "trace"):
        budget = estimates.get(method)
        if budget is None:
            continue
        tier, seen = _tier(method, budget.devices[budget.most_loaded], res, tol,
                           report.request.concurrency)
        tiers.append(tier)
        if method == "analytic":
            observed = seen
    degraded = []
    views = ["torch"]
    if res.device == "cpu":
        degraded.append("CPU path: the tracker stands in for the CUDA allocator; no CUDA "
                        "context, cuBLAS workspace, caching-allocator overhead or NVML view")
    elif res.nvml is None:
        degraded.append("no NVML view (driver library absent or the device not found): CUDA "
                        "context, device used peak and unexplained memory are not measured")
    else:
        views.append("nvml")
        if not res.nvml.others_visible:
            degraded.append("NVML could not tell this process's memory from other processes' "
                            "(PID namespace): device_used_peak may include them")
    if res.torch.kv_cache_bytes is None and isinstance(report.request.workload,
                                                        InferenceWorkload):
        degraded.append("no KV-cache view: the KV cache is compared inside working_set_peak")
    if report.status == "oom":
        degraded.append("out of memory: measured peaks are those reached before the failure")
    return Comparison(
        probe_id=report.id, status=report.status, device=res.device, device_name=res.device_name,
        gpu_id=inp.gpu_id, tolerance_percent=tolerance_percent, tolerance_bytes=tolerance_bytes,
        views=tuple(views), degraded=tuple(degraded), tiers=tuple(tiers),
        headroom=_headroom(report, tiers[0], observed), notes=inp.notes)
