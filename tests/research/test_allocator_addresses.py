"""Where the driver puts new segments, held to the H100 campaign (research/allocator_addresses.py):
the trace tier's replay of a batched eager-attention prefill (Qwen2.5-0.5B, 4 x 2,048 tokens)
against the measured ``max_memory_reserved`` and inactive-split peak, and of one long SDPA prompt.
The whole table (fourteen runs) is in docs/ACCURACY.md."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from research.allocator_addresses import rows


def test_falling_segment_addresses_reproduce_the_measured_reserved_peaks() -> None:
    found = {
        r.name: r for r in rows({"framework-generate-eager", "framework-generate-long-prompt"})
    }
    eager = found["framework-generate-eager"]
    assert eager.measured_reserved == 4_980_736_000
    # Falling: within 2.1 MiB of the reserved peak and 1.1 MiB of the inactive-split peak.
    assert abs(eager.falling_reserved - eager.measured_reserved) <= 2_200_000
    assert abs(eager.falling_inactive - eager.measured_inactive) <= 1_100_000
    # Rising: one 896 MiB fp32 score segment short (18.9% low).
    assert eager.error("rising") < -0.18
    long_prompt = found["framework-generate-long-prompt"]
    assert abs(long_prompt.error("falling")) <= 0.02
