"""The core's one memo mechanism is bounded: a cache keyed by what callers send (a custom device, a
workload) forgets its oldest entries instead of growing with every distinct request."""

from __future__ import annotations

from vrambudget.core import device
from vrambudget.core.memo import BoundedCache
from vrambudget.core.spec import CustomDevice


def test_oldest_entry_goes_first() -> None:
    cache: BoundedCache[int, str] = BoundedCache(3)
    for i in range(5):
        cache.put(i, str(i))
    assert list(cache) == [2, 3, 4]
    assert cache.get_or(4, lambda: "new") == "4"
    assert cache.get_or(9, lambda: "nine") == "nine"
    assert list(cache) == [3, 4, 9]


def test_every_module_level_cache_of_the_core_is_bounded() -> None:
    from vrambudget.core.budget import analytic, explain, inference

    for cache in (
        device._CONTEXTS,
        device._CALIBRATED,
        analytic._STATIC,
        inference._PLANS,
        explain._SOURCES,
        explain._ROWS,
        explain._USES,
    ):
        assert isinstance(cache, BoundedCache) and cache.max_entries <= 4096


def test_custom_devices_do_not_grow_the_device_caches() -> None:
    before = len(device._CONTEXTS)
    for i in range(50):
        ctx = device.resolve_device(CustomDevice(name=f"card {i}", memory_total_bytes=1 << 30))
        assert ctx is not None and ctx.name == f"card {i}"
    assert len(device._CONTEXTS) == before  # only catalog GPUs are cached, by id


def test_threads_putting_at_once_never_fail() -> None:
    """Core functions may be called from several threads: evicting the same oldest entry at
    once is not an error, and the bound holds within the entries being put."""
    import threading

    cache: BoundedCache[tuple[int, int], int] = BoundedCache(3)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(20_000):
                cache.put((t, i), i)
                cache.get_or((t, i % 7), lambda: 0)
        except BaseException as exc:  # noqa: BLE001 - the test reports any failure
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(cache) <= 3 + 8


def test_minus_zero_headroom_is_one_request_whatever_came_first() -> None:
    """-0.0 equals 0.0, so the two share cached parts: both are read as 0.0, and an answer
    never echoes the spelling of another request that came first."""
    import msgspec

    from vrambudget.core.estimate import estimate
    from vrambudget.core.spec import Headroom, Workload

    w = msgspec.convert(
        {"kind": "inference", "model": {"source": "preset", "id": "gpt2"}, "batch_size": 3},
        Workload,
    )
    decoded = msgspec.json.decode(b'{"fraction": -0.0}', type=Headroom)
    assert str(decoded.fraction) == "0.0"
    answers = [
        msgspec.json.encode(estimate((w,), headroom=Headroom(fraction=f))) for f in (0.0, -0.0)
    ]
    assert answers[0] == answers[1]
    assert b'"headroom_fraction":-0.0' not in answers[1]
