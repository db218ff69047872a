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

Modules: ``inputs`` (the workload and device a report is estimated for), ``tiers`` (one tier's
quantities and components against the measurement, with the tolerances) and ``headroom`` (the
advised headroom); :func:`compare` here puts them together.
"""

from __future__ import annotations

from ..comparison import Comparison
from ..errors import InvalidWorkload
from ..probe_report import ProbeResource, measured_torch
from ..result import Budget
from ..spec import InferenceWorkload
from .headroom import HEADROOM_FLOOR_FRACTION, _headroom
from .inputs import COMPARABLE_STATUSES, EstimateInput, estimate_input
from .tiers import DEFAULT_TOLERANCE_BYTES, DEFAULT_TOLERANCE_PERCENT, _tier, _Tol

__all__ = [
    "COMPARABLE_STATUSES",
    "DEFAULT_TOLERANCE_BYTES",
    "DEFAULT_TOLERANCE_PERCENT",
    "HEADROOM_FLOOR_FRACTION",
    "EstimateInput",
    "compare",
    "estimate_input",
]


def compare(
    report: ProbeResource,
    estimates: dict[str, Budget],
    inp: EstimateInput,
    *,
    tolerance_percent: float = DEFAULT_TOLERANCE_PERCENT,
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
) -> Comparison:
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
        tier, seen = _tier(
            method, budget.devices[budget.most_loaded], res, tol, report.request.concurrency
        )
        tiers.append(tier)
        if method == "analytic":
            observed = seen
    degraded = []
    views = ["torch"]
    if res.device == "cpu":
        degraded.append(
            "CPU path: the tracker stands in for the CUDA allocator; no CUDA "
            "context, cuBLAS workspace, caching-allocator overhead or NVML view"
        )
    elif res.nvml is None:
        degraded.append(
            "no NVML view (driver library absent or the device not found): CUDA "
            "context, device used peak and unexplained memory are not measured"
        )
    else:
        views.append("nvml")
        if not res.nvml.others_visible:
            degraded.append(
                "NVML could not tell this process's memory from other processes' "
                "(PID namespace): device_used_peak may include them"
            )
    if measured_torch(res).kv_cache_bytes is None and isinstance(
        report.request.workload, InferenceWorkload
    ):
        degraded.append("no KV-cache view: the KV cache is compared inside working_set_peak")
    if report.status == "oom":
        degraded.append("out of memory: measured peaks are those reached before the failure")
    analytic = estimates.get("analytic")
    return Comparison(
        probe_id=report.id,
        model=analytic.workloads[0].name if analytic and analytic.workloads else None,
        status=report.status,
        device=res.device,
        device_name=res.device_name,
        gpu_id=inp.gpu_id,
        tolerance_percent=tolerance_percent,
        tolerance_bytes=tolerance_bytes,
        views=tuple(views),
        degraded=tuple(degraded),
        tiers=tuple(tiers),
        headroom=_headroom(report, tiers[0], observed),
        notes=inp.notes,
    )
