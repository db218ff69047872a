"""``HubCache``: single flight, TTL for branches, commits kept, failures not kept, LRU bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from vrambudget.hub import HubCache, HubError, HubSettings, ResolvedCheckpoint

SHA = "0123456789abcdef0123456789abcdef01234567"
SETTINGS = HubSettings(endpoint="http://127.0.0.1:9")


def _resolved(repo_id: str, revision: str | None, n: int) -> ResolvedCheckpoint:
    return ResolvedCheckpoint(
        origin="hub",
        repo_id=repo_id,
        revision=revision,
        commit=SHA,
        config={"n": n},
        checkpoint=None,
        files=(),
    )


class Fetcher:
    """Counts calls; answers ``config={"n": call number}``; can block or fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()
        self.entered = threading.Event()
        self.release: threading.Event | None = None
        self.fail: Callable[[], BaseException] | None = None

    def __call__(
        self, repo_id: str, revision: str | None, *, settings: HubSettings
    ) -> ResolvedCheckpoint:
        assert settings is SETTINGS
        with self.lock:
            self.calls.append((repo_id, revision))
            n = len(self.calls)
        self.entered.set()
        if self.release is not None:
            assert self.release.wait(5)
        if self.fail is not None:
            raise self.fail()
        return _resolved(repo_id, revision, n)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cache(fetcher: Fetcher, clock: Clock | None = None, **kw: Any) -> HubCache:
    return HubCache(SETTINGS, fetcher=fetcher, clock=clock or Clock(), **kw)


def test_concurrent_gets_share_one_fetch() -> None:
    fetcher = Fetcher()
    fetcher.release = threading.Event()
    cache = _cache(fetcher)
    results: list[ResolvedCheckpoint] = []
    lock = threading.Lock()

    def get() -> None:
        got = cache.get("org/a", "main")
        with lock:
            results.append(got)

    threads = [threading.Thread(target=get) for _ in range(8)]
    for t in threads:
        t.start()
    assert fetcher.entered.wait(5)
    time.sleep(0.2)  # let the other seven reach the wait
    fetcher.release.set()
    for t in threads:
        t.join(5)
    assert fetcher.calls == [("org/a", "main")]
    assert len(results) == 8 and all(r is results[0] for r in results)


def test_concurrent_gets_share_one_failure_which_is_not_kept() -> None:
    fetcher = Fetcher()
    fetcher.release = threading.Event()
    fetcher.fail = lambda: HubError("unreachable", "id", "The Hub could not be reached.")
    cache = _cache(fetcher)
    errors: list[HubError] = []
    lock = threading.Lock()

    def get() -> None:
        try:
            cache.get("org/a", "main")
        except HubError as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=get) for _ in range(4)]
    for t in threads:
        t.start()
    assert fetcher.entered.wait(5)
    time.sleep(0.2)
    fetcher.release.set()
    for t in threads:
        t.join(5)
    assert len(fetcher.calls) == 1
    assert len(errors) == 4 and all(e.kind == "unreachable" for e in errors)
    fetcher.fail = None
    fetcher.release = None
    assert cache.get("org/a", "main").config == {"n": 2}
    assert len(cache) == 1


def test_a_failure_is_not_cached() -> None:
    fetcher = Fetcher()
    fetcher.fail = lambda: HubError("not_found", "id", "Repository 'org/a' was not found.")
    cache = _cache(fetcher)
    for _ in range(2):
        with pytest.raises(HubError):
            cache.get("org/a", None)
    assert len(fetcher.calls) == 2 and len(cache) == 0
    fetcher.fail = None
    assert cache.get("org/a", None).config == {"n": 3}
    assert cache.get("org/a", None).config == {"n": 3}


def test_a_branch_expires_after_the_ttl() -> None:
    fetcher, clock = Fetcher(), Clock()
    cache = _cache(fetcher, clock, ttl_s=300.0)
    assert cache.get("org/a", "main").config == {"n": 1}
    clock.now += 299.0
    assert cache.get("org/a", "main").config == {"n": 1}
    clock.now += 1.0
    assert cache.get("org/a", "main").config == {"n": 2}  # the branch may have moved
    clock.now += 100.0
    assert cache.get("org/a", None).config == {"n": 3}  # the default branch is a branch too
    clock.now += 300.0
    assert cache.get("org/a", None).config == {"n": 4}


