"""The generate replay (``DeviceBudget.allocator_cache``) against published
``torch.cuda.max_memory_reserved()``: optimum-benchmark ``examples/running-llamas``
(commit f75d9f93, transformers 4.35.2, torch 2.1.1, A100-SXM4-80GB; one greedy generate of
256 + 512 tokens after ``empty_cache``), research/data/corpus/inference_more.json. The
analytic fragmentation line alone was 31-67% low on the batch 4 and 8 rows. The replay places
new segments below the last one, as the driver did on our H100 campaign
(research/allocator_addresses.py); the 13B batch 4 row moved from +0.1% to +2.2% with it (over,
the safe side), hence its 3%."""

from __future__ import annotations

import pytest

from research import corpus

# Record id -> tolerance on the relative error of the reserved reading.
CASES = {
    "inf2-ob-llama2-7b-fp16-bs1-reserved-a100": 0.02,
    "inf2-ob-llama2-7b-fp16-bs4-reserved-a100": 0.02,
    "inf2-ob-llama2-7b-fp16-bs8-reserved-a100": 0.04,
    "inf2-ob-llama2-13b-fp16-bs1-reserved-a100": 0.02,
    "inf2-ob-llama2-13b-fp16-bs4-reserved-a100": 0.03,
}


@pytest.mark.parametrize(("record_id", "tolerance"), sorted(CASES.items()))
def test_reserved_readings_match_the_published_ones(record_id: str, tolerance: float) -> None:
    (r,) = [r for r in corpus.load() if r.id == record_id]
    assert r.view == "torch_max_reserved"
    p = corpus.predict(r)
    assert abs(p.error) <= tolerance, (record_id, p.predicted, r.measured)
