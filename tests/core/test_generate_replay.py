"""transformers generate replayed through the caching-allocator model
(:mod:`vrambudget.core.allocator.generate`) and the answer's ``allocator_cache``
(:mod:`vrambudget.core.budget.generate_cache`). The replay's numbers are checked against
published ``max_memory_reserved`` in tests/research/test_generate_replay_published.py; here:
its invariants, and the answer's arithmetic to the byte."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.allocator.generate import (
    MAX_EVENTS,
    GenerateShape,
    events_of,
    replay_generate,
)
from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.formulas.allocator_overhead import ROUNDING_PART
from vrambudget.core.spec import BudgetRequest

C = Component
LLAMA2_7B = {"source": "preset", "id": "llama-2-7b"}


def _shape(**kw: Any) -> GenerateShape:
    base: dict[str, Any] = dict(
        layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, intermediate=11008,
        vocab=32000, elem=2, batch=8, prompt=256, generated=128, keep_old_cache=False,
        all_prompt_logits=False, eager=False, repeat_kv=False,
    )  # fmt: skip
    return GenerateShape(**{**base, **kw})


def _budget(workload: dict[str, Any], **extra: Any):
    body: dict[str, Any] = {"workloads": [workload], "allocator_replay": True, **extra}
    r = msgspec.convert(body, BudgetRequest)
    return estimate(
        r.workloads, r.device, r.headroom, software=r.software, allocator_replay=r.allocator_replay
    )


GEN = {
    "kind": "inference",
    "model": LLAMA2_7B,
    "batch_size": 8,
    "prompt_tokens": 256,
    "generated_tokens": 512,
    "attention": "eager",
}
OLD = {"framework": "transformers", "framework_version": "4.35.2"}


def test_a_growing_cache_leaves_cached_segments_and_expandable_segments_remove_them() -> None:
    r = replay_generate(_shape(generated=512))
    e = replay_generate(_shape(generated=512), expandable_segments=True)
    assert r.reserved_bytes >= r.allocated_bytes > 0
    # Batch 8 x 768 tokens of Llama-2-7B cache is 3.2 GB; the cached segments are several
    # times that, and one growing segment per pool keeps almost none of it.
    assert r.cached_bytes > 4 * 8 * 768 * 32 * 2 * 4096 * 2
    assert e.cached_bytes < r.cached_bytes / 10


def test_fragmentation_grows_with_the_batch() -> None:
    cached = [replay_generate(_shape(batch=b)).cached_bytes for b in (1, 4, 8)]
    assert cached[0] < cached[1] < cached[2]


def test_the_legacy_cache_keeps_the_old_cache_live() -> None:
    new = replay_generate(_shape())
    old = replay_generate(_shape(keep_old_cache=True))
    one_cache = 8 * 383 * 32 * 2 * 4096 * 2  # the previous step's K and V, every layer
    assert old.allocated_bytes - new.allocated_bytes >= one_cache * 9 // 10


def test_the_replay_is_bounded_and_its_count_is_close() -> None:
    shape = _shape(batch=16, generated=512, keep_old_cache=True, eager=True)
    counted, replayed = events_of(shape), replay_generate(shape).events
    assert abs(counted - replayed) <= replayed // 5
    too_long = _shape(batch=64, generated=4096)
    assert events_of(too_long) > MAX_EVENTS
    with pytest.raises(ValueError, match="replay limit"):
        replay_generate(too_long)


def test_a_trace_request_cannot_ask_for_the_replay() -> None:
    body = {"method": "trace", "workloads": [GEN], "allocator_replay": True}
    with pytest.raises(msgspec.ValidationError, match="allocator_replay belongs to method"):
        msgspec.convert(body, BudgetRequest)


def test_only_a_request_that_asks_gets_the_replay() -> None:
    d = _budget(GEN, allocator_replay=False).devices[0]
    assert d.allocator_cache is None


def _outside_and_allocated(d) -> tuple[int, int]:
    lines = {ln.component: ln for ln in d.lines}
    outside = lines[C.CUDA_CONTEXT].bytes + lines[C.COMMUNICATION_BUFFERS].bytes
    frag = sum(p.bytes for p in lines[C.ALLOCATOR_OVERHEAD].parts if p.name != ROUNDING_PART)
    allocated = d.total_bytes - lines[C.HEADROOM].bytes - outside - frag
    return outside, allocated


A100 = {"source": "catalog", "id": "a100-sxm4-80gb"}
OLD_SHAPE = {"batch": 8, "generated": 512, "keep_old_cache": True, "all_prompt_logits": True}


def _a100_readings(software: dict[str, Any]):
    """GEN on an A100: the device's reading, its bytes outside the allocator, its allocated
    bytes."""
    d = _budget(GEN, software=software, device=A100).devices[0]
    assert d.allocator_cache is not None
    return (d.allocator_cache, *_outside_and_allocated(d))


def test_the_expected_readings_add_up_to_the_byte() -> None:
    b = _budget(GEN, software=OLD, device=A100)
    d = b.devices[0]
    cache, outside, allocated = _a100_readings(OLD)
    shape = _shape(**OLD_SHAPE, eager=True)
    replay = replay_generate(shape)
    assert cache.cached_bytes == replay.cached_bytes
    assert cache.reserved_bytes == allocated + replay.cached_bytes
    assert cache.device_used_bytes == cache.reserved_bytes + outside
    assert not cache.releases_cache
    assert cache.expandable_segments_cached_bytes == (
        replay_generate(shape, expandable_segments=True).cached_bytes
    )
    # The fit is the budget's: the cached segments are released under pressure.
    assert cache.device_used_bytes > d.total_bytes


def test_a_device_too_small_for_the_cached_segments_caps_them() -> None:
    b = _budget(
        {**GEN, "batch_size": 16},
        software=OLD,
        device={"source": "catalog", "id": "a100-sxm4-80gb"},
    )
    d = b.devices[0]
    cache = d.allocator_cache
    assert cache is not None and cache.releases_cache
    outside, allocated = _outside_and_allocated(d)
    capacity = b.device.memory_total_bytes
    assert cache.reserved_bytes == capacity - outside
    assert cache.device_used_bytes == capacity
    assert cache.cached_bytes == capacity - outside - allocated
    assert b.fit is not None and b.fit.verdict != "does_not_fit"


def test_a_budget_that_does_not_fit_is_not_capped() -> None:
    """Llama-2-70B at batch 8 does not fit an A100-80GB: that run fails, it does not flush."""
    model = {"source": "preset", "id": "llama-2-70b"}
    b = _budget({**GEN, "model": model}, device={"source": "catalog", "id": "a100-sxm4-80gb"})
    cache = b.devices[0].allocator_cache
    assert b.fit is not None and b.fit.verdict == "does_not_fit"
    assert cache is not None and not cache.releases_cache
    _, allocated = _outside_and_allocated(b.devices[0])
    assert cache.reserved_bytes == allocated + cache.cached_bytes > b.device.memory_total_bytes


def test_without_a_device_nothing_is_capped() -> None:
    d = _budget({**GEN, "batch_size": 16}, software=OLD).devices[0]
    assert d.allocator_cache is not None and not d.allocator_cache.releases_cache
    assert d.allocator_cache.reserved_bytes > 100 * 10**9


@pytest.mark.parametrize(
    ("change", "software"),
    [
        ({"concurrent_requests": 2}, None),  # separate generate calls on their own streams
        ({"parallelism": {"tensor": 2}}, None),
        ({"generated_tokens": 0}, None),
        ({"batch_size": 64, "generated_tokens": 4096}, None),  # above MAX_EVENTS
        ({}, {"framework": "litgpt"}),  # a preallocated cache
        ({"model": {"source": "preset", "id": "mixtral-8x7b"}}, None),
        ({"model": {"source": "preset", "id": "gemma-2-9b"}}, None),  # a static hybrid cache
        ({"model": {"source": "preset", "id": "gpt2"}}, None),  # LayerNorm, not Llama's stream
        ({"precision": {"kv_cache": "fp8_e4m3"}}, None),
    ],
)
def test_where_the_replay_does_not_apply_there_is_no_reading(
    change: dict[str, Any], software: dict[str, Any] | None
) -> None:
    extra = {} if software is None else {"software": software}
    d = _budget({**GEN, **change}, **extra).devices[0]
    assert d.allocator_cache is None


def test_current_transformers_is_replayed_too() -> None:
    d = _budget({**GEN, "attention": "sdpa"}).devices[0]
    assert d.allocator_cache is not None
    assert d.allocator_cache.cached_bytes > d.allocator_cache.expandable_segments_cached_bytes


def test_a_stack_with_expandable_segments_holds_what_their_replay_holds() -> None:
    """With ``software.expandable_segments`` the expected readings are the expandable replay's:
    the allocated bytes plus its cached bytes, the same replay the default answer offers as the
    remedy."""
    cache, _, allocated = _a100_readings({**OLD, "expandable_segments": True})
    expandable = replay_generate(_shape(**OLD_SHAPE, eager=True), expandable_segments=True)
    assert cache.cached_bytes == cache.expandable_segments_cached_bytes == expandable.cached_bytes
    assert cache.reserved_bytes == allocated + expandable.cached_bytes
    assert cache.cached_bytes < _a100_readings(OLD)[0].cached_bytes
