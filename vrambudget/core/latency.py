"""The latency estimate of a fit's layout: the roofline (:mod:`vrambudget.core.roofline`) over
the model's work per device and the GPU's peaks (:mod:`vrambudget.core.gpu_perf`), the largest
batch that meets a latency target, and the cost per million output tokens at that batch.

The fits (``budget.fit`` for inference workloads, ``serving.fit`` for vLLM) hand in what only
they know: the weights bytes each device reads (their budget's weights and quantization
metadata, summed over pipeline stages), the KV element size, the memory-limited batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arch import Arch, Role
from .formulas.kv_cache import elems_per_token
from .gpu_perf import GPUPerf, MathFormat
from .result import CostRank, GPUFit, LatencyEstimate
from .roofline import ModelCost, Rates, decode_step, largest_batch, prefill_step
from .spec import LatencyTarget

__all__ = [
    "DEFAULT_OUTPUT_TOKENS",
    "DEFAULT_PROMPT_TOKENS",
    "Point",
    "compute_format",
    "cost_ranking",
    "estimate",
    "matmul_params",
    "model_cost",
    "price_of",
    "unknown_warning",
]

DEFAULT_PROMPT_TOKENS = 1024
"""``llm_serving`` prompt length when the target names none (a serving workload has no prompt
length of its own; vLLM's ``benchmark_serving --random-input-len`` default is 1024)."""
DEFAULT_OUTPUT_TOKENS = 256
"""``llm_serving`` output length when the target names none."""

_BATCH_LIMIT = 1 << 20
"""Largest batch the latency search tries (far above any engine's max_num_seqs)."""


def matmul_params(arch: Arch) -> int:
    """Parameters multiplied per token: every layer's projections (routed experts at
    ``experts_per_token / num_experts`` of theirs), the output head (the embedding matrix when
    tied); embedding lookups and vision towers do no matmul for a text token.

    Worked number: Llama 3.1 8B: 8,030,261,248 parameters - 525,336,576 input embedding =
    7,504,924,672 (the untied lm_head counted)."""
    total = 0
    for layer, count in arch.layer_runs:
        per_layer = 0
        for t in layer.tensors:
            if t.role is Role.VISION:
                continue
            if t.role is Role.EXPERT and arch.moe is not None:
                per_layer += t.num_params * arch.moe.experts_per_token // arch.moe.num_experts
            else:
                per_layer += t.num_params
        total += per_layer * count
    total += sum(t.num_params for t in arch.head if t.role is not Role.VISION)
    if arch.tie_word_embeddings and not arch.head:
        total += arch.vocab_size * arch.hidden_size
    return total


def model_cost(
    arch: Arch, tensor: int, weight_bytes: int, kv_elem_bytes: int, act_bytes: int = 2
) -> ModelCost:
    """One replica's per-device work: ``weight_bytes`` as the fit's budget counts them, the
    KV bytes per token (``elems_per_token x layers x bytes``), ``2 x matmul params / t`` and
    ``4 x layers x heads x head_dim / t`` FLOPs, and two all-reduces of ``hidden x act_bytes``
    per layer and token when ``t > 1``."""
    return ModelCost(
        weight_bytes=weight_bytes,
        kv_bytes_per_token=elems_per_token(arch, tensor) * arch.num_layers * kv_elem_bytes,
        linear_flops_per_token=2 * matmul_params(arch) // tensor,
        attention_flops_per_position=4 * arch.num_layers * arch.num_heads * arch.head_dim // tensor,
        allreduce_bytes_per_token=(
            2 * arch.num_layers * arch.hidden_size * act_bytes if tensor > 1 else 0
        ),
        tensor=tensor,
    )


def compute_format(compute_dtype: str, fp8_weights: bool, perf: GPUPerf) -> MathFormat:
    """The format the GEMMs run in: fp8 when the weights are fp8 and the device has fp8 tensor
    cores (W8A8, vLLM's fp8 path), else the compute dtype (weight-only quantizations, and fp8
    on Ampere through Marlin, dequantize into it)."""
    if fp8_weights and perf.peak_flops("fp8") is not None:
        return "fp8"
    if compute_dtype in ("fp16", "float16"):
        return "fp16"
    if compute_dtype in ("fp32", "float32"):
        return "fp32"
    return "bf16"


@dataclass(frozen=True, slots=True)
class Point:
    """The lengths a layout's estimate is for."""

    prompt_tokens: int
    output_tokens: int


def estimate(
    perf: GPUPerf,
    fmt: MathFormat,
    cost: ModelCost,
    target: LatencyTarget,
    point: Point,
    memory_max_batch: int,
    price_per_device_hour: float | None,
    device_count: int,
) -> LatencyEstimate | None:
    """The layout's estimate at the operating point ``min(memory max, latency max)``; None when
    the GPU's peak for ``fmt`` is unknown."""
    peak = perf.peak_flops(fmt)
    if peak is None:
        return None
    rates = Rates(
        peak_flops=peak,
        bandwidth_bytes_per_s=perf.memory_bandwidth_bytes_per_s,
        mfu=target.mfu,
        mbu=target.mbu,
    )
    context = point.prompt_tokens + point.output_tokens
    ttft_s = prefill_step(cost, rates, point.prompt_tokens).seconds
    latency_max: int | None = None
    if target.time_per_output_token_ms is not None:
        latency_max = largest_batch(
            cost, rates, context, target.time_per_output_token_ms / 1000.0, _BATCH_LIMIT
        )
    batch = memory_max_batch if latency_max is None else min(memory_max_batch, latency_max)
    limited_by = "memory"
    if latency_max is not None and latency_max < memory_max_batch:
        limited_by = "time_per_output_token"
    ttft_ok = target.time_to_first_token_ms is None or ttft_s * 1000.0 <= (
        target.time_to_first_token_ms
    )
    if not ttft_ok:
        batch, limited_by = 0, "time_to_first_token"
    step = decode_step(cost, rates, max(batch, 1), context)
    tps = batch / step.seconds if batch else 0.0
    cost_per_m = None
    if price_per_device_hour is not None and tps > 0:
        cost_per_m = price_per_device_hour * device_count / (tps * 3600.0) * 1e6
    return LatencyEstimate(
        compute_format=fmt,
        peak_flops=peak,
        memory_bandwidth_bytes_per_s=perf.memory_bandwidth_bytes_per_s,
        mfu=target.mfu,
        mbu=target.mbu,
        prompt_tokens=point.prompt_tokens,
        output_tokens=point.output_tokens,
        time_to_first_token_ms=round(ttft_s * 1000.0, 4),
        memory_max_batch=memory_max_batch,
        latency_max_batch=latency_max,
        batch=batch,
        limited_by=limited_by,  # type: ignore[arg-type]
        time_per_output_token_ms=round(step.seconds * 1000.0, 4),
        output_tokens_per_s=round(tps, 4),
        decode_bound=step.bound,
        meets_targets=batch > 0,
        all_reduce="not_counted" if cost.tensor > 1 else "not_needed",
        cost_per_million_output_tokens=round(cost_per_m, 6) if cost_per_m is not None else None,
    )


def price_of(prices: dict[str, float] | None, gpu_id: str | None, name: str) -> float | None:
    """A device's price by catalog id, else by its name (custom devices)."""
    if prices is None:
        return None
    price = prices.get(gpu_id) if gpu_id is not None else None
    return price if price is not None else prices.get(name)


def cost_ranking(
    results: tuple[GPUFit, ...] | list[GPUFit], prices: dict[str, float] | None
) -> tuple[CostRank, ...]:
    """Layouts that fit, meet the targets and have a price, cheapest per million output
    tokens first (ties: fewer devices, then the name)."""
    ranks = []
    for g in results:
        price = price_of(prices, g.gpu_id, g.name)
        for lay in g.layouts:
            est = lay.latency
            if price is None or not lay.fits or est is None:
                continue
            if est.cost_per_million_output_tokens is None:
                continue
            ranks.append(
                CostRank(
                    gpu_id=g.gpu_id,
                    name=g.name,
                    device_count=lay.device_count,
                    price_per_device_hour=price,
                    batch=est.batch,
                    output_tokens_per_s=est.output_tokens_per_s,
                    cost_per_million_output_tokens=est.cost_per_million_output_tokens,
                )
            )
    ranks.sort(key=lambda r: (r.cost_per_million_output_tokens, r.device_count, r.name))
    return tuple(ranks)


def unknown_warning(name: str) -> str:
    """Why a layout has no latency estimate: the catalog lacks the GPU's rates, or its peak for
    the format the workload computes in (a bf16 workload on a GPU without bf16)."""
    return (
        "no latency estimate: the catalog has no cited peak FLOP/s and bandwidth for this GPU "
        f"and the workload's compute format ({name})"
    )
