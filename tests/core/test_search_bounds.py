"""The monotone-predicate bisections of vrambudget.core.search against a linear scan."""

from __future__ import annotations

import pytest

from vrambudget.core.search import largest_true, smallest_true


@pytest.mark.parametrize("threshold", range(0, 12))
def test_bisections_agree_with_a_scan(threshold: int) -> None:
    lo, hi = 0, 10
    calls: list[int] = []

    def at_least(x: int) -> bool:
        calls.append(x)
        return x >= threshold

    true_then_false = [x for x in range(lo, hi + 1) if x < threshold]
    assert largest_true(lo, hi, lambda x: x < threshold) == (
        max(true_then_false) if true_then_false else lo - 1
    )
    if threshold <= hi:  # smallest_true needs ok(hi)
        assert smallest_true(lo, hi, at_least) == max(threshold, lo)
        assert hi not in calls  # ok(hi) is given, not asked
