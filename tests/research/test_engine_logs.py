"""The serving answers against published engine startup logs (research/engine_logs.py): what is
exact stays exact, and the errors that remain are pinned so they can only shrink."""

from __future__ import annotations

import statistics

import pytest

from research.engine_logs import checks

ROWS = checks()


def _errors(engine: str, quantity: str) -> list[float]:
    return [r.error for r in ROWS if (r.engine, r.quantity) == (engine, quantity)]


@pytest.mark.parametrize("quantity", ["model buffer", "model buffer (CPU)", "KV buffer"])
def test_gguf_buffers_are_exact_to_the_printed_mib(quantity):
    rows = [r for r in ROWS if r.engine in ("ollama", "llama_cpp") and r.quantity == quantity]
    assert len(rows) >= 6
    for r in rows:
        # llama.cpp prints MiB to two decimals
        assert abs(r.predicted - r.measured) <= 0.0051, r


def test_gguf_compute_buffers_never_fall_short_by_more_than_print_rounding():
    rows = [
        r for r in ROWS if r.engine in ("ollama", "llama_cpp") and r.quantity == "compute buffer"
    ]
    assert all(r.predicted - r.measured >= -0.06 for r in rows), rows
    assert max(abs(r.error) for r in rows) <= 0.31


def test_vllm_weights_within_target():
    errs = _errors("vllm", "weights")
    assert len(errs) >= 10
    assert statistics.median(abs(e) for e in errs) <= 0.005  # target: 0.5%
    assert max(abs(e) for e in errs) <= 0.0075  # ratchet: 0.68% (a ROCm run)


def test_vllm_kv_tokens_ratchet():
    errs = _errors("vllm", "KV tokens")
    assert len(errs) == 22
    assert statistics.median(abs(e) for e in errs) <= 0.018
    assert max(abs(e) for e in errs) <= 0.32


def test_vllm_kv_tokens_held_out_set_b_within_targets():
    """Set B (15 launches collected after the vLLM rules were fixed, research/engine_logs.py
    HELD_OUT_B): within the KV-token targets. The sort-path sampler rule was found on them
    (docs/ACCURACY.md says so); it is counted from vLLM's and torch's source, nothing fitted."""
    errs = [r.error for r in ROWS if r.fresh and (r.engine, r.quantity) == ("vllm", "KV tokens")]
    assert len(errs) == 15
    assert statistics.median(abs(e) for e in errs) <= 0.03
    assert max(abs(e) for e in errs) <= 0.10


@pytest.mark.xfail(
    strict=True,
    reason="vLLM 0.10.1 launches on A100 (likely vLLM's Docker image, whose flashinfer makes "
    "the sampler skip the sort the estimate assumes; tensor-parallel on an unstated A100 "
    "form factor) hold 12-32% more KV than estimated (docs/ACCURACY.md)",
)
def test_vllm_kv_tokens_targets():
    errs = _errors("vllm", "KV tokens")
    assert statistics.median(abs(e) for e in errs) <= 0.03
    assert max(abs(e) for e in errs) <= 0.10


def test_vllm_band_low_end_never_promises_more_kv_than_the_engine_printed():
    """kv_cache_tokens_band on the held-out logs: every printed KV size is at or above the band's
    low end (the low end is what to size for), and at least the current 20 of 22 fall inside."""
    band = [r for r in ROWS if r.quantity == "KV tokens inside the band"]
    assert len(band) == 22
    assert sum(r.predicted for r in band) >= 20
    for r in ROWS:
        if r.engine == "vllm" and r.quantity == "KV tokens":
            log_band = next(b for b in band if b.log == r.log)
            assert log_band.predicted == 1.0 or r.measured > r.predicted, r


def test_sglang_max_running_requests_exact():
    """SGLang's scheduler limit follows the pool as each release computes it (0.4.x: one slot
    more than the estimate; research/engine_logs.py's two held-out launches printed 2049)."""
    rows = [r for r in ROWS if (r.engine, r.quantity) == ("sglang", "max running requests")]
    assert len(rows) == 2
    assert all(r.predicted == r.measured for r in rows), rows


def test_sglang_kv_tokens_ratchet():
    """Held out, pinned so it can only shrink: the RTX 3090 launch ran under WSL2 with the
    desktop's memory already taken (+8.7%); on 4 x L4 (PCIe) the start took 0.32 GiB, where
    the model keeps one 0.51 GiB context and the 0.17 GiB PCIe distributed term, and SGLang's
    weights line is 0.28 GiB above the parameters (-0.7%; -25.6% while vLLM 0.19's 1.0 GiB
    NCCL baseline was kept on PCIe)."""
    errs = _errors("sglang", "KV tokens")
    assert len(errs) == 2
    assert max(errs) <= 0.088 and min(errs) >= -0.008


@pytest.mark.xfail(
    strict=True,
    reason="SGLang held-out KV tokens: +8.7% (RTX 3090 under WSL2, the desktop's memory taken) "
    "and -0.7% (4 x L4), median 4.7% (docs/ACCURACY.md)",
)
def test_sglang_kv_tokens_targets():
    errs = _errors("sglang", "KV tokens")
    assert statistics.median(abs(e) for e in errs) <= 0.03
    assert max(abs(e) for e in errs) <= 0.10
