"""Does a band cover a source it has never seen? Leave-one-source-out over the calibrate split.

A band is fitted on measurements from a handful of sources (one table, one thread each), and
measurements of one source share its bias: its stack, its memory view, how it counted. What a
user needs from the band is coverage of *their* run, a source the corpus has not seen. For each
calibrate source in turn this refits the bands without it (``research/calibrate_bands.fit``),
takes the band the product would answer with for each of its measurements (the same rule,
``vrambudget.core.bands.rule_from``: the class's or its framework cell's band, the family's
where the class is short, widened by ``widen`` per missing kind of evidence) and counts the
measurements inside. Each source counts once (the mean of its measurements' coverage), so a
40-row table does not outvote a one-row thread.

It also asks the widening's question: scaled by what factor would bands from fewer than
``min_sources`` sources reach 90% for the sources left out? (The committed fit uses ``widen``;
this shows what the calibrate split itself supports.) And how far from a band's middle a new
source may lie: the least distance (log space, from the middle of the band fitted without it)
within which the left-out sources' measurements fall as often as the coverage says
(:func:`source_reach`, a leave-one-source-out (jackknife) quantile of distances, each source
weighted once), which the committed bands are made to reach. The held-out split never enters.

Run from the repository root:
    python -m research.band_loso              # the table, per class and pooled
    python -m research.band_loso --widen 1.3  # the same with another widening
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean

import msgspec

from research.calibrate_bands import class_of, fit, peak_predictions
from research.corpus import Prediction, request_of
from vrambudget.core.bands import BandFit, rule_from
from vrambudget.core.stack import resolve_stack


@dataclass(frozen=True, slots=True)
class Fold:
    """One left-out source of one workload class."""

    workload_class: str
    source: str
    few_sources: bool
    """The band it got rested on fewer than ``min_sources`` sources (it was widened)."""
    needed: tuple[float, ...]
    """Per measurement, the least factor (about the band's middle, in log space) that puts it
    inside its band: 1 where it already is, infinite for a band of zero width."""
    distance: tuple[float, ...] = ()
    """Per measurement, its distance from the middle of its band (log space)."""

    @property
    def measurements(self) -> int:
        return len(self.needed)

    @property
    def inside(self) -> int:
        """Its measurements inside the band as fitted."""
        return sum(n <= 1.0 for n in self.needed)

    def inside_at(self, factor: float) -> float:
        """The fraction of its measurements inside the bands widened by ``factor``."""
        return sum(n <= factor for n in self.needed) / self.measurements

    def inside_within(self, reach: float) -> float:
        """The fraction of its measurements within ``reach`` (log space) of the middle of the
        bands fitted without the source (not the band's own half-width: the widening for few
        sources that a fold's band gets, the committed band may not)."""
        return sum(d <= reach for d in self.distance) / self.measurements

    @property
    def coverage(self) -> float:
        return self.inside / self.measurements


def folds(predictions: Sequence[Prediction], widen: float | None = None) -> list[Fold]:
    """Every (class, source) of ``predictions`` scored against the bands fitted without that
    source (``widen``: the widening to apply instead of the fit's)."""
    keys = {id(p): _key(p) for p in predictions}
    out = []
    for source in sorted({p.record.group for p in predictions}):
        rest = [p for p in predictions if p.record.group != source]
        bands = msgspec.convert(fit(rest), BandFit)
        if widen is not None:
            bands = msgspec.structs.replace(bands, widen=widen)
        needed: dict[str, list[tuple[float, float]]] = defaultdict(list)
        few: dict[str, bool] = {}
        for p in predictions:
            if p.record.group != source:
                continue
            cls, framework, named = keys[id(p)]
            rule = rule_from(bands, cls, framework, named)
            ratio = p.record.measured / p.predicted
            lo, hi = math.log(rule.low), math.log(rule.high)
            distance = abs(math.log(ratio) - (lo + hi) / 2)
            needed[cls].append((_needed(rule.low, rule.high, ratio), distance))
            few[cls] = "sources, fewer than" in rule.basis  # widened for too few sources
        for cls, rows in needed.items():
            factors, distances = zip(*rows, strict=True)
            out.append(Fold(cls, source, few[cls], factors, distances))
    return out


def _needed(low: float, high: float, ratio: float) -> float:
    """The least factor, about the band's middle in log space, that puts ``ratio`` inside."""
    lo, hi, r = math.log(low), math.log(high), math.log(ratio)
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    if abs(r - mid) <= half:
        return 1.0
    return abs(r - mid) / half if half > 0 else math.inf


def source_reach(fs: Sequence[Fold], coverage: float) -> tuple[float, float]:
    """(reach, coverage by source at it): the least distance from the middle (log space, of
    each band fitted without the source it is scored on) within which ``coverage`` of the
    sources' measurements lie (each source once: the mean of its measurements' coverage),
    rounded up to 1e-4. Unlike a factor on the bands' widths (the widening this replaced), it
    does not grow with the band it is applied to: a source far off the others, which the band
    fitted with it already reaches, is not counted twice."""
    candidates = sorted({0.0, *(d for f in fs for d in f.distance)})
    for reach in candidates:
        if mean(f.inside_within(reach) for f in fs) >= coverage - 1e-12:
            rounded = math.ceil(reach * 1e4 - 1e-9) / 1e4
            return rounded, mean(f.inside_within(rounded) for f in fs)
    raise AssertionError("the largest distance covers every measurement")  # pragma: no cover


def _key(p: Prediction) -> tuple[str, str, bool]:
    stack = resolve_stack(request_of(p.record).software)
    return class_of(p), stack.framework, stack.named


def summary(fs: Sequence[Fold]) -> dict[str, float | int]:
    """Sources, measurements, and coverage by source (each source once) and by measurement."""
    return {
        "sources": len(fs),
        "measurements": sum(f.measurements for f in fs),
        "source_coverage": mean(f.coverage for f in fs) if fs else math.nan,
        "measurement_coverage": (
            sum(f.inside for f in fs) / sum(f.measurements for f in fs) if fs else math.nan
        ),
    }


def table(fs: Sequence[Fold]) -> dict[str, dict[str, float | int]]:
    """:func:`summary` per workload class, of the folds whose band was widened for too few
    sources, and of every fold."""
    by_class: dict[str, list[Fold]] = defaultdict(list)
    for f in fs:
        by_class[f.workload_class].append(f)
    out = {cls: summary(v) for cls, v in sorted(by_class.items())}
    out["(bands from fewer than min_sources sources)"] = summary([f for f in fs if f.few_sources])
    out["(every class)"] = summary(fs)
    return out


def main(argv: list[str]) -> int:
    widen = float(argv[argv.index("--widen") + 1]) if "--widen" in argv else None
    rows = table(folds(peak_predictions(), widen))
    print("| class | sources | measurements | coverage by source | coverage by measurement |")
    print("|---|---:|---:|---:|---:|")
    for cls, s in rows.items():
        print(
            f"| {cls} | {s['sources']} | {s['measurements']} | "
            f"{100 * s['source_coverage']:.1f}% | {100 * s['measurement_coverage']:.1f}% |"
        )
    if "--json" in argv:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