def test_a_commit_never_expires() -> None:
    fetcher, clock = Fetcher(), Clock()
    cache = _cache(fetcher, clock, ttl_s=300.0)
    assert cache.get("org/a", SHA).config == {"n": 1}
    clock.now += 10**9
    assert cache.get("org/a", SHA).config == {"n": 1}
    assert len(fetcher.calls) == 1


def test_peek_answers_fresh_entries_only_and_never_fetches_or_waits() -> None:
    fetcher, clock = Fetcher(), Clock()
    cache = _cache(fetcher, clock, ttl_s=300.0, max_entries=2)
    assert cache.peek("org/a", "main") is None  # nothing cached: no fetch either
    assert fetcher.calls == []
    got = cache.get("org/a", "main")
    assert cache.peek("org/a", "main") is got
    assert cache.peek("org/a", "v1") is None and cache.peek("org/b", "main") is None
    clock.now += 299.0
    assert cache.peek("org/a", "main") is got
    clock.now += 1.0
    assert cache.peek("org/a", "main") is None  # past the TTL: get fetches again
    assert len(fetcher.calls) == 1
    assert cache.get("org/a", "main").config == {"n": 2}
    assert cache.peek("org/a", "main").config == {"n": 2}  # type: ignore[union-attr]
    # A commit stays fresh; a peek counts as a use for the LRU bound.
    commit = cache.get("org/a", SHA)
    clock.now += 10**9
    assert cache.peek("org/a", SHA) is commit
    cache.get("org/b", SHA)  # evicts the expired branch, the least recently used
    assert cache.peek("org/a", SHA) is commit
    cache.get("org/c", SHA)  # evicts org/b: org/a was peeked after it was fetched
    assert cache.peek("org/a", SHA) is commit and cache.peek("org/b", SHA) is None
    # A fetch in flight: a peek answers None at once instead of waiting for it.
    fetcher.release = threading.Event()
    fetcher.entered.clear()
    side = threading.Thread(target=cache.get, args=("org/d", SHA))
    side.start()
    assert fetcher.entered.wait(5)
    t = time.perf_counter()
    assert cache.peek("org/d", SHA) is None
    assert time.perf_counter() - t < 1.0
    fetcher.release.set()
    side.join(5)
    assert cache.peek("org/d", SHA) is not None


def test_short_or_uppercase_hex_is_a_name_not_a_commit() -> None:
    fetcher, clock = Fetcher(), Clock()
    cache = _cache(fetcher, clock, ttl_s=10.0)
    for revision in (SHA[:12], SHA.upper()):
        cache.get("org/a", revision)
        clock.now += 11.0
        cache.get("org/a", revision)
    assert len(fetcher.calls) == 4


def test_least_recently_used_is_evicted() -> None:
    fetcher = Fetcher()
    cache = _cache(fetcher, max_entries=2)
    cache.get("org/a", SHA)
    cache.get("org/b", SHA)
    cache.get("org/a", SHA)  # a is now the most recent
    cache.get("org/c", SHA)  # evicts b
    assert len(cache) == 2
    assert [c[0] for c in fetcher.calls] == ["org/a", "org/b", "org/c"]
    cache.get("org/a", SHA)
    cache.get("org/c", SHA)
    assert len(fetcher.calls) == 3
    cache.get("org/b", SHA)
    assert [c[0] for c in fetcher.calls] == ["org/a", "org/b", "org/c", "org/b"]


def test_keys_include_the_revision() -> None:
    fetcher = Fetcher()
    cache = _cache(fetcher)
    cache.get("org/a", "main")
    cache.get("org/a", "v1")
    cache.get("org/a", None)
    assert len(fetcher.calls) == 3


def test_bad_bounds() -> None:
    with pytest.raises(ValueError):
        HubCache(SETTINGS, max_entries=0)
    with pytest.raises(ValueError):
        HubCache(SETTINGS, ttl_s=0)
