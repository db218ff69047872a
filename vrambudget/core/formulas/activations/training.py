"""Training activations: the tensors autograd saves for backward, per layer kind and over a
pipeline stage with its micro-batches in flight."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Literal

from ...arch import (
    SCORES_MATERIALIZED,
    Arch,
    LayerType,
    Role,
    attention_run,
    lora_target_names,
    lora_targeted,
)
from ...dtypes import bytes_of
from ...layout import Stage, per_device_shape
from ...spec import LoRA, Method, TrainingWorkload
from ...units import ceil_div, round_up
from .dims import FP32, MASK, DeviceDims

__all__ = [
    "ACTIVATION_PART",
    "FULL_TRAINING",
    "MASK_BIAS_PART",
    "MATH_PROBABILITIES_PART",
    "MODEL_CODE_ACTIVATIONS",
    "OFFLOADED_BACK_PART",
    "POW_UPCAST_ACTIVATIONS",
    "RmsNorm",
    "Trainable",
    "activation_extra_bytes",
    "eager_softmax_backward_bytes",
    "eager_softmax_fp32",
    "in_flight",
    "layer_input_bytes",
    "lora_layer_trainable",
    "lora_trainable",
    "norm_saved_bytes",
    "norms_per_layer",
    "offloaded_inputs_bytes",
    "saved_scores_bytes",
    "shares_one_norm",
    "training_activations",
    "training_saved",
    "unsloth_covers",
    "unsloth_patched",
    "unsloth_recompute",
    "unsloth_runs",
    "unsloth_trainable",
]


RmsNorm = Literal["upcast", "upcast_fp32_normed", "fused"]
"""What an RMSNorm keeps for backward: ``upcast`` its input in fp32 (and, when its weight is
trained, the normalized tensor in the compute dtype: transformers' ``LlamaRMSNorm``);
``upcast_fp32_normed`` the same with the normalized tensor in fp32 (LitGPT >= 0.4.6, torchtune
>= 0.5); ``fused`` its input in its own dtype and a per-token rstd (Liger, Unsloth, the built-in
builders' ``F.rms_norm``). The sources are in ``vrambudget.core.stack``'s behaviours."""


_FP32_NORMED_FAMILIES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
"""transformers' Gemma RMSNorm multiplies in fp32 (``output * (1.0 + self.weight.float())``,
5.23.0 modeling_gemma2.py lines 57-62): a trained weight keeps the fp32 normalized tensor."""


def norm_saved_bytes(
    norm: RmsNorm, rms: bool, trained: bool, e: int, fp32_normed: bool = False
) -> tuple[int, int]:
    """Bytes per normalized element that one norm keeps for backward: (its input, the
    normalized tensor its trained weight multiplies). LayerNorm (``F.layer_norm``) and a fused
    RMSNorm keep the input in its own dtype and per-token statistics only. ``fp32_normed``:
    the normalized tensor is fp32 whatever the stack's variant (Gemma's norm; an fp32 residual
    stream under autocast, where ``hidden_states.to(input_dtype)`` stays fp32)."""
    if not rms or norm == "fused":
        return e, 0
    fp32 = fp32_normed or norm == "upcast_fp32_normed"
    normed = (FP32 if fp32 else e) if trained else 0
    return max(FP32, e), normed


def fp32_normed_of(arch: Arch, mixed_precision: str) -> bool:
    """The normalized tensor a trained RMSNorm weight keeps is fp32 (:func:`norm_saved_bytes`)."""
    return arch.model_type in _FP32_NORMED_FAMILIES or mixed_precision == "autocast"


_ATTENTION_NORMS = frozenset(
    {"q_norm", "k_norm", "q_layernorm", "k_layernorm", "q_a_layernorm", "kv_a_layernorm"}
)
"""Norms inside attention (of q and k, or MLA's latents): some are as wide as the hidden size
(OLMo 2, Cohere's use_qk_norm); none is a layer's norm."""


def norms_per_layer(layer: LayerType, arch: Arch) -> int:
    """Hidden-wide norms a layer applies: 2 (before attention and before the MLP), 4 with
    Gemma 2/3's sandwich norms, 1 where attention and the MLP read one shared norm (parallel
    residual: Falcon-7B, Phi-2, GPT-J)."""
    h = arch.hidden_size
    n = sum(
        g.count
        for g in layer.tensors
        if g.role is Role.NORM
        and g.rows == h
        and g.cols == 1
        and not g.name.endswith(".bias")
        and g.name.rsplit(".", 1)[-1] not in _ATTENTION_NORMS
    )
    return n or (4 if arch.sandwich_norms else 2)


def shares_one_norm(layer: LayerType, arch: Arch, norms: int | None = None) -> bool:
    """Attention and the MLP read one norm's output (a parallel residual with one norm): one
    hidden-wide norm in a layer that has both attention and MLP projections (not a Mamba or
    linear-attention layer). ``norms``: :func:`norms_per_layer`, where the caller has it."""
    if (norms_per_layer(layer, arch) if norms is None else norms) != 1:
        return False
    linear = [g.name for g in layer.tensors if g.role is Role.LINEAR]
    attention = [n for n in linear if "attn" in n or "attention" in n or n in _QKV_CONSUMERS]
    return bool(attention) and len(attention) < len(linear)


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
    norm_weights: bool = True
    """The norms' weights are trained (full fine-tuning; LoRA freezes them)."""
    qkv_subset_bytes_per_token: int = 0
    """LoRA on some but not all of q, k and v: the adapted projections' lora_B outputs (in the
    compute dtype), which a fused QKV layer pads with zeros by ``index_copy_``, whose backward
    keeps its source (LitGPT ``LoRAQKVLinear.zero_pad``)."""
    qkv_dropout_repeats_bytes_per_token: int = 0
    """lora_dropout's copies and masks of the q, k, v input beyond the first: a fused QKV layer
    drops its input out once for all three (LitGPT ``LoRAQKVLinear.forward``)."""


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
_QKV = frozenset({"q_proj", "k_proj", "v_proj"})


@lru_cache(maxsize=4096)
def lora_trainable(
    layer: LayerType,
    arch: Arch,
    t: int,
    targets: tuple[str, ...],
    rank: int,
    adapter_bytes: int,
    e: int,
    dropout: bool = False,
) -> Trainable:
    """``Trainable`` of one layer kind under LoRA on ``targets`` (dense layers; routed experts
    are counted as fully saved). With ``lora_dropout`` each adapter saves its own dropped-out
    copy of the input (adapter dtype) and a 1-byte mask instead of the input itself (PEFT
    ``lora.Linear.forward``: ``lora_B(lora_A(dropout(x)))``; LitGPT ``lora.py``
    ``self.lora_dropout(x) @ self.lora_A``). Cached: the fit solver asks once per evaluation."""
    adapted = [g for g in layer.tensors if g.role is Role.LINEAR and lora_targeted(g, targets)]
    names = {g.name for g in adapted}
    # The cast is a no-op and no dropout: the adapter saves the base input itself.
    same = adapter_bytes == e and not dropout
    per_token = 0
    subset = 0
    repeats = 0
    qkv_seen = False
    for g in adapted:
        rows, cols, _ = per_device_shape(g, arch, t, 1)
        per_token += rank * adapter_bytes + (0 if same else cols * adapter_bytes)
        if dropout:
            per_token += cols * MASK
        if g.name.rsplit(".", 1)[-1] in _QKV:
            subset += rows * e
            if dropout and qkv_seen:
                repeats += cols * (adapter_bytes + MASK)
            qkv_seen = True
    qkv_in_layer = {g.name.rsplit(".", 1)[-1] for g in layer.tensors} & _QKV
    if qkv_in_layer <= {n.rsplit(".", 1)[-1] for n in names}:
        subset = 0  # every one adapted: zero_pad returns its input
    return Trainable(
        qkv_input=same and bool(names & _QKV_CONSUMERS),
        mlp_input=layer.moe or (same and bool(names & _MLP_IN)),
        mlp_output_input=layer.moe or (same and bool(names & _MLP_OUT)),
        attention_output=same and bool(names & _ATTN_OUT),
        lora_bytes_per_token=per_token,
        norm_weights=False,
        qkv_subset_bytes_per_token=subset,
        qkv_dropout_repeats_bytes_per_token=repeats,
    )


_UNSLOTH_GROUPS = (
    ("qkv", frozenset({"q_proj", "k_proj", "v_proj"})),
    ("o", frozenset({"o_proj"})),
    ("mlp", frozenset({"gate_proj", "up_proj", "down_proj"})),
)


@lru_cache(maxsize=1024)
def unsloth_patched(layer: LayerType, arch: Arch, targets: tuple[str, ...]) -> frozenset[str]:
    """The projection groups Unsloth runs through its own autograd functions (``qkv``, ``o``,
    ``mlp``): those whose every projection has an adapter and no bias, on a gated MLP for
    ``mlp`` (unsloth 2024.8 ``models/llama.py`` ``patch_peft_model`` lines 2060-2120, with
    ``lora_dropout == 0`` and ``bias == "none"``; the caller checks the dropout)."""
    names = _linear_names(layer)
    # a bias is named after its projection, in full where the framework's inventory names it
    # (``self_attn.q_proj.bias``) or short (``q_proj.bias``)
    biased = {
        g.name.removesuffix(".bias").rsplit(".", 1)[-1]
        for g in layer.tensors
        if g.role is Role.BIAS
    }
    out = set()
    for group, members in _UNSLOTH_GROUPS:
        if group == "mlp" and (arch.mlp != "gated" or layer.moe):
            continue
        if members <= names and members <= set(targets) and not (members & biased):
            out.add(group)
    return frozenset(out)


def _linear_names(layer: LayerType) -> set[str]:
    """The short names of the layer's projections (``q_proj`` for ``self_attn.q_proj``)."""
    return {g.name.rsplit(".", 1)[-1] for g in layer.tensors if g.role is Role.LINEAR}


def _unsloth_members(patched: frozenset[str]) -> set[str]:
    """The projections of the patched groups."""
    return {n for g, ms in _UNSLOTH_GROUPS if g in patched for n in ms}


def unsloth_runs(method: Method, unsloth: bool) -> bool:
    """Whether Unsloth's own LoRA functions run at all: an Unsloth stack and LoRA without
    ``lora_dropout`` (``patch_peft_model`` patches nothing otherwise)."""
    return unsloth and isinstance(method, LoRA) and method.dropout == 0.0


def unsloth_covers(layer: LayerType, arch: Arch, targets: tuple[str, ...]) -> bool:
    """Every adapted projection of the layer runs in one of Unsloth's own functions (none is
    left to PEFT's forward, which casts its input to the adapter dtype)."""
    members = _unsloth_members(unsloth_patched(layer, arch, targets))
    return {t for t in targets if t in _linear_names(layer)} <= members


def unsloth_recompute(method: Method, arch: Arch, stage: Stage, unsloth: bool) -> tuple[bool, bool]:
    """(every adapted projection of the stage runs in Unsloth's functions, every layer's MLP is
    Unsloth's) -- what the recomputed layer's backward depends on
    (:func:`recompute_backward_bytes`: no fp32 input casts; the MLP's gradients in place)."""
    if not (unsloth_runs(method, unsloth) and isinstance(method, LoRA)):
        return False, False
    targets = lora_target_names(method.target_modules, arch)
    layers = [layer for layer, _ in stage.layer_runs]
    covered = all(unsloth_covers(layer, arch, targets) for layer in layers)
    mlp = covered and all("mlp" in unsloth_patched(layer, arch, targets) for layer in layers)
    return covered, mlp


def unsloth_trainable(
    layer: LayerType,
    arch: Arch,
    t: int,
    targets: tuple[str, ...],
    rank: int,
    adapter_bytes: int,
    e: int,
) -> tuple[Trainable, bool]:
    """(``Trainable``, whether the MLP is Unsloth's) of one layer under Unsloth's fast LoRA
    (``lora_dropout`` 0): ``LoRA_QKV`` saves its input once (``save_for_backward(X, QA, QB,
    ...)``), ``LoRA_W`` the o projection's input, ``LoRA_MLP`` its input and the gate and up
    outputs ``e``, ``g`` -- not the activation or their product, which its backward recomputes
    (unsloth 2024.8 ``kernels/fast_lora.py`` lines 85, 244, 363); ``matmul_lora`` casts the
    adapters to the input's dtype, so no adapter-dtype copy of the input is kept. Projections
    outside a patched group run PEFT's forward (:func:`lora_trainable`)."""
    patched = unsloth_patched(layer, arch, targets)
    members = _unsloth_members(patched)
    rest = tuple(x for x in targets if x not in members)
    peft = lora_trainable(layer, arch, t, rest, rank, adapter_bytes, e, False)
    trainable = Trainable(
        qkv_input=peft.qkv_input or "qkv" in patched,
        mlp_input=peft.mlp_input or "mlp" in patched,
        mlp_output_input=peft.mlp_output_input and "mlp" not in patched,
        attention_output=peft.attention_output or "o" in patched,
        lora_bytes_per_token=peft.lora_bytes_per_token,
        norm_weights=False,
        qkv_subset_bytes_per_token=peft.qkv_subset_bytes_per_token,
        qkv_dropout_repeats_bytes_per_token=peft.qkv_dropout_repeats_bytes_per_token,
    )
    return trainable, "mlp" in patched


def lora_layer_trainable(
    layer: LayerType, arch: Arch, t: int, method: LoRA, e: int, unsloth: bool
) -> tuple[Trainable, bool]:
    """(``Trainable``, whether Unsloth's MLP function runs) of one layer under LoRA: Unsloth's
    functions where they run (:func:`unsloth_runs`, :func:`unsloth_trainable`), else PEFT's
    forward (:func:`lora_trainable`)."""
    targets = lora_target_names(method.target_modules, arch)
    ab = bytes_of(method.adapter_dtype or "fp32")  # concrete once deployed (deploy_all)
    if unsloth_runs(method, unsloth):
        return unsloth_trainable(layer, arch, t, targets, method.rank, ab, e)
    return lora_trainable(layer, arch, t, targets, method.rank, ab, e, method.dropout > 0.0), False


ACTIVATION_PART = "MLP activation's own intermediates (composed of elementwise ops)"

MODEL_CODE_ACTIVATIONS: dict[str, int] = {
    # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))): x, 0.5 x, tanh, 1 + tanh
    "gelu_new": 4,
    "gelu_accurate": 4,
    "gelu_python_tanh": 4,
    # 0.5 * x * (1 + tanh(0.7978845608 x (1 + 0.044715 x x)))
    "gelu_fast": 7,
    # x * 0.5 * (1 + erf(x / sqrt 2)): x / sqrt 2, 0.5 x, 1 + erf
    "gelu_python": 3,
    # x * sigmoid(1.702 x): x, the sigmoid
    "quick_gelu": 2,
    # clip(gelu(x), -10, 10): x, gelu(x)
    "gelu_10": 2,
    # sqrt(softplus(x)): x, its output
    "sqrtsoftplus": 2,
    # Apertus' xIELU, transformers' Python fallback without the xielu package
    "xielu": 4,
}
"""transformers' activation modules (``activations.py`` ``ACT2CLS``; 5.23.0, and the 4.x releases
since ``NewGELUActivation`` was added) that are Python compositions of elementwise ops rather
than one kernel: autograd saves each op's operands, so the MLP keeps this many tensors of its
width where ``F.gelu`` / ``F.silu`` keep one (its input). Counted with torch's
``saved_tensors_hooks`` on torch 2.13 (``tests/core/test_activation_functions.py`` recounts
every ``ACT2CLS`` entry on transformers' own modules). GPT-2, GPT-J, GPT-Neo and CodeGen
(``activation_function`` ``gelu_new``) and Phi-1/1.5/2 (``hidden_act`` ``gelu_new``) run them;
LitGPT, torchtune and torch's ``nn.GELU`` do not."""

POW_UPCAST_ACTIVATIONS = frozenset({"gelu_new", "gelu_accurate", "gelu_python_tanh"})
"""Compositions with ``torch.pow``, which CUDA autocast runs in fp32 (torch's AMP op reference,
"CUDA Ops that can autocast to float32"): under bf16/fp16 autocast they save an fp32 copy of
x, the fp32 tanh and 1 + tanh, and 0.5 x in the compute dtype -- 12 + e bytes per element,
where the compute-dtype x they no longer save is e."""


def activation_extra_bytes(arch: Arch, model_code: bool, e: int, autocast: bool) -> int:
    """Bytes per element of the MLP's width that its activation keeps for backward beyond its
    input (counted once, in the compute dtype ``e``, with the MLP's intermediates): 0 for one
    kernel, or where the model code is not transformers' (``model_code`` false); (k - 1) x e for
    a composition of :data:`MODEL_CODE_ACTIVATIONS` keeping k tensors; 12 for the ``pow`` ones
    under CUDA autocast from 16-bit (:data:`POW_UPCAST_ACTIVATIONS`)."""
    if not model_code:
        return 0
    k = MODEL_CODE_ACTIVATIONS.get(arch.activation, 1)
    if k == 1:
        return 0
    if autocast and e < FP32 and arch.activation in POW_UPCAST_ACTIVATIONS:
        return 3 * FP32
    return (k - 1) * e


def _mlp_saved(
    layer: LayerType,
    arch: Arch,
    dd: DeviceDims,
    tokens: int,
    e: int,
    output_input: bool = True,
    fused_swiglu: bool = False,
) -> int:
    """Split (per-device) MLP tensors saved for backward: gate, up, activation (and their
    product, the output projection's input, when that projection is trained); with Liger's
    fused SwiGLU (``fused_swiglu``) gate and up only; GELU MLPs the first projection's output
    (and the GELU output)."""
    if not layer.moe:
        per_token = ((2 if fused_swiglu else 3) if arch.mlp == "gated" else 1) * dd.f
        if output_input:
            per_token += dd.f
        return tokens * per_token * e
    routed = ceil_div(tokens * dd.top_k, dd.ep)
    saved = routed * 4 * dd.f_expert * e  # gate, up, act, product of each routed copy
    saved += routed * 2 * dd.h * e  # gathered expert inputs, expert outputs (for routing grads)
    saved += tokens * 4 * dd.f_shared * e
    return saved


MATH_PROBABILITIES_PART = "attention probabilities (fp32, SDPA's math path)"
MASK_BIAS_PART = "sliding-window mask in the input dtype (saved by SDPA's memory-efficient kernel)"


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
    norm: RmsNorm = "fused",
    fp32_normed: bool = False,
    fused_qkv: bool = False,
    math_mqa: bool = False,
    fused_swiglu: bool = False,
    softmax_fp32: bool = True,
    act_extra: int = 0,
    masked_math: bool = False,
) -> dict[str, int]:
    """Bytes saved for backward by one layer for one micro-batch, by item.

    ``drop_scores`` is selective recomputation: the s^2 attention-core tensors are recomputed
    instead of stored (Korthikanti §5). Eager attention follows ``transformers``
    ``eager_attention_forward``: the softmax runs in fp32 and is cast back, so the fp32
    probabilities (saved by softmax's backward) and their low-precision copy (saved by the
    matmul with V) are both kept -- 4 + e bytes per score, not Korthikanti's 2 -- unless the
    family's softmax runs in the scores' dtype (``softmax_fp32`` false: GPT-2, BERT without
    autocast): e bytes. ``norm``:
    what each RMSNorm keeps (:func:`norm_saved_bytes`, with ``fp32_normed``).

    ``attention`` ``math`` is SDPA's composite path (:func:`vrambudget.core.arch.attention_run`):
    fp32 probabilities, and the fp32 scaled q, scaled keys and values of every query head. A
    sliding-window layer whose sequence reaches its window gets a mask from transformers and the
    memory-efficient kernel, which saves K/V repeated to every head and the mask in the input
    dtype (``b x s x s x e``), unless no kernel takes the dtype (``masked_math``: bf16 below
    sm80), when the math path's probabilities cover every key. Eager attention scores every
    key and masks them, window or not.

    ``fused_qkv`` is LitGPT's attention, one projection for q, k and v whose output is split
    into views: with as many K/V heads as query heads V stays a view, and SDPA, saving V, keeps
    the whole output alive (the q and k parts on top of the roped copies); with fewer, K and V
    are repeated to every query head before SDPA saves them. LoRA on some but not all of q, k,
    v adds the padded lora_B output (``Trainable.qkv_subset_bytes_per_token``). ``math_mqa``:
    lit-gpt before its PR #667 (2023-10-24) left one K/V head unrepeated, which SDPA's fused
    kernels refuse, so its math path ran: the probabilities (b x heads x s x keys x e) are saved,
    with the scaled q and K/V broadcast to every query head by ``matmul``; no log-sum-exp, and
    the output is saved only where a trained projection needs it. ``act_extra``: bytes per element
    of the MLP's width its activation keeps beyond its input (:func:`activation_extra_bytes`;
    transformers' Python-composed GELUs).
    """
    s, b, h = seq, batch, dd.h
    masked = layer.window is not None and s >= layer.window
    if attention == "math" and masked and not masked_math:
        attention = "sdpa"
    tokens = s * b
    rep_div = dd.t if sequence_parallel else 1
    hidden = ceil_div(tokens * h * e, rep_div)  # one hidden-sized tensor, replicated unless SP
    mask = ceil_div(tokens * h * MASK, rep_div) if dropout else 0
    heads = dd.heads
    eager = attention == "eager"
    litgpt = fused_qkv and not eager and not arch.mla
    # transformers' SDPA call with a sliding-window mask: K/V repeated to every head, and the
    # memory-efficient kernel (no other takes a mask) saves the mask converted to the input
    # dtype (ScaledDotProductEfficientAttentionBackward0's attn_bias)
    sdpa_masked = masked and attention == "sdpa" and not litgpt
    # HF eager repeats K/V per q head; so does LitGPT's SDPA path with grouped queries.
    kv_saved = heads if (eager or arch.mla or litgpt or sdpa_masked) else dd.kv_heads
    tr = trainable
    attention_output = tr.attention_output or not eager
    norms = norms_per_layer(layer, arch)
    # One shared norm feeds attention and the MLP: their inputs are one tensor.
    shared_input = tr.qkv_input and shares_one_norm(layer, arch, norms)
    rms = arch.norm == "rmsnorm"
    norm_in, normed = norm_saved_bytes(norm, rms, tr.norm_weights, e, fp32_normed)
    items = {
        "norm inputs": ceil_div(tokens * h * norm_in, rep_div) * norms,
        "normalized tensors of the trained norm weights": ceil_div(tokens * h * normed, rep_div)
        * norms,
        "qkv input": hidden if tr.qkv_input else 0,
        "q": tokens * heads * dd.qk_head_dim * e,
        "k": tokens * kv_saved * dd.qk_head_dim * e,
        "v": tokens * kv_saved * dd.v_head_dim * e,
        "attention output": tokens * heads * dd.v_head_dim * e if attention_output else 0,
        "attention dropout mask": mask,
        "mlp input": hidden if tr.mlp_input and not shared_input else 0,
        "mlp intermediates": _mlp_saved(
            layer, arch, dd, tokens, e, tr.mlp_output_input, fused_swiglu
        ),
        "mlp dropout mask": mask,
    }
    if act_extra and not fused_swiglu and not layer.moe:
        # its input is one of the mlp intermediates already
        items[ACTIVATION_PART] = tokens * act_extra * dd.f
    if tr.lora_bytes_per_token:
        lora = tr.lora_bytes_per_token - (
            tr.qkv_dropout_repeats_bytes_per_token if fused_qkv else 0
        )
        items["LoRA inputs in the adapter dtype, lora_A outputs"] = tokens * lora
    if litgpt and dd.kv_heads == heads:
        items["q and k parts of the fused qkv output (V's view keeps it)"] = (
            tokens * 2 * heads * dd.qk_head_dim * e
        )
    if fused_qkv and tr.qkv_subset_bytes_per_token:
        items["zero-padded lora_B outputs of the fused qkv (index_copy_ source)"] = (
            tokens * tr.qkv_subset_bytes_per_token
        )
    if arch.qk_norm:
        qk = tokens * (heads + dd.kv_heads) * dd.qk_head_dim
        items["qk-norm inputs"] = qk * norm_in + qk * normed
    if layer.moe:
        items["router logits"] = tokens * (arch.moe.num_experts if arch.moe else 0) * e
    if eager:
        # eager attention and the math path score every key and mask them (no cache here)
        scores = b * heads * s * s
        softmax = FP32 + (e if e != FP32 else 0) if softmax_fp32 else e
        items["softmax output (fp32 and its cast)" if softmax_fp32 else "softmax output"] = (
            0 if drop_scores else scores * softmax
        )
        if arch.attention_softcap:  # tanh saves its output: the soft-capped scores
            items["soft-capped scores (tanh output)"] = 0 if drop_scores else scores * e
        if dropout and not drop_scores:
            items["score dropout mask"] = scores * MASK
            items["score dropout output"] = scores * e
    elif attention == "math":
        # torch's math path (attention.cpp _scaled_dot_product_attention_math, torch 2.5+)
        # saves fp32 tensors of its own for its matmuls' backward -- the scaled query, the
        # scaled keys and the values, both expanded to every query head -- and the fp32
        # probabilities (one tensor: _safe_softmax's output, the second matmul's input);
        # nothing saves its output unless a trained projection reads it.
        items["q"] = tokens * heads * dd.qk_head_dim * FP32
        items["k"] = tokens * heads * dd.qk_head_dim * FP32
        items["v"] = tokens * heads * dd.v_head_dim * FP32
        items["attention output"] = tokens * heads * dd.v_head_dim * e if tr.attention_output else 0
        scores = b * heads * s * s
        items[MATH_PROBABILITIES_PART] = 0 if drop_scores else scores * FP32
        if dropout and not drop_scores:
            items["score dropout mask"] = scores * MASK
            items["score dropout output"] = scores * FP32
    elif litgpt and math_mqa and dd.kv_heads == 1:
        items["attention probabilities (math SDPA: one K/V head takes no fused kernel)"] = (
            b * heads * s * s * e
        )
        items["attention output"] = tokens * heads * dd.v_head_dim * e if tr.attention_output else 0
    else:
        items["log-sum-exp"] = b * heads * s * FP32
        if sdpa_masked:
            # its last dim padded to 16 elements (attention.cu pad_bias)
            items[MASK_BIAS_PART] = b * s * round_up(s, 16) * e
    return items


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


