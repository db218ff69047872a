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
