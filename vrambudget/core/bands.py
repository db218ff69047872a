"""Error bands: how far the real peak of a device may lie from the estimate, from the residuals
of published measurements (``research/data/corpus``) of the same workload class.

``data/error_bands.json`` is written by ``research/calibrate_bands.py`` from the corpus's
calibrate split only: per class, the split-conformal quantiles of ``log(measured /
predicted)`` at the band's coverage. A budget's band is ``[subtotal x exp(low), subtotal x
exp(high)]``; its default headroom is the band's high end (``exp(high) - 1`` of the subtotal).
A class without enough measurements, or a stack the corpus has no measurement of, takes the
pooled band of every class, widened by ``widen`` (and says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, lru_cache

import msgspec

from .data import data_file
from .result import ErrorBand
from .spec import (
    BitsAndBytes4bit,
    FullFineTune,
    Headroom,
    InferenceWorkload,
    QLoRA,
    TrainingWorkload,
    Workload,
)
from .stack import Stack, resolve_stack

__all__ = [
    "BandFit",
    "BandRule",
    "band_of",
    "band_rule",
    "class_label",
    "family_of",
    "resolve_headroom",
    "rule_from",
    "workload_class",
]


class _Class(msgspec.Struct, frozen=True):
    """One class's (or ``class|framework`` cell's) calibration."""

    measurements: int
    sources: int
    """Distinct published sources (one table, one thread) among them."""
    log_low: float
    log_high: float
    frameworks: tuple[str, ...]
    source_coverage: float | None = None
    """Leave-one-source-out coverage of the class (``research/band_loso.py``): the share of a
    left-out source's measurements within the reach of the band the default stack gets
    (``source_reach`` applied), each source weighted once, at most k / (k + 1) for k sources
    (what k sources can show of a new one); None for the ``class|framework`` cells, the
    families and the pool."""
    source_reach: float = 0.0
    """How far (log space) from the middle of the bands fitted without each calibrate source
    ``coverage`` of the sources' measurements lie (``research/band_loso.py``
    ``source_reach``): every band of the class reaches at least that far from its middle. A
    new source's bias, measured; 0 for a class without its own band."""


class BandFit(msgspec.Struct, frozen=True):
    schema: str
    coverage: float
    min_measurements: int
    min_sources: int
    widen: float
    source: str
    pooled: _Class
    classes: dict[str, _Class]


@cache
def _bands() -> BandFit:
    """The committed fit, as ``research/calibrate_bands.py`` writes it."""
    return data_file("error_bands.json", BandFit)


MAX_DEFAULT_HEADROOM = 0.9
"""The largest ``headroom.fraction`` a request may set (spec ``Fraction``)."""


@dataclass(frozen=True, slots=True)
class BandRule:
    """The band of one workload class as ratios of the estimate."""

    workload_class: str
    low: float
    """measured / predicted at the band's low end."""
    high: float
    coverage: float
    measurements: int
    basis: str
    source_coverage: float | None = None
    """The class's measured coverage of a source the fit did not see (:class:`ErrorBand`)."""

    @property
    def headroom_fraction(self) -> float:
        """The headroom that reaches the band's high end (0 when the band lies below the
        estimate), at most the 0.9 a request may ask (the band itself keeps its high end, so
        the verdict says where a wider band leaves a run)."""
        return min(MAX_DEFAULT_HEADROOM, max(0.0, self.high - 1.0))