RECOMPUTED_PART = "one layer recomputed in backward"
RECOMPUTE_GRADS_PART = "gradients of the recomputed layer's intermediates (its backward)"


def eager_softmax_fp32(w: TrainingWorkload, arch: Arch) -> bool:
    """Whether an eager attention's softmax runs in fp32 (:attr:`Arch.eager_softmax_fp32`, or
    autocast, whose fp32 list has softmax)."""
    return arch.eager_softmax_fp32 or w.mixed_precision == "autocast"


def eager_softmax_backward_bytes(
    w: TrainingWorkload,
    arch: Arch,
    dd: DeviceDims,
    sdpa_math: bool = False,
    masked_math: bool = False,
) -> int:
    """What an eager attention's softmax backward holds beyond the layer's saved set, 0 where
    the attention is fused (``b x heads' x s x s`` scores: every key, as
    :func:`training_saved` counts them; eager as asked or as the family runs it). Full
    recomputation counts it in the recomputed layer's backward; without it the budget's
    ``backward_attention`` phase holds it beside every layer's saved activations.

    The softmax's backward holds the fp32 gradients of its output and of its input (8 B per
    score) beside the saved fp32 probabilities, the low-precision probabilities released just
    before: ``12 - (4 + e)`` B per score over the saved set (6 in bf16; 8 in fp32, whose
    probabilities are one tensor). transformers' ``eager_attention_forward`` traced on fake
    tensors (Llama layers, ``h`` 1,024 / 2,048, 2,048 tokens, full fine-tuning and LoRA)
    exceeds the saved set by 4.4 - 5.1 B per score element in bf16 (``bench/
    recompute_backward.py``). A softmax in the scores' dtype (:func:`eager_softmax_fp32`
    false: GPT-2, BERT without autocast) holds its output's and input's gradients beside its
    saved output: ``2 e``. SDPA's math path (``sdpa_math``: :meth:`vrambudget.core.overheads.
    Overheads.sdpa_math`) saves only the fp32 probabilities, and its backward holds the fp32
    gradients of the probabilities and of the scores beside them (``_softmax_backward_data``):
    8 B per score over the saved set, over every key (a sliding-window layer whose sequence
    reaches its window runs a fused kernel unless ``masked_math``)."""
    attention, scores = _scores(w, arch, dd, sdpa_math, masked_math)
    e = bytes_of(w.precision.compute)
    if attention == "math":
        per_score = 2 * FP32
    else:
        per_score = (12 - (4 if e == 4 else 4 + e)) if eager_softmax_fp32(w, arch) else 2 * e
    return scores * per_score


