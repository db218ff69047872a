"""Whether a budget fits its device: the capacity, the free (or missing) bytes and the verdict,
counted once for ``/v1/budgets`` (``Budget.fit``) and ``/v1/fits`` (each ``LayoutFit``).

The capacity is the device's total memory as the catalog (or the custom device) states it,
less what other processes already hold (``device.memory_in_use_bytes``):
``DeviceContext.capacity_bytes``. The fits compare every layout's total with it; a serving
engine sizes its own share (``gpu_memory_utilization``, ``mem_fraction_static``) from the total,
and sees the memory in use as its start-up does. What a device uses:

* an analytic (or trace) budget: its total, headroom included; it ``fits`` when that total is
  at most the capacity, and the verdict reads the error band (``fits`` when the band's high end
  fits too, ``fits_if_low`` when only its low end does, else ``does_not_fit``);
* a serving engine: the bytes it allocates (the budget's ``headroom`` line is the capacity the
  engine leaves unclaimed, so it is not counted); it ``fits`` when the engine starts, and as
  ``/v1/fits`` counts it: SGLang's pool holds one request of its context, llama.cpp / Ollama
  hold every layer on the GPUs (unless the request fixed ``n_gpu_layers``).
"""

from __future__ import annotations

import msgspec

from .components import Component
from .mig import Verdict
from .result import (
    Budget,
    BudgetFit,
    DeviceBudget,
    DeviceFit,
    DeviceSummary,
    GGUFDetails,
    KVTokensBand,
    ServingSummary,
)
from .spec import LLMServingWorkload, Workload

__all__ = ["free_percent", "in_use_spread", "memory_verdict", "with_fit"]

_RANK: dict[Verdict, int] = {"fits": 0, "fits_if_low": 1, "does_not_fit": 2}


def memory_verdict(
    total: int,
    capacity: int,
    band_low: int | None = None,
    band_high: int | None = None,
    in_use_spread: tuple[int, int] = (0, 0),
) -> Verdict:
    """``fits`` when the total with its headroom (and the band's high end) fit the capacity,
    ``fits_if_low`` when only the band's low end does, else ``does_not_fit``; without a band,
    ``fits`` or ``does_not_fit`` by the total alone. ``in_use_spread``: how far (below, above)
    the memory others hold may lie from the one the capacity assumes (a desktop's assumed
    hold): ``fits`` holds at the hold's high end, ``fits_if_low`` at its low end.

    >>> memory_verdict(70, 80, 50, 79), memory_verdict(70, 80, 50, 81), memory_verdict(90, 80)
    ('fits', 'fits_if_low', 'does_not_fit')
    >>> memory_verdict(70, 80, 50, 79, (0, 2)), memory_verdict(90, 80, 85, 95, (6, 2))
    ('fits_if_low', 'fits_if_low')
    """
    below, above = in_use_spread
    if band_low is None or band_high is None:
        band_low = band_high = total
    if total <= capacity and band_high <= capacity - above:
        return "fits"
    return "fits_if_low" if band_low <= capacity + below else "does_not_fit"


def in_use_spread(device: DeviceSummary) -> tuple[int, int]:
    """(below, above): how far the memory others hold may lie from the answer's
    ``memory_in_use_bytes`` (0, 0 where the request measured it)."""
    if device.memory_in_use_low_bytes is None or device.memory_in_use_high_bytes is None:
        return 0, 0
    held = device.memory_in_use_bytes
    return held - device.memory_in_use_low_bytes, device.memory_in_use_high_bytes - held


def free_percent(free: int, capacity: int) -> float:
    """``free`` as a percentage of ``capacity``, to 3 decimals (negative: missing).

    >>> free_percent(-1, 8)
    -12.5
    """
    return round(100.0 * free / capacity, 3)


def _used(d: DeviceBudget, serving: bool) -> int:
    if not serving:
        return d.total_bytes
    return d.total_bytes - sum(ln.bytes for ln in d.lines if ln.component is Component.HEADROOM)