def workload_class(w: Workload) -> str:
    """``training_full``, ``fine_tuning_lora``, ``fine_tuning_qlora``,
    ``fine_tuning_lora_quantized_base``, ``inference``, ``inference_quantized`` or ``other``
    (encoders, generic, image generation); ``_multi_gpu`` appended when one instance spans
    several devices (sharding, gathers and per-rank loading err differently)."""
    if isinstance(w, TrainingWorkload):
        if isinstance(w.method, FullFineTune):
            cls = "training_full"
        elif isinstance(w.method, QLoRA) or isinstance(w.precision.quantization, BitsAndBytes4bit):
            cls = "fine_tuning_qlora"  # LoRA over bitsandbytes' 4-bit base is QLoRA
        elif w.precision.quantization:
            # LoRA over a base quantized otherwise (LLM.int8, GPTQ, AWQ, fp8): another
            # library's kernels and saved tensors in every layer, not plain LoRA's error
            cls = "fine_tuning_lora_quantized_base"
        else:
            cls = "fine_tuning_lora"
    elif isinstance(w, InferenceWorkload):
        # A scheme object, or None / UNSET (a request's own workload, not deployed yet).
        cls = "inference_quantized" if w.precision.quantization else "inference"
    else:
        return "other"
    par = w.parallelism
    return cls + ("_multi_gpu" if par.tensor * par.pipeline * par.data > 1 else "")


_CLASS_WORDS = {
    "training_full": "full training",
    "fine_tuning_lora": "LoRA fine-tuning",
    "fine_tuning_qlora": "QLoRA fine-tuning",
    "fine_tuning_lora_quantized_base": "LoRA fine-tuning on a base quantized other than 4-bit NF4",
    "inference": "inference",
    "inference_quantized": "quantized inference",
    "other": "other workloads",
}


def class_label(cls: str) -> str:
    """A workload class in words for a reader: ``LoRA fine-tuning on several GPUs`` for
    ``fine_tuning_lora_multi_gpu``."""
    base = cls.removesuffix("_multi_gpu")
    words = _CLASS_WORDS.get(base, base.replace("_", " "))
    return words + (" on several GPUs" if base != cls else "")


def family_of(cls: str) -> str:
    """The classes pooled when one has too few measurements: training (full, LoRA, QLoRA) or
    inference, on one device or several."""
    kind = (
        "training"
        if cls.startswith(("training", "fine_tuning"))
        else "inference"
        if cls.startswith("inference")
        else cls.split("_multi")[0]
    )
    return kind + ("_multi_gpu" if cls.endswith("_multi_gpu") else "")


@lru_cache(maxsize=4096)
def band_rule(classes: tuple[str, ...], stack: Stack) -> BandRule:
    """The widest band over the workload classes on a device, for ``stack``."""
    key = (stack.framework, stack.named)
    rules = [_rule(c, *key) for c in classes] or [_rule("other", *key)]
    return max(rules, key=lambda r: (r.high - r.low, r.high))


@cache
def _default_framework() -> str:
    """The framework of a request that names none (the current default stack's)."""
    return resolve_stack(None).framework


@lru_cache(maxsize=1024)
def _rule(cls: str, framework: str, named: bool) -> BandRule:
    """The class's band from the committed fit (:func:`rule_from`)."""
    return rule_from(_bands(), cls, framework, named)