def _scores(
    w: TrainingWorkload, arch: Arch, dd: DeviceDims, sdpa_math: bool, masked_math: bool
) -> tuple[str, int]:
    """(the attention that runs, one layer's ``b x heads' x s x s`` score elements): 0 where
    the attention is fused, and on the math path where only masked sliding-window layers
    would run it and their calls take a fused kernel (``masked_math`` false)."""
    attention = attention_run(w.attention, arch, sdpa_math)
    if attention not in SCORES_MATERIALIZED:
        return attention, 0
    s = w.sequence_length
    masked = all(layer.window is not None and s >= layer.window for layer, _ in arch.layer_runs)
    if attention == "math" and masked and not masked_math:
        return attention, 0
    return attention, w.micro_batch_size * dd.heads * s * s


def saved_scores_bytes(
    w: TrainingWorkload,
    arch: Arch,
    dd: DeviceDims,
    sdpa_math: bool = False,
    masked_math: bool = False,
) -> int:
    """One layer's score tensors saved for backward (``b x heads' x s x s``, every key), 0
    where the attention is fused: eager's probabilities (fp32 and their cast, or in the
    scores' dtype) and a soft-capped model's tanh output; the math path's fp32 probabilities.
    What selective recomputation drops from the saved set, and brings back for the layer whose
    backward runs."""
    attention, scores = _scores(w, arch, dd, sdpa_math, masked_math)
    e = bytes_of(w.precision.compute)
    if attention == "math":
        return scores * FP32
    per = (FP32 + (e if e != FP32 else 0)) if eager_softmax_fp32(w, arch) else e
    return scores * (per + (e if arch.attention_softcap else 0))


