"""The headroom a probe report advises: the estimate's shortfall, the spread between measured
iterations and what sat stranded in split blocks, with a floor."""

from __future__ import annotations

from ..comparison import HeadroomAdvice, TierComparison
from ..probe_report import ProbeResource, measured_torch

__all__ = ["HEADROOM_FLOOR_FRACTION", "MAX_HEADROOM_FRACTION"]

# A floor on the advised headroom: one probe is one run; kernels' workspaces, driver versions
# and load vary from run to run by more than a single measurement can show.
HEADROOM_FLOOR_FRACTION = 0.02
MAX_HEADROOM_FRACTION = 0.9  # the largest Headroom.fraction a request may carry (spec.Fraction)


def _headroom(
    report: ProbeResource, analytic: TierComparison, observed: dict[str, int | None]
) -> HeadroomAdvice:
    res = report.result
    assert res is not None
    t = measured_torch(res)
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
        reasons.append(
            f"the analytic estimate ({subtotal} B) is {shortfall} B below the "
            f"measured {basis} ({measured_total} B)"
        )
        total += shortfall
    peaks = t.iteration_peak_bytes
    if len(peaks) >= 2:
        spread = max(peaks) - min(peaks)
        if spread:
            reasons.append(
                f"the allocated peak varied by {spread} B across {len(peaks)} measured iterations"
            )
            total += spread
    elif report.request.concurrency > 1:
        reasons.append(
            f"{report.request.concurrency} overlapping streams: no per-iteration "
            "spread is measurable; the peak seen depends on how streams interleave"
        )
    if t.num_alloc_retries:
        stranded = t.inactive_split_peak_bytes or 0
        reasons.append(
            f"the allocator freed its cache and retried {t.num_alloc_retries} "
            f"times (the run was near its limit); {stranded} B sat in inactive "
            "split blocks at the peak"
        )
        total += stranded
    if report.status == "oom":
        reasons.append("the probe ran out of memory: the measured peak is a lower bound")
    # Exact integers (millionths of a byte): a float quotient rounds 7/100 up to 8%, and the
    # floor's own byte rounding must not lift a 2% floor to 3%.
    floor_ppm = round(HEADROOM_FLOOR_FRACTION * 1_000_000) * max(measured_total, subtotal)
    floor = -(-floor_ppm // 1_000_000)
    total_ppm = total * 1_000_000
    if total < floor:
        reasons.append(
            f"floor of {HEADROOM_FLOOR_FRACTION:.0%} of the larger of estimate and "
            f"measurement ({floor} B): run-to-run variation one probe cannot show"
        )
        total, total_ppm = floor, floor_ppm
    fraction = -(-total_ppm * 100 // (subtotal * 1_000_000)) / 100 if subtotal > 0 else 0.0
    if fraction > MAX_HEADROOM_FRACTION:
        reasons.append(
            f"{fraction:.0%} is above the {MAX_HEADROOM_FRACTION:.0%} a request's "
            f"headroom.fraction may be: pass headroom.min_bytes = {total} instead"
        )
    return HeadroomAdvice(fraction=fraction, bytes=total, reasons=tuple(reasons))
