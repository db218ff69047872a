"""The CPU probe (vrambudget/agent/probe.py, probe_cpu.py) measured for real on a tiny model."""

from __future__ import annotations

import msgspec

from tests.support.workloads import TINY
from vrambudget.core.probe_report import ProbeRequest


def test_cpu_probe_kv_view_counts_every_stream() -> None:
    """The KV view is the known allocation of one request's cache (the exact K/V tensor bytes of
    the tiny model: layers x 2 x sequences x context x kv_heads x head_dim x 4 B) times the
    streams that each hold one."""
    from vrambudget.agent.child import ChildSettings
    from vrambudget.agent.probe import measure

    spec = {
        "kind": "inference",
        "model": TINY,
        "batch_size": 1,
        "prompt_tokens": 16,
        "generated_tokens": 2,
        "precision": {"weights": "fp32", "compute": "fp32"},
    }
    one_cache = 2 * 2 * 1 * 18 * 2 * 32 * 4  # layers, K+V, seqs, context, kv heads, dim, fp32
    for streams in (1, 3):
        req = msgspec.convert(
            {"workload": spec, "iterations": 1, "concurrency": streams}, ProbeRequest
        )
        out = measure(req, ChildSettings())
        assert out.result is not None
        assert out.result.torch.kv_cache_bytes == one_cache * streams
