"""Compatibility verdicts: can this device run this workload with this software at all?

A verdict comes from rules over what the workloads need (dtypes, quantized kernels, attention
kernels, bitsandbytes, the engine, the CUDA/ROCm build and the driver: :mod:`.needs`) and what
the device offers (compute capability or gfx target, native dtypes), each rule with the public
source of its facts (:mod:`.facts`, :mod:`.rules`; docs/COMPATIBILITY.md lists them).
``supported`` / ``unsupported`` (why, and what to change) / ``unknown`` (a fact is missing).

The rules run once per (needs, device type): fits evaluate them before any search."""

from __future__ import annotations

from ..device import DeviceContext
from ..memo import BoundedCache
from ..result import Compatibility, CompatibilityVerdict, RuleOutcome
from ..spec import Software, Workload
from .build import parse_cuda, torch_cuda
from .needs import DeviceFacts, Needs, device_facts, needs_of
from .rules import RULES

__all__ = [
    "DeviceFacts",
    "Needs",
    "compatibility",
    "device_facts",
    "evaluate",
    "evaluate_on",
    "needs_of",
    "not_supported",
    "parse_cuda",
    "torch_cuda",
    "warnings_of",
]

_CACHE: BoundedCache[tuple[Needs, DeviceFacts], Compatibility] = BoundedCache(4096)


def evaluate(needs: Needs, device: DeviceFacts) -> Compatibility:
    """Every rule on one device type (memoized)."""
    return _CACHE.get_or((needs, device), lambda: _evaluate(needs, device))


def _evaluate(needs: Needs, device: DeviceFacts) -> Compatibility:
    checks = tuple(o for o in (rule(needs, device) for rule in RULES) if o is not None)
    verdict: CompatibilityVerdict = "supported"
    if any(c.verdict == "unsupported" for c in checks):
        verdict = "unsupported"
    elif any(c.verdict == "unknown" for c in checks):
        verdict = "unknown"
    return Compatibility(verdict=verdict, checks=checks)


def compatibility(
    workloads: tuple[Workload, ...], device: DeviceContext | None, software: Software | None
) -> Compatibility | None:
    """The verdict of deployed workloads on a device type (None without a device)."""
    if device is None:
        return None
    return evaluate_on(needs_of(workloads, software), device)


def evaluate_on(needs: Needs, device: DeviceContext) -> Compatibility:
    """:func:`evaluate` on a device context: the same needs (cached) on the same context
    (catalog GPUs' are cached) by identity, without hashing either dataclass; a whole-catalog
    fit asks it once per GPU."""
    key = (id(needs), id(device))
    hit = _BY_ID.get(key)
    if hit is not None and hit[0] is needs and hit[1] is device:
        return hit[2]
    verdict = evaluate(needs, device_facts(device))
    _BY_ID.put(key, (needs, device, verdict))  # holds both: their ids are not reused meanwhile
    return verdict


_BY_ID: BoundedCache[tuple[int, int], tuple[Needs, DeviceContext, Compatibility]] = BoundedCache(
    1024
)


def not_supported(c: Compatibility) -> Compatibility:
    """The same verdict with only the checks that are not ``supported`` (for fits)."""
    return Compatibility(
        verdict=c.verdict, checks=tuple(o for o in c.checks if o.verdict != "supported")
    )


def warnings_of(c: Compatibility | None) -> tuple[str, ...]:
    """One warning line per check that is not ``supported``, and the notes of the supported
    checks that change what runs (bf16 emulated; SDPA's math path)."""
    if c is None:
        return ()
    return tuple(_line(o) for o in c.checks if o.verdict != "supported" or o.rule in _NOTED)


_NOTED = ("dtype.bf16", "attention.sdpa_math")


def _line(o: RuleOutcome) -> str:
    if o.verdict == "supported":
        return o.reason
    tail = f"; {o.remedy}" if o.remedy else ""
    return f"{o.verdict} ({o.rule}): {o.reason}{tail}"
