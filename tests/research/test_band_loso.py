"""The leave-one-source-out reach (research/band_loso.py ``source_reach``) on folds made by
hand: the least distance from each band's middle (log space) within which the sources left out
lie as often as the coverage says, each source counted once."""

from __future__ import annotations

import math

from research.band_loso import Fold, _needed, source_reach


def test_needed_is_the_distance_from_the_middle_over_the_half_width() -> None:
    # band x0.9 .. x1.1 in log space: middle ~0.0050, half-width ~0.1003
    low, high = 0.9, 1.1
    mid, half = (math.log(low) + math.log(high)) / 2, (math.log(high) - math.log(low)) / 2
    assert _needed(low, high, 1.0) == 1.0  # inside: no widening
    assert math.isclose(_needed(low, high, 1.25), (math.log(1.25) - mid) / half)
    assert math.isclose(_needed(low, high, 0.8), (mid - math.log(0.8)) / half)


def _reach_fold(source: str, rows: tuple[tuple[float, float], ...]) -> Fold:
    """A fold from (distance from its band's middle, the band's half-width) per measurement."""
    needed = tuple(1.0 if d <= h else d / h for d, h in rows)
    return Fold("fine_tuning_qlora_multi_gpu", source, True, needed, tuple(d for d, _ in rows))


def test_the_reach_counts_a_far_source_once() -> None:
    """Five sources: four inside bands of half-width 0.6 fitted with the fifth, which lies
    1.23 from the middle of the narrow band (half-width 0.1) fitted without it. 90% by source
    needs the fifth: the reach is its distance, 1.23 -- a band of x0.29 .. x3.4 about its
    middle -- where a factor on the widths (12.3 = 1.23 / 0.1) applied to a band of half-width
    0.6 would reach 7.4 (x0.0006 .. x1,600)."""
    fs = [_reach_fold(f"s{i}", ((0.3, 0.6),)) for i in range(4)]
    fs.append(_reach_fold("far", ((1.23, 0.1),)))
    reach, covered = source_reach(fs, 0.9)
    assert reach == 1.23 and covered == 1.0


def test_the_reach_is_the_distance_that_covers_the_coverage() -> None:
    """Distances alone: a fold's band's own half-width (widened for the few sources it was
    fitted on, where the committed band may not be) is not counted."""
    fs = [_reach_fold(f"s{i}", ((0.05, 0.1), (0.2, 0.1))) for i in range(10)]
    # half of each source within 0.05, both within 0.2
    assert source_reach(fs, 0.5) == (0.05, 0.5)
    assert source_reach(fs, 0.9) == (0.2, 1.0)
    assert fs[0].inside_within(0.0) == 0.0 and fs[0].inside_within(0.15) == 0.5


def test_the_reach_is_rounded_up_to_a_ten_thousandth() -> None:
    fs = [_reach_fold(f"s{i}", ((0.123456, 0.01),)) for i in range(3)]
    reach, covered = source_reach(fs, 0.9)
    assert reach == 0.1235 and covered == 1.0
