"""The roofline estimate (core/roofline.py, core/latency.py): hand-computed numbers for Llama
3.1 8B on an H100 SXM5, the latency-limited batch, and the fit's latency and cost answers."""

from __future__ import annotations

from fractions import Fraction

import msgspec
import pytest

from vrambudget.core.catalog import preset_arch
from vrambudget.core.fit import fit
from vrambudget.core.gpu_perf import gpu_perf
from vrambudget.core.latency import matmul_params, model_cost
from vrambudget.core.roofline import ModelCost, Rates, decode_step, largest_batch, prefill_step
from vrambudget.core.spec import FitRequest

H100 = gpu_perf()["h100-sxm5-80gb"]
# Llama 3.1 8B (config.json): 32 layers, hidden 4096, 32 heads x 128, 8 KV heads, vocab 128,256,
# untied lm_head; 8,030,261,248 parameters.
PARAMS = 8_030_261_248
EMBED = 128_256 * 4096  # 525,336,576: a lookup, no matmul
MATMUL = PARAMS - EMBED  # 7,504,924,672
KV_PER_TOKEN = 2 * 8 * 128 * 32 * 2  # K and V, 8 heads x 128, 32 layers, bf16: 131,072 B
ATTN_PER_POSITION = 4 * 32 * 32 * 128  # QK^T and AV: 524,288 FLOPs per token per position
WEIGHTS = PARAMS * 2  # bf16: 16,060,522,496 B


def cost_8b() -> ModelCost:
    return model_cost(preset_arch("llama-3.1-8b"), 1, WEIGHTS, 2)