def _serving_fits(sv: ServingSummary, w: Workload | None) -> tuple[bool, str | None]:
    """The engine's own verdict, as ``/v1/fits`` counts a layout of it."""
    if not sv.would_start:
        return False, sv.reason
    if sv.engine == "sglang" and sv.max_concurrency < 1.0:
        return False, (
            f"the token pool holds {sv.kv_cache_tokens:,} tokens: less than one request of "
            f"{sv.max_model_len:,} tokens"
        )
    d = sv.details
    fixed = (
        isinstance(w, LLMServingWorkload) and w.gguf is not None and w.gguf.n_gpu_layers is not None
    )
    if isinstance(d, GGUFDetails) and not fixed and d.n_gpu_layers < d.n_layer + 1:
        why = f" ({d.fitted})" if d.fitted else ""
        return False, f"only {d.n_gpu_layers} of {d.n_layer + 1} layers fit on the GPUs{why}"
    return True, None


def _short_at_high_hold(sv: ServingSummary) -> bool:
    """llama.cpp / Ollama would keep fewer layers on the GPUs, or fewer KV cells (``--fit``
    shrinks an unset context), beside the high end of an assumed hold of others."""
    d = sv.details
    if not isinstance(d, GGUFDetails) or d.n_gpu_layers_at_high_hold is None:
        return False
    return d.n_gpu_layers_at_high_hold < d.n_gpu_layers or (d.n_ctx_at_high_hold or 0) < d.n_ctx


def serving_verdict(starts: bool, band: KVTokensBand | None, target: float = 1.0) -> Verdict:
    """A serving engine's verdict: ``fits`` when it starts with ``target`` concurrency even at
    the low end of its KV-token band, ``fits_if_low`` when only the estimate does (it starts
    only if its other memory is near the estimate), else ``does_not_fit``."""
    if not starts:
        return "does_not_fit"
    if band is not None and band.max_concurrency_low < target:
        return "fits_if_low"
    return "fits"


def with_fit(budget: Budget, workloads: tuple[Workload, ...]) -> Budget:
    """The budget with its ``fit`` against its device (unchanged without a device)."""
    if budget.device is None or not budget.devices:
        return budget if budget.fit is None else msgspec.structs.replace(budget, fit=None)
    capacity = budget.device.capacity_bytes
    sv = budget.serving
    engine_ok, reason = (
        _serving_fits(sv, workloads[0] if workloads else None) if sv else (True, None)
    )
    rows = []
    for d in budget.devices:
        used = _used(d, sv is not None)
        if sv is not None:  # the engine's verdict holds for each of its GPUs
            ok = engine_ok
            verdict: Verdict = serving_verdict(ok, sv.kv_cache_tokens_band)
            if ok and _short_at_high_hold(sv):
                verdict = "fits_if_low"
        else:
            band = d.band
            verdict = memory_verdict(
                used,
                capacity,
                band.low_bytes if band else None,
                band.high_bytes if band else None,
                in_use_spread(budget.device),
            )
            ok = used <= capacity
        rows.append(
            DeviceFit(
                label=d.label, used_bytes=used, free_bytes=capacity - used, fits=ok, verdict=verdict
            )
        )
    tightest = min(rows, key=lambda r: r.free_bytes)
    fits = all(r.fits for r in rows)
    if reason is None and not fits:
        reason = (
            f"needs {tightest.used_bytes:,} bytes on {tightest.label}: "
            f"{-tightest.free_bytes:,} more than the device's {capacity:,}"
            + (
                f" (left beside the {budget.device.memory_in_use_bytes:,} other processes hold)"
                if budget.device.memory_in_use_bytes
                else ""
            )
        )
    return msgspec.structs.replace(
        budget,
        fit=BudgetFit(
            capacity_bytes=capacity,
            used_bytes=tightest.used_bytes,
            free_bytes=tightest.free_bytes,
            missing_bytes=max(0, -tightest.free_bytes),
            free_percent=free_percent(tightest.free_bytes, capacity),
            fits=fits,
            verdict=max((r.verdict for r in rows), key=_RANK.__getitem__),
            reason=reason,
            devices=tuple(rows),
        ),
    )
