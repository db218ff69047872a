"""A roofline estimate of LLM inference time: prefill (time to first token) and decode (time
per output token, tokens/s) of one model replica from the device's peak FLOP/s and memory
bandwidth. An estimate with stated assumptions, not a measurement: docs/LATENCY.md gives the
formulas, the efficiency factors and the error measured against published runs.

Every step of a transformer's forward pass reads its weights once and the KV cache of every
sequence in the batch, and does ``2 x matmul params`` FLOPs per token plus attention over the
context (Kaplan et al. 2020, Table 1; PaLM, Chowdhery et al. 2022, App. B: ``6N + 12 L H Q T``
per trained token, of which the forward pass is one third, ``2N + 4 L H Q T``). A step takes
the longer of its memory time and its compute time (Williams et al. 2009, the roofline)::

    memory_s  = (weight_bytes + batch x context x kv_bytes_per_token) / (bandwidth x MBU)
    compute_s = batch x (linear_flops_per_token + attention_flops_per_position x context)
                / (peak_flops x MFU)
    step_s    = max(memory_s, compute_s) [+ all-reduce time, when the link rate is known]

Decode makes one token per sequence per step (time per output token = step_s, tokens/s =
batch / step_s); prefill processes the prompt's tokens in one step with causal attention
(``attention x P (P + 1) / 2`` FLOPs per sequence), which gives the time to first token.

Tensor parallelism divides weights, KV cache and FLOPs by the degree (``ModelCost`` is per
device); pipeline stages run one after another for one token, so a pipelined replica's step
is the sum over its stages: the per-device quantities are summed over stages. Each tensor-
parallel layer all-reduces its activations twice (Megatron-LM, Shoeybi et al. 2019, §3): a
ring all-reduce moves ``2 (t - 1) / t x bytes`` per device (Patarasuk & Yuan 2009); counted
only when the link rate is given.

Not modelled: kernel launch and scheduling overheads (inside MBU/MFU), overlap of prefill
and decode in continuous batching, speculative decoding, MoE routing imbalance (an MoE
step reads every expert's weights: exact at large batch, an overestimate at batch 1),
sliding-window caps on the KV read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .search import largest_true

__all__ = [
    "MBU_DEFAULT",
    "MFU_DEFAULT",
    "ModelCost",
    "Rates",
    "Step",
    "decode_step",
    "largest_batch",
    "prefill_step",
]

MBU_DEFAULT = 0.7
"""Model bandwidth utilization assumed for decode: the share of the datasheet bandwidth a
serving stack reaches. "Real systems land around 60 to 85 percent" (rule of thumb,
https://www.open-source-ai.tech/glossary/model-bandwidth-utilization); the published
batch-1 runs in research/data/latency_measurements.json reach 0.51 .. 0.82 (docs/LATENCY.md)."""

MFU_DEFAULT = 0.5
"""Model FLOPs utilization assumed for prefill: PaLM 540B trained at 46.2% MFU (Chowdhery et
al. 2022, Table 3), a large dense GEMM workload like prefill."""


@dataclass(frozen=True, slots=True)
class Rates:
    """A device's peaks and the efficiency assumed against them."""

    peak_flops: int
    """Dense peak FLOP/s of the format the GEMMs run in."""
    bandwidth_bytes_per_s: int
    mfu: float = MFU_DEFAULT
    mbu: float = MBU_DEFAULT
    link_bytes_per_s: int | None = None
    """Per-device interconnect rate for the tensor-parallel all-reduce; None: not counted."""


@dataclass(frozen=True, slots=True)
class ModelCost:
    """One replica's work per device of its tensor-parallel group, summed over pipeline
    stages (one token passes every stage in turn)."""

    weight_bytes: int
    """Weights (with quantization metadata) read once per forward step."""
    kv_bytes_per_token: int
    """K and V bytes one cached token takes on the device, over all layers."""
    linear_flops_per_token: int
    """``2 x matmul parameters / tensor``: every weight multiplies once per token."""
    attention_flops_per_position: int
    """``4 x layers x heads x head_dim / tensor``: QK^T and AV per token per context position."""
    allreduce_bytes_per_token: int = 0
    """``2 x layers x hidden x activation bytes`` when tensor > 1 (two all-reduces a layer)."""
    tensor: int = 1


@dataclass(frozen=True, slots=True)
class Step:
    """One forward step: its time and what bounds it."""

    seconds: float
    memory_seconds: float
    compute_seconds: float
    allreduce_seconds: float
    bound: Literal["memory", "compute"]


def _allreduce_seconds(cost: ModelCost, rates: Rates, tokens: int) -> float:
    """Ring all-reduce: ``2 (t - 1) / t x bytes`` per device over the link."""
    if cost.tensor <= 1 or rates.link_bytes_per_s is None:
        return 0.0
    moved = 2 * (cost.tensor - 1) * tokens * cost.allreduce_bytes_per_token / cost.tensor
    return moved / rates.link_bytes_per_s


def _step(cost: ModelCost, rates: Rates, read_bytes: int, flops: int, tokens: int) -> Step:
    memory_s = read_bytes / (rates.bandwidth_bytes_per_s * rates.mbu)
    compute_s = flops / (rates.peak_flops * rates.mfu)
    comm_s = _allreduce_seconds(cost, rates, tokens)
    return Step(
        seconds=max(memory_s, compute_s) + comm_s,
        memory_seconds=memory_s,
        compute_seconds=compute_s,
        allreduce_seconds=comm_s,
        bound="memory" if memory_s >= compute_s else "compute",
    )


def decode_step(cost: ModelCost, rates: Rates, batch: int, context: int) -> Step:
    """One decode step of ``batch`` sequences each holding ``context`` tokens: the time per
    output token. Worked number: 16 GB of weights on a 3.35 TB/s GPU at MBU 0.7, batch 1,
    no context: 16e9 / (3.35e12 x 0.7) = 6.82 ms (147 tokens/s)."""
    read = cost.weight_bytes + batch * context * cost.kv_bytes_per_token
    flops = batch * (cost.linear_flops_per_token + cost.attention_flops_per_position * context)
    return _step(cost, rates, read, flops, batch)


def prefill_step(cost: ModelCost, rates: Rates, prompt_tokens: int, batch: int = 1) -> Step:
    """Prefill of ``batch`` prompts of ``prompt_tokens`` (causal attention: position i attends
    to i + 1 tokens): the time to first token. Reads the weights once and writes the prompt's
    KV cache."""
    p = prompt_tokens
    read = cost.weight_bytes + batch * p * cost.kv_bytes_per_token
    flops = batch * (
        p * cost.linear_flops_per_token + cost.attention_flops_per_position * p * (p + 1) // 2
    )
    return _step(cost, rates, read, flops, batch * p)


def largest_batch(
    cost: ModelCost, rates: Rates, context: int, step_seconds: float, limit: int
) -> int:
    """Largest batch in [1, limit] whose decode step at ``context`` takes at most
    ``step_seconds``; 0 when not even one sequence does (the step grows with the batch)."""
    return max(
        largest_true(
            1, limit, lambda b: decode_step(cost, rates, b, context).seconds <= step_seconds
        ),
        0,
    )