def rule_from(
    b: BandFit, cls: str, framework: str, named: bool, source_reach: bool = True
) -> BandRule:
    """The class's band in the fit ``b``: its own (or its framework's, where that cell has enough
    measurements, and enough sources unless the class lacks them too: a class band from
    enough sources holds for a new source of any of its frameworks, a cell from too few
    would be widened past it), widened where the measurements come from fewer sources than a
    new source's bias can be bounded with, or the stack's framework was never measured in the
    class; a class with too few measurements takes its family's band, widened. Last, the
    class's ``source_reach``: widened about its middle until it reaches that far
    (``source_reach`` false: not applied, as the fit measures the band it widens). (Any fit:
    ``research/band_loso.py`` refits without one source at a time.)"""
    pct = f"{100 * b.coverage:.0f}%"
    cell = b.classes.get(f"{cls}|{framework}")
    c = b.classes.get(cls)
    if (
        cell is not None
        and cell.measurements >= b.min_measurements
        # the framework's own cell, unless it rests on too few sources where the class does not
        and (cell.sources >= b.min_sources or c is None or c.sources < b.min_sources)
    ):
        base, words = cell, f"{cls} on {framework}"
    elif c is not None and c.measurements >= b.min_measurements:
        base, words = c, cls
    else:
        fam = family_of(cls)
        f = b.classes.get(f"family:{fam}")
        base, words = (
            (f, f"{fam} workloads")
            if f is not None and f.measurements >= b.min_measurements
            else (b.pooled, "every one-device class")
        )
    reasons = []
    if base is not cell and base is not c:
        own = 0 if c is None else c.measurements
        reasons.append(f"{own} of {cls}, fewer than {b.min_measurements}")
    if base.sources < b.min_sources:
        reasons.append(
            f"{base.sources} sources, fewer than {b.min_sources}: reaching both sides of the "
            "estimate"
        )
    if named and framework not in base.frameworks:
        reasons.append(f"none on {framework}")
    widen = b.widen ** len(reasons)  # each missing kind of evidence widens it again
    # Widened about its middle, so the band only grows (from enough sources both ends can lie
    # on one side of 0).
    mid = (base.log_low + base.log_high) / 2
    half = (base.log_high - base.log_low) / 2 * widen
    low, high = mid - half, mid + half
    if base.sources < b.min_sources:
        # Too few sources to know the sign of a new source's bias: the band also reaches the
        # (widened) half-width on both sides of the estimate itself.
        low, high = min(low, -half), max(high, half)
    if named and framework not in base.frameworks:
        # A framework the class never saw: at least the band of the stack a request that
        # names none gets (which may rest on another cell of the class), its reach included.
        default = rule_from(b, cls, _default_framework(), False, source_reach=source_reach)
        low, high = min(low, math.log(default.low)), max(high, math.log(default.high))
    reach = c.source_reach if source_reach and c is not None else 0.0
    reached = reach > (high - low) / 2
    if reached:
        # Widened about its middle until it reaches as far as the calibrate sources lie from
        # the middle of the bands fitted without each of them, as often as the coverage says.
        mid = (low + high) / 2
        low, high = mid - reach, mid + reach
    basis = (
        f"split conformal, {pct}, over {base.measurements} published measurements of {words}"
        + (f", widened x{widen:g} ({'; '.join(reasons)})" if reasons else "")
        + (
            f", widened to x{math.exp(reach):.3g} either side of its middle, as far as {pct} "
            "of the sources left out of the fit in turn lie"
            if reached
            else ""
        )
        + f" ({b.source})"
    )
    return BandRule(
        cls,
        math.exp(low),
        math.exp(high),
        b.coverage,
        base.measurements,
        basis,
        None if c is None else c.source_coverage,
    )


def band_of(rule: BandRule, subtotal: int, counted: int = 0) -> ErrorBand:
    """The band of a device's subtotal (headroom excluded). ``counted``: the bytes the device
    holds of the components counted from the model's tensors as the modelled stack lays them
    out (weights, quantization metadata, adapters; at most ``subtotal``), under which the low
    end never falls: a wide band fitted on other runs' residuals, a ratio of the whole
    subtotal, must not reach below them (nor the high end below the low).

    >>> rule = BandRule("c", 0.5, 1.2, 0.9, 9, "b")
    >>> b = band_of(rule, 100, 70)
    >>> b.low_bytes, b.high_bytes, band_of(rule, 100, 20).low_bytes
    (70, 120, 50)
    >>> below = BandRule("c", 0.7, 0.95, 0.9, 9, "b")
    >>> band_of(below, 100, 97).low_bytes, band_of(below, 100, 97).high_bytes
    (97, 97)
    """
    low = max(math.floor(subtotal * rule.low), min(counted, subtotal))
    return ErrorBand(
        low_bytes=low,
        high_bytes=max(math.ceil(subtotal * rule.high), low),  # a band below the estimate
        coverage=rule.coverage,
        workload_class=rule.workload_class,
        measurements=rule.measurements,
        basis=rule.basis,
        source_coverage=rule.source_coverage,
        counted_bytes=counted,
    )


@lru_cache(maxsize=4096)
def resolve_headroom(h: Headroom, rule: BandRule) -> Headroom:
    """The caller's headroom, or (``fraction`` null, the default) the band's high end."""
    if h.fraction is not None:
        return h
    return Headroom(fraction=round(rule.headroom_fraction, 6), min_bytes=h.min_bytes)