def recompute_backward_bytes(
    dd: DeviceDims,
    tokens: int,
    e: int,
    method: Method,
    fused_swiglu: bool = False,
    residual_bytes: int | None = None,
    eager_bytes: int = 0,
    peft_casts: bool = True,
) -> int:
    """The working set of the recomputed layer's own backward, on top of its saved tensors:
    the gradients of its intermediates while its MLP runs backward -- the product's gradient and
    the two it splits into (gate, up), then the input gradients of the projections -- ``tokens
    x e x (2 f' + 4 h)``, and with fp32 LoRA adapters (PEFT casts each adapted projection's input to
    the adapter's dtype) ``8 h`` bytes per token more for their fp32 gradients.

    Measured, not derived line by line: the trace tier's activation peak of transformers' own
    code (Llama layers, PEFT LoRA on every projection and full fine-tuning, SDPA, full
    recomputation, fake tensors; ``h`` 1,024 / 2,048, ``f`` 2,816 / 5,632, 2,048 tokens) exceeds
    the recompute phase's saved tensors by ``2.0 f + 3.0..4.5 h`` elements per token (bf16), and
    by ``2.0 f + 8.0 h`` plus 1.5 % with fp32 adapters; the coefficients above are the larger.
    Liger's fused SwiGLU writes the gate's and up's gradients into their saved outputs
    (``fused_swiglu``): only the product's gradient, ``1 f'``, is allocated. The hidden-wide
    gradients take the residual stream's element size (``residual_bytes``: fp32 under autocast
    or PEFT's QLoRA preparation). A mixture of experts takes its routed width (``top_k x
    f_expert``) plus its shared experts' (not divided by expert parallelism: an upper bound).

    An eager attention has a larger moment of its own, later in the layer's backward, when the
    MLP's gradients are gone (``eager_bytes``: :func:`eager_softmax_backward_bytes`); the larger
    of the two moments counts. Under Unsloth's own functions (``peft_casts`` false: every adapted
    projection runs in one) no projection's input is cast to the adapters' dtype, and its MLP's
    backward writes the gate's and up's gradients into their saved outputs (unsloth 2024.8
    ``kernels/fast_lora.py`` ``LoRA_MLP.backward``), as Liger's does (``fused_swiglu``)."""
    fp32_adapters = (
        peft_casts
        and isinstance(method, LoRA)
        and bytes_of(method.adapter_dtype or "fp32") == 4
        and e != 4
    )
    f = dd.f_expert * max(dd.top_k, 1) + dd.f_shared if dd.experts else dd.f
    per_f = 1 if fused_swiglu else 2
    h_bytes = residual_bytes or e
    mlp = tokens * (e * per_f * f + h_bytes * 4 * dd.h) + (
        tokens * 8 * dd.h if fp32_adapters else 0
    )
    return max(mlp, eager_bytes)


