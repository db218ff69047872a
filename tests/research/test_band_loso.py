"""The leave-one-source-out widening (research/band_loso.py ``source_widen``) on folds made by
hand: the least factor, about each band's middle in log space, at which the sources left out
are covered as often as the coverage says, each source counted once."""

from __future__ import annotations

import math

from research.band_loso import Fold, _needed, source_widen


def test_needed_is_the_distance_from_the_middle_over_the_half_width() -> None:
    # band x0.9 .. x1.1 in log space: middle ~0.0050, half-width ~0.1003
    low, high = 0.9, 1.1
    mid, half = (math.log(low) + math.log(high)) / 2, (math.log(high) - math.log(low)) / 2
    assert _needed(low, high, 1.0) == 1.0  # inside: no widening
    assert math.isclose(_needed(low, high, 1.25), (math.log(1.25) - mid) / half)
    assert math.isclose(_needed(low, high, 0.8), (mid - math.log(0.8)) / half)


def _fold(source: str, needed: tuple[float, ...]) -> Fold:
    return Fold("fine_tuning_lora", source, False, needed)


def test_the_least_factor_that_covers_the_coverage_of_sources() -> None:
    # ten sources: eight inside, one needs x1.3, one (two rows) needs x1.2 and x2.0
    fs = [_fold(f"s{i}", (1.0,)) for i in range(8)]
    fs += [_fold("s8", (1.3,)), _fold("s9", (1.2, 2.0))]
    # at x1.0: 8/10 sources; x1.2: 8.5/10; x1.3: 9.5/10 >= 0.9
    factor, covered = source_widen(fs, 0.9)
    assert factor == 1.3 and math.isclose(covered, 0.95)
    # a coverage already met needs no widening
    assert source_widen(fs[:8], 0.9) == (1.0, 1.0)


def test_the_factor_is_rounded_up_to_a_hundredth() -> None:
    fs = [_fold(f"s{i}", (1.0,)) for i in range(9)] + [_fold("s9", (1.234,))]
    # 9/10 inside already: 0.9 holds at x1.0
    assert source_widen(fs, 0.9)[0] == 1.0
    factor, covered = source_widen(fs, 0.95)
    assert factor == 1.24 and covered == 1.0
