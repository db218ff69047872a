"""research/generate_ratchet.py: a GPU run of bench/gpu/generate_ratchet.py against the generate
replay. The document below has the script's shape (``vrambudget.generate_ratchet/1``) with
made-up counters; the replay's side is rebuilt here by hand from Qwen2.5-0.5B's config."""

from __future__ import annotations

import pytest

from research.generate_ratchet import compare
from vrambudget.core.allocator.generate import GenerateShape, replay_generate

WEIGHTS = 988_160_896


def _doc(**kw: object) -> dict[str, object]:
    call = {"max_allocated": WEIGHTS + 300_000_000, "max_reserved": WEIGHTS + 400_000_000}
    later = {"max_allocated": WEIGHTS + 300_000_000, "max_reserved": WEIGHTS + 500_000_000}
    return {
        "schema": "vrambudget.generate_ratchet/1",
        "dry_run": False,
        "torch": "2.11.0+cu130",
        "transformers": "5.23.0",
        "gpu": "NVIDIA H200",
        "weights_bytes": WEIGHTS,
        "series": [
            {"batch_size": 16, "prompt_tokens": 512, "new_tokens": 256, "calls": [call, later]}
        ],
        **kw,
    }


def test_each_series_is_compared_with_the_replay_of_its_shape() -> None:
    (row,) = compare(_doc())
    # Qwen2.5-0.5B: 24 layers, hidden 896, 14 query / 2 KV heads of 64, MLP 4864, vocab 151,936;
    # SDPA on transformers 5.23 with torch 2.11 takes grouped K/V as they are.
    shape = GenerateShape(
        layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64, intermediate=4864,
        vocab=151936, elem=2, batch=16, prompt=512, generated=256, keep_old_cache=False,
        all_prompt_logits=False, eager=False, repeat_kv=False,
    )  # fmt: skip
    replay = replay_generate(shape)
    assert (row.replay_allocated, row.replay_reserved) == (
        replay.allocated_bytes,
        replay.reserved_bytes,
    )
    assert (row.measured_allocated, row.measured_reserved) == (300_000_000, 400_000_000)
    assert row.reserved_last_call == 500_000_000
    assert row.reserved_error == (replay.reserved_bytes - 400_000_000) / 400_000_000


def test_the_runs_versions_choose_the_stream() -> None:
    """transformers 4.53 expands grouped K/V for SDPA (another stream, other segments)."""
    (old,) = compare(_doc(transformers="4.53.0"))
    (new,) = compare(_doc())
    assert old.replay_reserved != new.replay_reserved


@pytest.mark.parametrize(
    ("change", "message"),
    [({"schema": "other/1"}, "not a generate_ratchet"), ({"dry_run": True}, "dry run")],
)
def test_documents_without_counters_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compare(_doc(**change))