HEAD_INPUTS_PART = "final norm and LM-head inputs"


OFFLOADED_BACK_PART = "the recomputed layer's input, copied back from host RAM"


def layer_input_bytes(w: TrainingWorkload, arch: Arch, residual_bytes: int) -> int:
    """One layer's input for one micro-batch, as full recomputation keeps it (split over the
    tensor-parallel group with sequence parallelism): ``ceil(s x b x h x r / rep)``."""
    par = w.parallelism
    return ceil_div(
        w.sequence_length * w.micro_batch_size * arch.hidden_size * residual_bytes,
        par.tensor if par.sequence_parallel else 1,
    )


def offloaded_inputs_bytes(
    w: TrainingWorkload, arch: Arch, stage: Stage, residual_bytes: int
) -> int:
    """Host RAM that ``checkpointing: offloaded`` holds at the end of a forward: every layer's
    input of the stage for each micro-batch in flight (unsloth 2024.8 ``models/_utils.py``
    ``Unsloth_Offloaded_Gradient_Checkpointer.forward``: ``hidden_states.to("cpu",
    non_blocking = True)`` saved for backward, brought back in ``backward``; torchtune's
    ``OffloadActivations`` the same for the checkpointed inputs)."""
    if w.checkpointing != "offloaded":
        return 0
    par = w.parallelism
    count, factor = in_flight(
        par.pipeline,
        w.gradient_accumulation_steps,
        par.pipeline_schedule,
        par.virtual_stages,
        stage.index,
    )
    layers = sum(n for _, n in stage.layer_runs)
    return int(layer_input_bytes(w, arch, residual_bytes) * layers * count * factor)


