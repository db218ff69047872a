"""The one search of the core: the largest x that still fits a monotone objective.

Every solved maximum is tight by construction: the search keeps a bracket ``f(lo) <= capacity <
f(hi)`` and stops when ``hi == lo + 1``. For byte objectives (``max_fitting``) steps interpolate
inside the bracket (budgets are nearly linear in batch and concurrency, quadratic at worst in
context) and fall back to bisection when interpolation stalls, so a search costs a handful of
evaluations; evaluations can be shared between searches (``Memo``). A yes/no predicate
(``largest_true``: does the engine start?) has nothing to interpolate and is bisected.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

__all__ = ["Memo", "largest_true", "max_fitting"]


class Memo:
    """Evaluations of one monotone objective, kept sorted so a new search starts from the
    tightest bracket that earlier searches (other GPUs' capacities) already established."""

    __slots__ = ("values", "xs")

    def __init__(self) -> None:
        self.xs: list[int] = []
        self.values: dict[int, int] = {}

    def get(self, x: int, f: Callable[[int], int]) -> int:
        v = self.values.get(x)
        if v is None:
            v = self.values[x] = f(x)
            bisect.insort(self.xs, x)
        return v

    def bracket(self, capacity: int) -> tuple[int, int]:
        """(largest known x that fits, smallest known x that does not; 0 if none)."""
        xs, values = self.xs, self.values
        lo_i, hi_i = 0, len(xs)
        while lo_i < hi_i:  # first index whose value exceeds capacity (values rise with x)
            mid = (lo_i + hi_i) // 2
            if values[xs[mid]] <= capacity:
                lo_i = mid + 1
            else:
                hi_i = mid
        lo = xs[lo_i - 1] if lo_i > 0 else 0
        hi = xs[lo_i] if lo_i < len(xs) else 0
        return lo, hi


def max_fitting(
    f: Callable[[int], int], capacity: int, limit: int, known: Memo | None = None
) -> int:
    """Largest x in [1, limit] with f(x) <= capacity for a non-decreasing f; 0 if f(1) does not
    fit. ``known`` memoizes f between searches of the same objective. Steps interpolate inside
    the bracket and fall back to bisection when interpolation stalls."""
    memo = known if known is not None else Memo()
    values = memo.values

    def at(x: int) -> int:
        v = values.get(x)  # a known value without a second call
        return v if v is not None else memo.get(x, f)

    if at(1) > capacity:
        return 0
    lo, hi = memo.bracket(capacity)
    flo = at(lo)
    fhi = at(hi) if hi else 0
    prev_x, prev_f = lo, flo
    while hi == 0:  # extrapolate until the bracket closes
        if lo >= limit:
            return limit
        if prev_x != lo and flo > prev_f:
            slope = (flo - prev_f) / (lo - prev_x)
        else:
            nxt = min(lo + 1, limit)
            slope = max(at(nxt) - flo, 1) if nxt > lo else 1
        guess = lo + int((capacity - flo) / slope) + 1
        guess = min(max(guess, lo + 1), limit)
        v = at(guess)
        prev_x, prev_f = lo, flo
        if v <= capacity:
            lo, flo = guess, v
        else:
            hi, fhi = guess, v
    bisect_next = False
    while hi - lo > 1:
        if bisect_next or fhi == flo:
            g = (lo + hi) // 2
        else:
            g = lo + int((capacity - flo) * (hi - lo) / (fhi - flo))
            g = min(max(g, lo + 1), hi - 1)
        width = hi - lo
        v = at(g)
        if v <= capacity:
            lo, flo = g, v
        else:
            hi, fhi = g, v
        bisect_next = (hi - lo) * 2 > width  # interpolation did not halve the bracket
    return lo


def largest_true(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """Largest x in [lo, hi] with ok(x) for a monotone (true then false) predicate; lo - 1 if
    none. The same bracket as ``max_fitting``, bisected."""
    if hi < lo or not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def smallest_true(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """Smallest x in [lo, hi] with ok(x) for a monotone (false then true) predicate, ok(hi)
    known true: the bracket of ``largest_true`` for the negated predicate."""
    return 1 + largest_true(lo, hi - 1, lambda x: not ok(x))
