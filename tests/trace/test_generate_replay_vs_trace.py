"""The analytic generate replay (:mod:`vrambudget.core.allocator.generate`, a stream written from
transformers' source) against the trace tier, which records the allocations of transformers'
own modelling code on fake tensors and replays them through the same allocator model.

Qwen2.5-0.5B, eager attention in bf16, batch 4 x (2048 + 16) tokens: the prefill's scores
dominate, and the trace (prefill and the last decode step) sees the same peak as the whole
decode. Our H200 campaign measured this workload (transformers 5.23.0, torch 2.11.0):
3,602,776,064 B allocated at most (research/data/corpus/gpu_campaign_2026-12-04.json)."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

pytest.importorskip("transformers")

WORKLOAD = {
    "kind": "inference",
    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
    "batch_size": 4,
    "prompt_tokens": 2048,
    "generated_tokens": 16,
    "attention": "eager",
}
DEVICE = {"source": "catalog", "id": "h200-sxm-141gb"}


def test_the_analytic_stream_replays_as_the_framework_code_does() -> None:
    from vrambudget.core.allocator.generate import replay_generate
    from vrambudget.core.budget.generate_cache import generate_shape
    from vrambudget.core.deployed import deploy_all
    from vrambudget.core.overheads import DEFAULT_OVERHEADS
    from vrambudget.trace.engine import trace_budget

    body = {"workloads": [WORKLOAD], "device": DEVICE}
    traced = trace_budget(msgspec.convert({**body, "method": "trace"}, BudgetRequest)).trace
    assert traced is not None and traced.code.startswith("framework: transformers")

    req = msgspec.convert(body, BudgetRequest)
    budget = estimate(req.workloads, req.device, req.headroom)
    weights = {ln.component: ln.bytes for ln in budget.devices[0].lines}[Component.WEIGHTS]
    (w,), _ = deploy_all(req.workloads)  # type: ignore[arg-type]
    shape = generate_shape(w, DEFAULT_OVERHEADS)  # type: ignore[arg-type]
    assert shape is not None and shape.eager and shape.softmax_copy
    replay = replay_generate(shape)

    # The replay leaves the weights out: they fill their own segments.
    assert replay.allocated_bytes + weights == pytest.approx(traced.peak_allocated_bytes, rel=0.02)
    traced_cached = traced.peak_reserved_bytes - traced.peak_allocated_bytes
    assert replay.cached_bytes == pytest.approx(traced_cached, rel=0.15)