def training_activations(
    w: TrainingWorkload,
    arch: Arch,
    stage: Stage,
    dd: DeviceDims,
    norm: RmsNorm = "fused",
    fused_qkv: bool = False,
    math_mqa: bool = False,
    residual_bytes: int | None = None,
    fused_swiglu: bool = False,
    unsloth: bool = False,
    act_extra: int = 0,
    sdpa_math: bool = False,
    masked_math: bool = False,
) -> tuple[int, int, list[tuple[str, int]]]:
    """(all saved activations of a pipeline stage, one layer's saved activations, itemized
    parts): per layer kind the tensors saved for backward (``training_saved``; with full
    recomputation only the layer input, plus one layer recomputed in backward), times the
    micro-batches in flight (``in_flight``), plus the final norm and LM-head inputs on the last
    stage and the embedding dropout mask on the first. ``residual_bytes``: the residual
    stream's element size where it differs from the compute dtype's (QLoRA as PEFT prepares
    it: fp32 embeddings and norms make every layer input fp32), which full recomputation
    keeps. ``unsloth``: the stack is Unsloth's, whose fast LoRA (``lora_dropout`` 0) saves less
    (:func:`unsloth_trainable`). ``act_extra``: what the MLP's activation keeps beyond its input
    (:func:`activation_extra_bytes`). ``sdpa_math``: SDPA runs its math path on this device
    and stack (:meth:`vrambudget.core.overheads.Overheads.sdpa_math`); ``masked_math``: so do
    the masked calls of sliding-window layers."""
    e = bytes_of(w.precision.compute)
    fp32_normed = fp32_normed_of(arch, w.mixed_precision)
    attention = attention_run(w.attention, arch, sdpa_math)
    par = w.parallelism
    s, b = w.sequence_length, w.micro_batch_size
    ckpt = w.checkpointing
    per_layer_total = 0
    one_layer = 0
    items: dict[str, int] = {}
    m = w.method
    softmax_fp32 = eager_softmax_fp32(w, arch)
    kept = layer_input_bytes(w, arch, residual_bytes or e)  # one layer's input: all alike
    # Offloaded: every input waits in host RAM (:func:`offloaded_inputs_bytes`); the one being
    # recomputed is copied back.
    brought_back = kept if ckpt == "offloaded" else 0
    for layer, n in stage.layer_runs:
        tr, own_mlp = FULL_TRAINING, False
        if isinstance(m, LoRA):
            tr, own_mlp = lora_layer_trainable(layer, arch, par.tensor, m, e, unsloth)
        # Unsloth's LoRA_MLP keeps e and g only, as a fused SwiGLU does
        swiglu = fused_swiglu or own_mlp
        saved_by = partial(
            training_saved,
            layer,
            arch,
            dd,
            seq=s,
            batch=b,
            e=e,
            attention=attention,
            dropout=w.dropout,
            sequence_parallel=par.sequence_parallel,
            trainable=tr,
            norm=norm,
            fp32_normed=fp32_normed,
            fused_qkv=fused_qkv,
            math_mqa=math_mqa,
            fused_swiglu=swiglu,
            softmax_fp32=softmax_fp32,
            act_extra=act_extra,
            masked_math=masked_math,
        )
        selective = ckpt == "selective"
        saved = saved_by(drop_scores=selective)
        layer_bytes = sum(saved.values())
        # The layer recomputed in backward keeps its whole set (the scores too): the same
        # items unless selective recomputation dropped them.
        whole = saved_by(drop_scores=False) if selective else saved
        one_layer = max(one_layer, sum(whole.values()))
        if ckpt == "full":
            per_layer_total += kept * n
            items["layer inputs (full recomputation)"] = (
                items.get("layer inputs (full recomputation)", 0) + kept * n
            )
        elif ckpt != "offloaded":
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
    if ckpt in ("full", "offloaded"):
        total += one_layer  # the layer being recomputed during backward
        parts.append((RECOMPUTED_PART, one_layer))
    if brought_back:
        total += brought_back
        parts.append((OFFLOADED_BACK_PART, brought_back))
    if stage.last and arch.kind == "decoder":
        # The final norm's input (and normalized tensor when trained), the LM head's input.
        norm_in, normed = norm_saved_bytes(
            norm, arch.norm == "rmsnorm", not isinstance(m, LoRA), e, fp32_normed
        )
        head_inputs = s * b * arch.hidden_size * (norm_in + normed + e)
        total += head_inputs
        parts.append((HEAD_INPUTS_PART, head_inputs))
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
