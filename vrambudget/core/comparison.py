"""Estimate vs measured: the comparison's wire types (the logic is in ``compare.py``).

A measurement does not see components one by one: PyTorch's counters and NVML see a few
*quantities* (what was allocated after the model was built, the allocated peak, reserved minus
allocated, the device's used memory). Each quantity is a fixed, documented sum of components;
a component is compared on its own only where a quantity measures exactly it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .components import Component

__all__ = [
    "QUANTITY_LABELS",
    "Comparison",
    "ComponentComparison",
    "HeadroomAdvice",
    "QuantityComparison",
    "TierComparison",
    "Verdict",
    "quantity_label",
]

Verdict = Literal["within", "over", "under", "grouped", "not_measured", "not_applicable"]
"""``within``: the estimate is within the tolerance of the measurement. ``over``: the estimate
is larger (conservative). ``under``: the estimate is smaller (it would under-provision).
``grouped``: the component is measured only inside a quantity (see ``quantity``).
``not_measured``: the report has no view that measures it. ``not_applicable``: the quantity does
not exist on the report's device (e.g. a CUDA context on the CPU path)."""


QUANTITY_LABELS = {
    "resident_after_load": "Resident after load",
    "kv_cache": "KV cache",
    "runtime_workspace": "Runtime workspace",
    "working_set_peak": "Working set peak",
    "allocated_peak": "Allocated peak",
    "allocator_overhead": "Allocator overhead",
    "cuda_context": "CUDA context",
    "communication_buffers": "Communication buffers",
    "device_used_peak": "Device used peak",
    "unexplained": "Unexplained",
}
"""Each measured quantity (``QuantityComparison.name``, docs/COMPARISON.md) in words for a
reader."""


def quantity_label(name: str) -> str:
    """A quantity's words (``KV cache``); an unknown name as words too."""
    if name in QUANTITY_LABELS:
        return QUANTITY_LABELS[name]
    words = name.replace("_", " ")
    return words[:1].upper() + words[1:]


# msgspec passes frozen=True on to subclasses, type checkers do not: each subclass repeats it.
class _Out(msgspec.Struct, frozen=True, kw_only=True):
    pass


class QuantityComparison(_Out, frozen=True, kw_only=True):
    """One measured quantity against the sum of the estimate's components it covers."""

    name: str
    components: tuple[Component, ...]
    """The estimate's components this quantity is the sum of (empty for ``unexplained``)."""
    estimate_bytes: int | None
    measured_bytes: int | None
    difference_bytes: int | None
    """estimate - measured."""
    difference_percent: float | None
    """(estimate - measured) / measured x 100, two decimals (null when measured is 0)."""
    verdict: Verdict
    measured_by: str
    """Which counter, and the arithmetic applied to it."""
    note: str | None = None


class ComponentComparison(_Out, frozen=True, kw_only=True):
    """One budget component: its estimate, and its measurement where one quantity is exactly
    this component; otherwise the quantity that contains it."""

    component: Component
    estimate_bytes: int
    measured_bytes: int | None
    difference_bytes: int | None
    difference_percent: float | None
    verdict: Verdict
    quantity: str | None
    """The measured quantity this component is part of (null: none measures it)."""


class TierComparison(_Out, frozen=True, kw_only=True):
    method: Literal["analytic", "trace"]
    estimate_subtotal_bytes: int
    """The estimate's device total without headroom (headroom is not a measurement)."""
    quantities: tuple[QuantityComparison, ...]
    components: tuple[ComponentComparison, ...]
    """Every component, in vocabulary order."""


class HeadroomAdvice(_Out, frozen=True, kw_only=True):
    """The headroom this workload needs on this device, from what was observed."""

    fraction: float
    """Of the analytic estimate's comparable subtotal (CUDA: the device subtotal; CPU: the
    allocated peak it predicts), rounded up to a whole percent: the value to pass as
    ``headroom.fraction``."""
    bytes: int
    reasons: tuple[str, ...]
    """Each term of the advice, with its number."""


class Comparison(_Out, frozen=True, kw_only=True):
    probe_id: str
    model: str | None = None
    """The model the probe ran (the estimate's workload name), for titles."""
    status: str
    device: Literal["cuda", "cpu"]
    device_name: str
    gpu_id: str | None
    """The catalog GPU the report's device was matched to (null: CPU or no match)."""
    tolerance_percent: float
    tolerance_bytes: int
    views: tuple[str, ...]
    """The measurement views the report carries: ``torch`` (allocator counters), ``nvml``."""
    degraded: tuple[str, ...]
    """What the report could not measure, and why (empty: a full CUDA + NVML report)."""
    tiers: tuple[TierComparison, ...]
    headroom: HeadroomAdvice
    notes: tuple[str, ...] = ()
