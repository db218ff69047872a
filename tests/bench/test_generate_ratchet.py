"""bench/gpu/generate_ratchet.py (the repeated-generate measurement the GPU campaign runs) takes
its whole path on the CPU in a dry run: the preset's config, transformers' generate, the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")


def test_dry_run_writes_every_series(tmp_path: Path) -> None:
    from bench.gpu.generate_ratchet import main

    out = tmp_path / "ratchet.json"
    assert main(["--dry-run", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "vrambudget.generate_ratchet/1" and doc["dry_run"] is True
    # written after each series, complete after the last (campaign.sh's 90 s limit stopped the
    # H100 run of 2026-12-05 in its second series, before the old single write at the end)
    assert doc["complete"] is True and not out.with_suffix(".json.tmp").exists()
    assert [s["batch_size"] for s in doc["series"]] == [1, 2]
    assert all(len(s["calls"]) == 2 and s["after_empty_cache"] is None for s in doc["series"])
    assert doc["weights_bytes"] > 0


def test_cached_segments_are_listed_largest_first() -> None:
    """``_segments`` reads ``torch.cuda.memory_snapshot()`` (one dict per cudaMalloc segment)."""
    from types import SimpleNamespace

    from bench.gpu.generate_ratchet import _segments

    snap = [
        {"segment_type": "small", "total_size": 2 << 20, "allocated_size": 512},
        {"segment_type": "large", "total_size": 20 << 20, "allocated_size": 0},
        {"segment_type": "large", "total_size": 64 << 20, "allocated_size": 48 << 20},
    ]
    fake = SimpleNamespace(cuda=SimpleNamespace(memory_snapshot=lambda: snap))
    assert _segments(fake) == [
        ["large", 64 << 20, 48 << 20],
        ["large", 20 << 20, 0],
        ["small", 2 << 20, 512],
    ]
