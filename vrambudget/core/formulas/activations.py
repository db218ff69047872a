"""Activations: training's tensors saved for backward, inference's working set of one forward
pass -- per layer on one device, itemized tensor by tensor, and over a pipeline stage.

Shown in answers::

    training: tensors saved for backward per layer x layers x micro-batches in flight;
    inference: residual + max(attention, MLP) working set of one forward pass

Worked number: GPT layer, s = 2048, b = 1, h = 4096, a = 32 heads, bf16, eager attention without
recomputation saves ``s*b*h*(34 + 5*a*s/h)`` = 2048 x 4096 x (34 + 5 x 32 x 2048 / 4096) =
956,301,312 B (Korthikanti et al. 2022, Table 2; tests/core/test_golden.py checks the identity).

Training counts the tensors autograd saves for backward (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", §4.1): with a GPT layer, 2-byte
activations, 1-byte dropout masks and unfused attention this itemization sums to exactly
``s*b*h*(34 + 5*a*s/h)`` bytes, and with tensor parallelism to
``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` (Table 2) -- a test checks both. The same items generalize to
gated MLPs (4 saved tensors of the intermediate width), GQA, QK-norm, sandwich norms, MoE and
flash attention (which saves Q, K, V, the output and an fp32 log-sum-exp per row instead of the
s^2 score matrix; Dao et al. 2022 §3.1).

Inference counts the transient working set of one no-grad forward pass: the residual stream and
its normalized copy plus the larger of the attention or MLP sublayer's live intermediates.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..arch import Arch, LayerType, Role
from ..dtypes import bytes_of
from ..layout import Stage, kv_heads_per_device, per_device_shape
from ..spec import LoRA, TrainingWorkload
from ..units import ceil_div

__all__ = [
    "FORMULA",
    "FULL_TRAINING",
    "SOURCE",
    "DeviceDims",
    "Trainable",
    "device_dims",
    "in_flight",
    "inference_activations",
    "inference_working_set",
    "lora_trainable",
    "training_activations",
    "training_saved",
]

FORMULA = (
    "training: tensors saved for backward per layer x layers x micro-batches in flight; "
    "inference: residual + max(attention, MLP) working set of one forward pass"
)
SOURCE = "Korthikanti et al. 2022 §4 (Table 2); Dao et al. 2022 §3 (flash attention)"

FP32 = 4
MASK = 1  # dropout masks are kept as bytes (torch bool / uint8)


@dataclass(frozen=True, slots=True)
class DeviceDims:
    """Per-device widths under tensor parallelism t and expert parallelism ep."""

    h: int
    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    f: int
    vocab: int
    vocab_full: int
    experts: int
    top_k: int
    f_expert: int
    f_shared: int
    ep: int
    t: int


@dataclass(frozen=True, slots=True)
class Trainable:
    """Which saved inputs a layer's backward needs when some projections are frozen (LoRA): a
    frozen linear layer needs only its weight for the input gradient, so its input is saved only
    if another consumer saves it. PEFT casts each adapted projection's input to the adapter dtype
    (``LoraLayer._cast_input_dtype``) and saves that copy and lora_A's output."""

    qkv_input: bool = True
    mlp_input: bool = True
    mlp_output_input: bool = True
    """The input of the MLP's output projection (the gated product, or the GELU output)."""
    attention_output: bool = True
    """The attention output as the output projection's input (flash saves it regardless)."""
    lora_bytes_per_token: int = 0


FULL_TRAINING = Trainable()

# Projections by the tensor they read (full names of the families' tensor inventories).
_QKV_CONSUMERS = frozenset(
    {
        "q_proj",
        "k_proj",
        "v_proj",
        "q_a_proj",
        "kv_a_proj_with_mqa",
        "attn.c_attn",
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
    }
)
_MLP_IN = frozenset({"gate_proj", "up_proj", "mlp.c_fc", "fc1", "intermediate.dense"})
_MLP_OUT = frozenset({"down_proj", "mlp.c_proj", "fc2", "output.dense"})
_ATTN_OUT = frozenset({"o_proj", "attn.c_proj", "attention.output.dense"})


