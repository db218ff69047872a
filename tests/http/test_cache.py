"""The answer cache both apps share: bounded, least recently used first, per endpoint."""

from __future__ import annotations


def test_answer_cache_is_bounded_and_exact():
    from vrambudget.service.app import AnswerCache

    cache = AnswerCache(2)
    cache.put(("budgets", b"a"), b"1")
    cache.put(("budgets", b"b"), b"2")
    assert cache.get(("budgets", b"a")) == b"1"  # refreshes a
    cache.put(("budgets", b"c"), b"3")
    assert cache.get(("budgets", b"b")) is None  # least recently used went
    assert cache.get(("fits", b"a")) is None  # endpoints never share answers


def test_answer_cache_is_bounded_by_bytes():
    from vrambudget.http.cache import KEY_OVERHEAD_BYTES, AnswerCache

    per = 1000 + 32 + len("budgets") + KEY_OVERHEAD_BYTES
    cache = AnswerCache(4096, 3 * per)
    for i in range(10):
        cache.put(("budgets", bytes([i]) * 32), b"x" * 1000)
        assert cache.nbytes <= 3 * per
    assert len(cache) == 3
    assert cache.get(("budgets", bytes([9]) * 32)) is not None  # the newest stay
    assert cache.get(("budgets", bytes([0]) * 32)) is None
    # an answer larger than the whole bound is answered but never kept
    assert cache.put(("budgets", b"big" * 11), b"y" * (4 * per)) == b"y" * (4 * per)
    assert cache.get(("budgets", b"big" * 11)) is None and cache.nbytes <= 3 * per
    # replacing an entry does not count it twice
    before = cache.nbytes
    cache.put(("budgets", bytes([9]) * 32), b"x" * 1000)
    assert cache.nbytes == before and len(cache) == 3
