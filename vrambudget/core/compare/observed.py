"""Headroom from observation: how much a workload's peak moved between the iterations of one
probe, and between probes of the same workload on the same device, plus a floor for what a few
runs cannot show. The estimate plays no part here (that is ``compare.headroom``): this is what
the host saw, with the number of observations it rests on."""

from __future__ import annotations

import math

from ..probe_report import ObservedHeadroom, ProbeRequest, ProbeResult
from .headroom import HEADROOM_FLOOR_FRACTION

__all__ = ["observed_headroom", "peak_of", "same_workload"]


def peak_of(res: ProbeResult) -> tuple[int, str] | None:
    """The peak headroom is added to, and its view: what the device really held for the
    workload, from the agent's NVML sampler where it ran, else PyTorch's counters.

    * ``NVML process used``: the largest memory NVML attributed to the probe's process, where it
      saw that process and the process is the whole workload (not an engine probe, whose memory
      sits in the engine's worker processes, nor an overlap, whose jobs hold memory together);
    * ``NVML device used``: the device peak minus the baseline read *before* the workload
      (``DeviceView.baseline_used_bytes``), so weights, KV cache, the context, the allocator's
      cache and other libraries all count; with ``overlap``, the peak of all the jobs together;
    * else PyTorch's reserved peak, else its allocated peak.

    A device view without ``load_baseline_used_bytes`` was not filled by the sampler (or was
    stored before the load-phase reading got its own field, when the baseline was the load
    phase's): its NVML figures are not used."""
    nv = res.nvml
    if nv is not None and nv.load_baseline_used_bytes is not None:
        own = nv.process_peak_used_bytes
        if own is not None and own > 0 and res.engine is None and not res.overlap:
            return own, "NVML process used"
        if nv.peak_used_bytes > nv.baseline_used_bytes:
            return nv.peak_used_bytes - nv.baseline_used_bytes, "NVML device used"
    t = res.torch
    if t is None:
        return None
    if t.reserved_peak_bytes is not None:
        return t.reserved_peak_bytes, "PyTorch reserved"
    return t.allocated_peak_bytes, "PyTorch allocated"


def same_workload(a: ProbeRequest, b: ProbeRequest) -> bool:
    """Whether two probes ran the same thing the same way (what the peak depends on)."""
    return (
        a.workload == b.workload
        and a.code == b.code
        and a.weights == b.weights
        and a.concurrency == b.concurrency
        and a.engine == b.engine
        and a.overlap == b.overlap
        and a.memory_limit_bytes == b.memory_limit_bytes
    )


def observed_headroom(res: ProbeResult, earlier: list[ProbeResult]) -> ObservedHeadroom | None:
    """``advised = largest spread observed + HEADROOM_FLOOR_FRACTION x peak``, where the
    spreads are (largest - smallest) of this probe's per-iteration allocated peaks and of the
    peaks of ``earlier`` probes of the same workload on this device together with this one
    (same view only). The floor stands for the variation a handful of runs does not show
    (driver and library versions, kernel choices, load). None when the result has no peak."""
    mine = peak_of(res)
    if mine is None:
        return None
    peak, view = mine
    iterations = res.torch.iteration_peak_bytes if res.torch is not None else ()
    iteration_spread = max(iterations) - min(iterations) if len(iterations) >= 2 else None
    peers = [p for p in (peak_of(r) for r in earlier) if p is not None and p[1] == view]
    peaks = [peak] + [p for p, _ in peers]
    probe_spread = max(peaks) - min(peaks) if len(peaks) >= 2 else None
    spread = max(iteration_spread or 0, probe_spread or 0)
    top = max(peaks)
    floor = math.ceil(HEADROOM_FLOOR_FRACTION * top)
    advised = spread + floor
    words = [f"{view} peak {top} B"]
    if iteration_spread is not None:
        words.append(f"{len(iterations)} measured iterations varied by {iteration_spread} B")
    if probe_spread is not None:
        words.append(f"{len(peaks)} probes of this workload varied by {probe_spread} B")
    if iteration_spread is None and probe_spread is None:
        words.append("one observation: no spread is measurable yet")
    words.append(
        f"+ a {HEADROOM_FLOOR_FRACTION:.0%} floor ({floor} B) for what so few runs cannot show"
    )
    return ObservedHeadroom(
        advised_bytes=advised,
        advised_fraction=round(advised / top, 6) if top else 0.0,
        peak_bytes=top,
        basis="; ".join(words),
        iterations=len(iterations),
        iteration_spread_bytes=iteration_spread,
        probes=len(peaks),
        probe_spread_bytes=probe_spread,
    )