def test_model_cost_of_llama_8b_is_the_hand_count():
    arch = preset_arch("llama-3.1-8b")
    assert arch.num_params == PARAMS
    assert matmul_params(arch) == MATMUL == 7_504_924_672
    c = cost_8b()
    assert c.kv_bytes_per_token == KV_PER_TOKEN == 131_072
    assert c.linear_flops_per_token == 2 * MATMUL
    assert c.attention_flops_per_position == ATTN_PER_POSITION
    assert c.allreduce_bytes_per_token == 0
    tp2 = model_cost(arch, 2, WEIGHTS // 2, 2)
    assert tp2.kv_bytes_per_token == KV_PER_TOKEN // 2
    assert tp2.linear_flops_per_token == MATMUL  # 2 x MATMUL / 2
    assert tp2.allreduce_bytes_per_token == 2 * 32 * 4096 * 2


def test_decode_and_prefill_on_h100_are_the_hand_computed_roofline():
    rates = Rates(peak_flops=989_500 * 10**9, bandwidth_bytes_per_s=3_350 * 10**9)
    assert (rates.mfu, rates.mbu) == (0.5, 0.7)
    bw = Fraction(3_350 * 10**9) * Fraction(7, 10)
    peak = Fraction(989_500 * 10**9) / 2
    # decode: batch 8 at context 1,280 reads the weights and 8 x 1,280 cached tokens
    step = decode_step(cost_8b(), rates, 8, 1280)
    memory = Fraction(16_060_522_496 + 8 * 1280 * 131_072, 1) / bw
    compute = Fraction(8 * (2 * 7_504_924_672 + 524_288 * 1280), 1) / peak
    assert memory > compute and step.bound == "memory"
    assert step.seconds == pytest.approx(float(memory), rel=1e-12)
    assert float(memory) * 1000 == pytest.approx(7.4212, abs=1e-4)  # ms per output token
    # prefill of 1,024 tokens: compute-bound
    pre = prefill_step(cost_8b(), rates, 1024)
    flops = 1024 * 2 * 7_504_924_672 + 524_288 * 1024 * 1025 // 2
    assert pre.bound == "compute"
    assert pre.seconds == pytest.approx(float(Fraction(flops, 1) / peak), rel=1e-12)
    assert pre.seconds * 1000 == pytest.approx(31.6225, abs=1e-4)  # ms to first token


def test_all_reduce_counts_only_with_a_link_rate():
    arch = preset_arch("llama-3.1-8b")
    c = model_cost(arch, 2, WEIGHTS // 2, 2)
    base = Rates(peak_flops=10**15, bandwidth_bytes_per_s=10**12)
    assert decode_step(c, base, 4, 100).allreduce_seconds == 0.0
    linked = Rates(peak_flops=10**15, bandwidth_bytes_per_s=10**12, link_bytes_per_s=10**11)
    # ring all-reduce: 2 (t-1)/t x 4 tokens x 2 x 32 x 4096 x 2 B over 100 GB/s
    expected = 2 * 1 * 4 * (2 * 32 * 4096 * 2) / 2 / 10**11
    assert decode_step(c, linked, 4, 100).allreduce_seconds == pytest.approx(expected)


def test_largest_batch_meets_the_target_and_one_more_does_not():
    rates = Rates(peak_flops=989_500 * 10**9, bandwidth_bytes_per_s=3_350 * 10**9)
    target = 0.015  # 15 ms per output token at context 1,280
    best = largest_batch(cost_8b(), rates, 1280, target, 1 << 20)
    # memory-bound: W + b x 1,280 x KV <= 15 ms x 3.35e12 x 0.7
    budget = Fraction(15, 1000) * 3_350 * 10**9 * Fraction(7, 10)
    by_hand = int((budget - 16_060_522_496) // (1280 * 131_072))
    assert best == by_hand == 113
    assert decode_step(cost_8b(), rates, best, 1280).seconds <= target
    assert decode_step(cost_8b(), rates, best + 1, 1280).seconds > target
    assert largest_batch(cost_8b(), rates, 1280, 0.001, 1 << 20) == 0  # weights alone: 6.8 ms


def _fit(**body: object):
    return fit(msgspec.convert(body, FitRequest))


INFER = {
    "kind": "inference",
    "model": {"source": "preset", "id": "llama-3.1-8b"},
    "prompt_tokens": 1024,
    "generated_tokens": 256,
}


def test_fit_reports_the_memory_and_latency_limits_of_each_layout():
    answer = _fit(
        workloads=[INFER],
        devices=[{"source": "catalog", "id": "h100-sxm5-80gb"}],
        device_counts=[1],
        solve=["concurrency"],
        latency_target={"time_per_output_token_ms": 10},
    )
    lay = answer.gpus[0].layouts[0]
    est = lay.latency
    assert (
        est is not None
        and est.compute_format == "bf16"
        and est.peak_flops == 989_500 * 10**12 // 1000
    )
    assert est.memory_max_batch == lay.maxima.concurrent_requests
    rates = Rates(peak_flops=989_500 * 10**9, bandwidth_bytes_per_s=3_350 * 10**9)
    # the fit's weights are the budget's: the bf16 parameters (cost_8b's 16,060,522,496 B)
    assert est.latency_max_batch == largest_batch(cost_8b(), rates, 1280, 0.010, 1 << 20)
    assert est.latency_max_batch < est.memory_max_batch
    assert est.limited_by == "time_per_output_token" and est.batch == est.latency_max_batch
    assert est.time_per_output_token_ms <= 10 and est.meets_targets
    assert est.output_tokens_per_s == pytest.approx(
        est.batch / decode_step(cost_8b(), rates, est.batch, 1280).seconds, rel=1e-6
    )
    # a time-to-first-token target below the prefill time: nothing meets it
    strict = _fit(
        workloads=[INFER],
        devices=[{"source": "catalog", "id": "h100-sxm5-80gb"}],
        device_counts=[1],
        latency_target={"time_to_first_token_ms": 5},
    )
    est = strict.gpus[0].layouts[0].latency
    assert est is not None and est.batch == 0 and est.limited_by == "time_to_first_token"
    assert not est.meets_targets


def test_fit_without_a_peak_for_the_format_says_so():
    answer = _fit(
        workloads=[INFER],
        devices=[{"source": "catalog", "id": "t4-16gb"}],
        device_counts=[2],
        latency_target={"time_per_output_token_ms": 50},
    )
    lay = answer.gpus[0].layouts[0]
    assert lay.latency is None  # the T4 has no bf16: no peak for a bf16 workload
    assert any("no latency estimate" in w and "T4" in w for w in lay.warnings)
    fp16 = {**INFER, "precision": {"weights": "fp16", "compute": "fp16"}}
    answer = _fit(
        workloads=[fp16],
        devices=[{"source": "catalog", "id": "t4-16gb"}],
        device_counts=[2],
        latency_target={"time_per_output_token_ms": 50},
    )
    est = answer.gpus[0].layouts[0].latency
    assert est is not None and est.compute_format == "fp16" and est.peak_flops == 65 * 10**12


def test_cost_ranking_is_price_times_devices_over_tokens_per_hour():
    prices = {"h100-sxm5-80gb": 2.5, "a100-sxm4-80gb": 1.2}
    answer = _fit(
        workloads=[INFER],
        devices=[
            {"source": "catalog", "id": "h100-sxm5-80gb"},
            {"source": "catalog", "id": "a100-sxm4-80gb"},
        ],
        device_counts=[1, 2],
        solve=["concurrency"],
        latency_target={"time_per_output_token_ms": 25},
        prices=prices,
    )
    ranks = answer.cost_ranking
    assert len(ranks) == 4
    costs = [r.cost_per_million_output_tokens for r in ranks]
    assert costs == sorted(costs)
    layouts = {(g.gpu_id, lay.device_count): lay for g in answer.gpus for lay in g.layouts}
    for r in ranks:
        est = layouts[(r.gpu_id, r.device_count)].latency
        assert est is not None and r.price_per_device_hour == prices[r.gpu_id]
        by_hand = prices[r.gpu_id] * r.device_count / (est.output_tokens_per_s * 3600) * 1e6
        assert r.cost_per_million_output_tokens == pytest.approx(by_hand, rel=1e-5)
    # without prices: no ranking, no cost
    plain = _fit(
        workloads=[INFER],
        devices=[{"source": "catalog", "id": "h100-sxm5-80gb"}],
        latency_target={"time_per_output_token_ms": 25},
    )
    assert plain.cost_ranking == ()
    est = plain.gpus[0].layouts[0].latency
    assert est is not None and est.cost_per_million_output_tokens is None


def test_serving_fit_estimates_vllm_layouts():
    answer = _fit(
        workloads=[
            {
                "kind": "llm_serving",
                "model": {"source": "preset", "id": "llama-3.1-70b"},
                "max_model_len": 8192,
                "engine_version": "0.19.0",
            }
        ],
        devices=[{"source": "catalog", "id": "h100-sxm5-80gb"}],
        device_counts=[4],
        latency_target={
            "time_per_output_token_ms": 40,
            "prompt_tokens": 2000,
            "output_tokens": 500,
        },
        prices={"h100-sxm5-80gb": 3.0},
    )
    lay = answer.gpus[0].layouts[0]
    est = lay.latency
    assert est is not None and (est.prompt_tokens, est.output_tokens) == (2000, 500)
    assert est.all_reduce == "not_counted"  # tensor parallel 4, no link rate in the catalog
    assert est.batch == min(est.memory_max_batch, est.latency_max_batch or 0)
    assert est.time_per_output_token_ms <= 40
    assert answer.cost_ranking[0].device_count == 4


@pytest.mark.parametrize(
    ("target", "field"),
    [
        ({"time_per_output_token_ms": 0}, "time_per_output_token_ms"),
        ({"time_per_output_token_ms": -5}, "time_per_output_token_ms"),
        ({"time_to_first_token_ms": 4_000_000}, "time_to_first_token_ms"),
        ({"mbu": 1.5}, "mbu"),
        ({"mfu": 0}, "mfu"),
        ({"prompt_tokens": 0}, "prompt_tokens"),
    ],
)
def test_bad_targets_are_rejected_naming_the_field(target, field):
    body = {"workloads": [INFER], "latency_target": target}
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.convert(body, FitRequest)


def test_a_serving_target_longer_than_max_model_len_holds_no_request():
    answer = _fit(
        workloads=[
            {
                "kind": "llm_serving",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "max_model_len": 1024,
            }
        ],
        devices=[{"source": "catalog", "id": "h100-sxm5-80gb"}],
        latency_target={"prompt_tokens": 1000, "output_tokens": 100},
    )
    lay = answer.gpus[0].layouts[0]
    assert lay.latency is not None and lay.latency.memory_max_batch == 0
    assert any("exceeds max_model_len (1024)" in w for w in lay.warnings)


@pytest.mark.parametrize("kind", ["training", "vision"])
def test_latency_target_on_other_workloads_is_refused_by_the_declared_rule(kind):
    model = {"source": "preset", "id": "llama-3.1-8b"}
    body = {
        "workloads": [{"kind": kind, "model": model}],
        "latency_target": {"time_per_output_token_ms": 20},
    }
    with pytest.raises(
        msgspec.ValidationError,
        match="a latency target applies to inference and llm_serving workloads only",
    ):
        msgspec.convert(body, FitRequest)


def test_newly_rated_gpus_estimate_with_their_catalog_rates():
    """AMD and Blackwell layouts get an estimate from their own entries (MI300X: AMD's dense
    1307.4 TFLOPS, not the 2x sparse figure; MI250X: one GCD); a format a card has no rate for
    still answers null with the warning (bf16 on an RX 7900 XTX: only its FP16 rate is sourced)."""
    expected = {
        "mi300x-192gb": (13074 * 10**11, 5300 * 10**9),
        "mi250x-64gb-gcd": (1915 * 10**11, 1640 * 10**9),
        "b200-180gb": (2250 * 10**12, 7700 * 10**9),
    }
    for gpu_id, (peak, bandwidth) in expected.items():
        answer = _fit(
            workloads=[INFER],
            devices=[{"source": "catalog", "id": gpu_id}],
            device_counts=[1],
            latency_target={"time_per_output_token_ms": 50},
        )
        est = answer.gpus[0].layouts[0].latency
        assert est is not None, gpu_id
        assert (est.compute_format, est.peak_flops) == ("bf16", peak), gpu_id
        assert est.memory_bandwidth_bytes_per_s == bandwidth, gpu_id
    fp16 = {**INFER, "precision": {"weights": "fp16", "compute": "fp16"}}
    v100 = _fit(
        workloads=[fp16],
        devices=[{"source": "catalog", "id": "v100-sxm2-32gb"}],
        device_counts=[1],
        software={"torch_version": "2.10.0+cu128"},  # CUDA 13 builds no longer target sm70
        latency_target={"time_per_output_token_ms": 50},
    )
    est = v100.gpus[0].layouts[0].latency
    assert est is not None and (est.compute_format, est.peak_flops) == ("fp16", 125 * 10**12)
    xtx = _fit(
        workloads=[INFER],
        devices=[{"source": "catalog", "id": "radeon-rx-7900-xtx-24gb"}],
        device_counts=[1],
        latency_target={"time_per_output_token_ms": 50},
    )
    lay = xtx.gpus[0].layouts[0]
    assert lay.latency is None  # its bf16 rate is not sourced: no guess
    assert any("no latency estimate" in w for w in lay.warnings)