@lru_cache(maxsize=4096)
def lora_trainable(
    layer: LayerType,
    arch: Arch,
    t: int,
    targets: tuple[str, ...],
    rank: int,
    adapter_bytes: int,
    e: int,
) -> Trainable:
    """``Trainable`` of one layer kind under LoRA on ``targets`` (dense layers; routed experts
    are counted as fully saved). Cached: the fit solver asks once per evaluation."""
    adapted = [
        g for g in layer.tensors if g.name.rsplit(".", 1)[-1] in targets and g.role is Role.LINEAR
    ]
    names = {g.name for g in adapted}
    same = adapter_bytes == e  # the cast is a no-op: the adapter saves the base input itself
    per_token = 0
    for g in adapted:
        _, cols, _ = per_device_shape(g, arch, t, 1)
        per_token += rank * adapter_bytes + (0 if same else cols * adapter_bytes)
    return Trainable(
        qkv_input=same and bool(names & _QKV_CONSUMERS),
        mlp_input=layer.moe or (same and bool(names & _MLP_IN)),
        mlp_output_input=layer.moe or (same and bool(names & _MLP_OUT)),
        attention_output=same and bool(names & _ATTN_OUT),
        lora_bytes_per_token=per_token,
    )


def device_dims(arch: Arch, t: int, ep: int) -> DeviceDims:
    moe = arch.moe
    v_head = arch.mla.v_head_dim if arch.mla else arch.head_dim
    return DeviceDims(
        h=arch.hidden_size,
        heads=arch.num_heads // t,
        kv_heads=arch.num_heads // t if arch.mla else kv_heads_per_device(arch, t),
        qk_head_dim=arch.head_dim,
        v_head_dim=v_head,
        f=ceil_div(arch.intermediate_size, t),
        vocab=ceil_div(arch.vocab_size, t),
        vocab_full=arch.vocab_size,
        experts=(moe.num_experts // ep) if moe else 0,
        top_k=moe.experts_per_token if moe else 0,
        f_expert=(
            moe.expert_intermediate_size if ep > 1 else ceil_div(moe.expert_intermediate_size, t)
        )
        if moe
        else 0,
        f_shared=ceil_div(moe.shared_intermediate_size, t) if moe else 0,
        ep=ep,
        t=t,
    )


def _mlp_saved(
    layer: LayerType, arch: Arch, dd: DeviceDims, tokens: int, e: int, output_input: bool = True
) -> int:
    """Split (per-device) MLP tensors saved for backward: gate, up, activation (and their
    product, the output projection's input, when that projection is trained); GELU MLPs the
    first projection's output (and the GELU output)."""
    if not layer.moe:
        per_token = (3 if arch.mlp == "gated" else 1) * dd.f
        if output_input:
            per_token += dd.f
        return tokens * per_token * e
    routed = ceil_div(tokens * dd.top_k, dd.ep)
    saved = routed * 4 * dd.f_expert * e  # gate, up, act, product of each routed copy
    saved += routed * 2 * dd.h * e  # gathered expert inputs, expert outputs (for routing grads)
    saved += tokens * 4 * dd.f_shared * e
    return saved


def training_saved(
    layer: LayerType,
    arch: Arch,
    dd: DeviceDims,
    *,
    seq: int,
    batch: int,
    e: int,
    attention: str,
    dropout: bool,
    sequence_parallel: bool,
    drop_scores: bool,
    trainable: Trainable = FULL_TRAINING,
) -> dict[str, int]:
    """Bytes saved for backward by one layer for one micro-batch, by item.

    ``drop_scores`` is selective recomputation: the s^2 attention-core tensors are recomputed
    instead of stored (Korthikanti §5). Eager attention follows ``transformers``
    ``eager_attention_forward``: the softmax runs in fp32 and is cast back, so the fp32
    probabilities (saved by softmax's backward) and their low-precision copy (saved by the
    matmul with V) are both kept -- 4 + e bytes per score, not Korthikanti's 2.
    """
    s, b, h = seq, batch, dd.h
    tokens = s * b
    rep_div = dd.t if sequence_parallel else 1
    hidden = ceil_div(tokens * h * e, rep_div)  # one hidden-sized tensor, replicated unless SP
    mask = ceil_div(tokens * h * MASK, rep_div) if dropout else 0
    heads = dd.heads
    eager = attention == "eager"
    kv_saved = heads if (eager or arch.mla) else dd.kv_heads  # HF eager repeats K/V per q head
    window = layer.window
    keys = min(s, window) if window else s
    tr = trainable
    attention_output = tr.attention_output or not eager
    items = {
        "norm inputs": hidden * (4 if arch.sandwich_norms else 2),
        "qkv input": hidden if tr.qkv_input else 0,
        "q": tokens * heads * dd.qk_head_dim * e,
        "k": tokens * kv_saved * dd.qk_head_dim * e,
        "v": tokens * kv_saved * dd.v_head_dim * e,
        "attention output": tokens * heads * dd.v_head_dim * e if attention_output else 0,
        "attention dropout mask": mask,
        "mlp input": hidden if tr.mlp_input else 0,
        "mlp intermediates": _mlp_saved(layer, arch, dd, tokens, e, tr.mlp_output_input),
        "mlp dropout mask": mask,
    }
    if tr.lora_bytes_per_token:
        items["LoRA inputs in the adapter dtype, lora_A outputs"] = tokens * tr.lora_bytes_per_token
    if arch.qk_norm:
        items["qk-norm inputs"] = tokens * (heads + dd.kv_heads) * dd.qk_head_dim * e
    if layer.moe:
        items["router logits"] = tokens * (arch.moe.num_experts if arch.moe else 0) * e
    if eager:
        scores = b * heads * s * keys
        softmax = FP32 + (e if e != FP32 else 0)
        items["softmax output (fp32 and its cast)"] = 0 if drop_scores else scores * softmax
        if dropout and not drop_scores:
            items["score dropout mask"] = scores * MASK
            items["score dropout output"] = scores * e
    else:
        items["log-sum-exp"] = b * heads * s * FP32
    return items


def inference_working_set(
    layer: LayerType,
    arch: Arch,
    dd: DeviceDims,
    sequences: int,
    query_tokens: int,
    key_tokens: int,
    e: int,
    attention: str,
) -> int:
    """Peak live bytes of one no-grad layer forward: residual in and out, normalized input and
    sublayer output, plus the larger sublayer (attention: Q, K, V, output, and the s_q x s_kv
    scores and probabilities when eager;
    MLP: gate, up and activation outputs, or fc1 and GELU outputs)."""
    T = sequences * query_tokens
    # The residual stream in and out, the normalized input and the sublayer's output are live
    # around each sublayer (checked against the trace tier's oracle grid).
    resid = 4 * T * dd.h * e
    heads, qk, v = dd.heads, dd.qk_head_dim, dd.v_head_dim
    # Eager attention repeats K/V per query head (transformers repeat_kv), as in training.
    kv_live = heads if attention == "eager" else dd.kv_heads
    attn = T * (heads * (qk + v) + kv_live * (qk + v)) * e
    keys = min(key_tokens, layer.window) if layer.window else key_tokens
    if attention == "eager":
        # Scores, softmax's fp32 copy of them and its fp32 output (transformers eager path).
        live = e + FP32 + (FP32 if e != FP32 else 0)
        attn += sequences * heads * query_tokens * keys * live
    else:
        attn += sequences * heads * query_tokens * FP32
    if layer.moe:
        routed = ceil_div(T * dd.top_k, dd.ep)
        mlp = T * (arch.moe.num_experts if arch.moe else 0) * (e + FP32)
        mlp += routed * (3 * dd.f_expert + 2 * dd.h) * e + 3 * T * dd.f_shared * e
    else:
        mlp = T * (3 if arch.mlp == "gated" else 2) * dd.f * e
    return resid + max(attn, mlp)


def inference_activations(
    layer_kinds: tuple[tuple[LayerType, int], ...],
    arch: Arch,
    dd: DeviceDims,
    sequences: int,
    query: int,
    keys: int,
    e: int,
    attention: str,
) -> int:
    """The largest working set over a stage's layer kinds (layers run one at a time)."""
    peak = 0
    for layer, _ in layer_kinds:
        ws = inference_working_set(layer, arch, dd, sequences, query, keys, e, attention)
        if ws > peak:
            peak = ws
    return peak


def in_flight(
    pipeline: int, micro_batches: int, schedule: str, virtual_stages: int, stage: int
) -> tuple[int, float]:
    """Micro-batches whose activations a pipeline stage holds at once, and the interleaving
    factor: GPipe holds all ``m``; 1F1B ``min(p - stage, m)``; interleaved 1F1B the same times
    ``1 + (p - 1) / (p x v)`` (Narayanan et al. 2021 §2.2; Korthikanti et al. 2022 §4.2.3).
    Worked number: p = 4, m = 8, 1F1B, stage 0 holds 4 micro-batches."""
    p, m = pipeline, micro_batches
    if p == 1:
        return 1, 1.0
    if schedule == "gpipe":
        return m, 1.0
    count = min(p - stage, m)
    if schedule == "interleaved_1f1b" and virtual_stages > 1:
        return count, 1.0 + (p - 1) / (p * virtual_stages)
    return count, 1.0


def training_activations(
    w: TrainingWorkload, arch: Arch, stage: Stage, dd: DeviceDims
) -> tuple[int, int, list[tuple[str, int]]]:
    """(all saved activations of a pipeline stage, one layer's saved activations, itemized
    parts): per layer kind the tensors saved for backward (``training_saved``; with full
    recomputation only the layer input, plus one layer recomputed in backward), times the
    micro-batches in flight (``in_flight``), plus the final norm and LM-head inputs on the last
    stage and the embedding dropout mask on the first."""
    e = bytes_of(w.precision.compute)
    par = w.parallelism
    s, b = w.sequence_length, w.micro_batch_size
    ckpt = w.checkpointing
    per_layer_total = 0
    one_layer = 0
    items: dict[str, int] = {}
    m = w.method
    for layer, n in stage.layer_runs:
        tr = FULL_TRAINING
        if isinstance(m, LoRA):
            tr = lora_trainable(
                layer,
                arch,
                par.tensor,
                tuple(m.target_modules),
                m.rank,
                bytes_of(m.adapter_dtype),
                e,
            )
        saved = training_saved(
            layer,
            arch,
            dd,
            seq=s,
            batch=b,
            e=e,
            attention=w.attention,
            dropout=w.dropout,
            sequence_parallel=par.sequence_parallel,
            drop_scores=ckpt == "selective",
            trainable=tr,
        )
        layer_bytes = sum(saved.values())
        one_layer = max(
            one_layer,
            sum(
                training_saved(
                    layer,
                    arch,
                    dd,
                    seq=s,
                    batch=b,
                    e=e,
                    attention=w.attention,
                    dropout=w.dropout,
                    sequence_parallel=par.sequence_parallel,
                    drop_scores=False,
                    trainable=tr,
                ).values()
            ),
        )
        if ckpt == "full":
            kept = ceil_div(
                s * b * arch.hidden_size * e, par.tensor if par.sequence_parallel else 1
            )
            per_layer_total += kept * n
            items["layer inputs (full recomputation)"] = (
                items.get("layer inputs (full recomputation)", 0) + kept * n
            )
        else:
            per_layer_total += layer_bytes * n
            for k, v in saved.items():
                items[k] = items.get(k, 0) + v * n
    count, factor = in_flight(
        par.pipeline,
        w.gradient_accumulation_steps,
        par.pipeline_schedule,
        par.virtual_stages,
        stage.index,
    )
    total = int(per_layer_total * count * factor)
    parts = [(k, int(v * count * factor)) for k, v in items.items() if v]
    if ckpt == "full":
        total += one_layer  # the layer being recomputed during backward
        parts.append(("one layer recomputed in backward", one_layer))
    if stage.last and arch.kind == "decoder":
        head_inputs = 2 * s * b * arch.hidden_size * e  # final norm input, LM head input
        total += head_inputs
        parts.append(("final norm and LM-head inputs", head_inputs))
    if stage.first and w.dropout:
        mask = s * b * arch.hidden_size
        total += mask
        parts.append(("embedding dropout mask", mask))
    if count > 1 or factor != 1.0:
        parts.append(
            (
                f"x {count} micro-batches in flight"
                + (f" x {factor:.4f} interleaving" if factor != 1.0 else ""),
                0,
            )
        )
    return total, one_layer, parts
