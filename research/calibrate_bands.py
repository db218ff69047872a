"""Fit the error bands (``vrambudget/core/data/error_bands.json``) from the corpus's calibrate
split: per workload class, the split-conformal quantiles of ``log(measured / predicted)`` of
each device peak, at 90% coverage.

Split conformal (Vovk et al. 2005; Lei et al. 2018): with n calibration scores sorted
ascending, the two-sided interval at coverage 1 - a takes the floor((n + 1) a / 2)-th and the
ceil((n + 1)(1 - a / 2))-th; a new measurement exchangeable with them falls inside with
probability >= 1 - a. Where n is too small for those ranks, the extreme score is taken and the
band is marked as such. The held-out split never enters (``research/corpus.py`` fixes it by
the source's name).

Run from the repository root:
    python -m research.calibrate_bands          # write the file
    python -m research.calibrate_bands --check  # fail if the file differs from a fresh fit
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction
from functools import cache
from pathlib import Path
from statistics import mean

import msgspec

from research.corpus import Prediction, load, predict, request_of
from vrambudget.core.bands import family_of, workload_class

OUT = Path(__file__).parents[1] / "vrambudget" / "core" / "data" / "error_bands.json"
COVERAGE = 0.9
MIN_MEASUREMENTS = 8
MIN_SOURCES = 9
"""A new source's bias lies beyond the largest of k calibration sources' with probability about
1 / (k + 1) on each side (sources exchangeable): below 9 sources that exceeds 10% a side, and the
band is widened. Two-sided, a band at the extremes of 9 sources holds a new one only 80% of the
time in the worst case (each source's rows all alike); measured, refitting without each
calibrate source in turn, the bands from fewer than 9 sources, widened x1.5, cover 92.0% of the
sources left out (research/band_loso.py, docs/ACCURACY.md)."""
WIDEN = 1.5
SOURCE = "research/data/corpus, calibrate split; research/calibrate_bands.py"


_HEADER = {
    "schema": "vrambudget.error_bands/1",
    "coverage": COVERAGE,
    "min_measurements": MIN_MEASUREMENTS,
    "min_sources": MIN_SOURCES,
    "widen": WIDEN,
    "source": SOURCE,
}


def conformal(scores: list[float], coverage: float = COVERAGE) -> tuple[float, float]:
    """(low, high) split-conformal quantiles of ``scores`` at ``coverage``."""
    s = sorted(scores)
    n = len(s)
    a = Fraction(1) - Fraction(str(coverage))  # exact: 1 - 0.9 is not 0.1 in binary
    lo = max(math.floor((n + 1) * a / 2), 1)
    hi = min(math.ceil((n + 1) * (1 - a / 2)), n)
    return s[lo - 1], s[hi - 1]


_CLASSES: dict[str, tuple[str, str]] = {}


def _class_and_framework(p: Prediction) -> tuple[str, str]:
    """(workload class, the stack's framework) of a record's request, once per record id (a
    leave-one-source-out pass refits the bands once per source)."""
    out = _CLASSES.get(p.record.id)
    if out is None:
        req = request_of(p.record)
        sw = req.software
        framework = sw.framework if sw is not None and sw.framework is not None else None
        out = workload_class(req.workloads[0]), framework or p.record.framework
        _CLASSES[p.record.id] = out
    return out


def class_of(p: Prediction) -> str:
    return _class_and_framework(p)[0]


OWN_CAMPAIGNS = "gpu-campaign-"
"""Group prefix of this project's own GPU campaigns (``research/gpu_campaign.py``). They do not
calibrate the bands: each is one small model on one GPU, two dozen near-exact records from one
source, which would narrow every class's quantiles (the pooled band's high end fell from x1.45
to x1.29 with the first one) while saying nothing about the spread between sources that a band
must cover. They check the components instead (docs/ACCURACY.md, "First CUDA measurements")."""


def peak_predictions(split: str | None = "calibrate") -> tuple[Prediction, ...]:
    """Predictions of every compared device-peak record of the published corpus (of ``split``;
    None: both); the project's own campaigns are left out (:data:`OWN_CAMPAIGNS`)."""
    return tuple(p for p in _peak_predictions() if split is None or p.split == split)


@cache
def _peak_predictions() -> tuple[Prediction, ...]:
    """Every split's, computed once per process (a minute: some records' models are built by
    the framework)."""
    out = []
    for r in load():
        if r.workload is None or r.excluded or r.quantity != "peak_device_bytes":
            continue
        if r.group.startswith(OWN_CAMPAIGNS):
            continue
        out.append(predict(r))
    return tuple(out)


def fit(predictions: Sequence[Prediction] | None = None) -> dict[str, object]:
    """The bands of ``predictions`` (default: the calibrate split's device peaks, with each
    class's leave-one-source-out coverage and widening: :func:`_source_widening`)."""
    by_class: dict[str, list[Prediction]] = defaultdict(list)
    for p in peak_predictions() if predictions is None else predictions:
        cls = class_of(p)
        by_class[cls].append(p)
        by_class[f"{cls}|{_stack_framework(p)}"].append(p)
        by_class[f"family:{family_of(cls)}"].append(p)
    classes: dict[str, dict[str, object]] = {}
    everything: list[float] = []
    pool_sources: set[str] = set()
    for cls, ps in sorted(by_class.items()):
        scores = [math.log(p.record.measured / p.predicted) for p in ps]
        if "|" not in cls and not cls.startswith("family:") and not cls.endswith("_multi_gpu"):
            everything += scores  # the pool of one-device classes
            pool_sources |= {p.record.group for p in ps}
        low, high = conformal(scores)
        classes[cls] = {
            "measurements": len(ps),
            "sources": len({p.record.group for p in ps}),
            "log_low": round(low, 6),
            "log_high": round(high, 6),
            "frameworks": sorted({_stack_framework(p) for p in ps}),
        }
    low, high = conformal(everything) if everything else (0.0, 0.0)
    out = {
        **_HEADER,
        "pooled": {
            "measurements": len(everything),
            "sources": len(pool_sources),
            "log_low": round(low, 6),
            "log_high": round(high, 6),
            "frameworks": sorted(
                {
                    f
                    for k, c in classes.items()
                    if "|" not in k and ":" not in k and not k.endswith("_multi_gpu")
                    for f in c["frameworks"]  # type: ignore[attr-defined]
                }
            ),
        },
        "classes": classes,
    }
    if predictions is None:  # the committed fit: each class's coverage of an unseen source
        _source_widening(out)
    return out


def _source_widening(out: dict[str, object]) -> None:
    """Each class's leave-one-source-out reach and coverage (``research/band_loso.py``): for a
    class with its own band, ``source_reach``, how far from the middle of the bands fitted
    without each calibrate source ``COVERAGE`` of the sources' measurements lie (every band of
    the class is widened to reach that far), and ``source_coverage``, the share within the
    reach of the default stack's band, each source once, at most k / (k + 1) for k sources. A
    reach, not a factor measured on the narrower bands fitted without a far-off source: that
    factor, applied to the band fitted with it, counted the source twice (one 3.4x source
    turned a band of x0.37 - x4.8 into x0.004 - x431)."""
    from research.band_loso import folds, source_reach
    from vrambudget.core.bands import BandFit, _default_framework, rule_from

    classes: dict[str, dict[str, object]] = out["classes"]  # type: ignore[assignment]
    fitted = msgspec.convert(out, BandFit)
    by_class: dict[str, list] = defaultdict(list)
    for f in folds(peak_predictions()):
        by_class[f.workload_class].append(f)
    for cls, fs in by_class.items():
        if cls not in classes:
            continue
        # A class short of measurements answers with its family's band, widened already: its
        # coverage is recorded as measured, unwidened.
        if classes[cls]["measurements"] < MIN_MEASUREMENTS:  # type: ignore[operator]
            classes[cls]["source_coverage"] = round(mean(f.inside_at(1.0) for f in fs), 4)
            continue
        reach, _ = source_reach(fs, COVERAGE)
        classes[cls]["source_reach"] = reach
        rule = rule_from(fitted, cls, _default_framework(), False, source_reach=False)
        half = max((math.log(rule.high) - math.log(rule.low)) / 2, reach)
        covered = min(mean(f.inside_within(half) for f in fs), len(fs) / (len(fs) + 1))
        classes[cls]["source_coverage"] = round(covered, 4)


def _stack_framework(p: Prediction) -> str:
    return _class_and_framework(p)[1]


def main(argv: list[str]) -> int:
    if not OUT.exists():  # a first fit: the estimates do not read the band's numbers
        OUT.write_text(json.dumps(_neutral(), indent=1) + "\n")
    data = fit()
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT} differs from a fresh fit: run python -m research.calibrate_bands")
            return 1
        return 0
    OUT.write_text(text)
    for cls, c in data["classes"].items():  # type: ignore[attr-defined]
        print(
            f"{cls}: n={c['measurements']} sources={c['sources']} "
            f"band x{math.exp(c['log_low']):.3f} .. x{math.exp(c['log_high']):.3f}"
        )
    msgspec.json.decode(OUT.read_bytes())
    return 0


def _neutral() -> dict[str, object]:
    zero = {"measurements": 0, "sources": 0, "log_low": 0.0, "log_high": 0.0, "frameworks": []}
    return {
        **_HEADER,
        "pooled": zero,
        "classes": {},
    }


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
