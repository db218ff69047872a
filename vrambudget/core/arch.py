"""A model's resolved architecture: dimensions, layer kinds and the exact tensor inventory.

Everything the formulas need is derived here once per model (and cached by the caller): the
parameter tensors of every layer kind with their shapes and how tensor parallelism splits them,
the layers' attention kind (full, sliding window, latent) and MLP kind (dense, mixture of experts).

Parameter counts are exact: they are the sums of the tensors that the family's ``transformers``
modelling code creates (``modeling_<family>.py``), and a test checks every preset against the
parameter count of its published checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

__all__ = [
    "ALL_LINEAR",
    "MLA",
    "Arch",
    "AttentionKind",
    "LayerType",
    "MoE",
    "Role",
    "Split",
    "TensorGroup",
    "attention_run",
    "lora_target_names",
    "lora_targeted",
    "module_name",
    "projection_names",
    "saved_by",
    "saved_count",
    "saved_names",
]


class Role(StrEnum):
    """What a parameter tensor is, which decides whether a quantization scheme touches it."""

    LINEAR = "linear"
    """A dense projection of a decoder/encoder layer (attention or MLP)."""
    EXPERT = "expert"
    """A projection inside a routed expert."""
    ROUTER = "router"
    """The MoE gate that scores experts (kept in high precision by every scheme here)."""
    EMBEDDING = "embedding"
    """Token, position or token-type embedding table."""
    LM_HEAD = "lm_head"
    """The output projection to the vocabulary (absent when tied to the embedding)."""
    NORM = "norm"
    """Normalization weights (and LayerNorm biases)."""
    BIAS = "bias"
    """A projection's bias vector."""
    VISION = "vision"
    """Vision (or audio) tower and projector of a multimodal checkpoint (not quantized here)."""
    OTHER = "other"
    """Any other parameter or buffer: convolutions, state-space parameters, attention sinks,
    rotary tables (stored unquantized, replicated)."""


class Split(StrEnum):
    """How tensor parallelism of degree t divides a tensor across devices."""

    COLUMN = "column"
    """Output features divided by t (Megatron ColumnParallelLinear)."""
    ROW = "row"
    """Input features divided by t (RowParallelLinear)."""
    KV_COLUMN = "kv_column"
    """Key/value heads divided by t, or replicated one head per device when t > kv heads."""
    VOCAB = "vocab"
    """Vocabulary rows divided by t (VocabParallelEmbedding)."""
    REPLICATED = "replicated"
    """A full copy on every device (norms, low-rank MLA projections, routers)."""


class AttentionKind(StrEnum):
    FULL = "full"
    SLIDING = "sliding"


@dataclass(frozen=True, slots=True)
class TensorGroup:
    """``count`` parameter tensors of shape ``(rows, cols)`` (``cols == 1`` for vectors)."""

    name: str
    rows: int
    cols: int
    role: Role
    split: Split
    count: int = 1
    dtype: str | None = None
    """A dtype the tensor keeps whatever the model's (fp32 rotary tables, integer buffers,
    modules the framework keeps in fp32); None: the weights' dtype (or their quantization)."""
    fp32_at_fp16: bool = False
    """Kept in fp32 when the weights are fp16 (transformers ``_keep_in_fp32_modules``)."""
    buffer: bool = False
    """A buffer, not a parameter: loaded with the model, never trained."""
    module: str | None = None
    """The module's own name where the modelling code calls it otherwise than ``name``'s last
    component (Mixtral's experts: ``w1`` / ``w3`` / ``w2`` in transformers < 5's
    ``MixtralBlockSparseTop2MLP``): what a LoRA target list matches."""
    modules: tuple[str, ...] = ()
    """Where each of the ``count`` tensors is a module of its own (a layer's norms:
    ``input_layernorm``, ``post_attention_layernorm``), their names in order: what
    ``modules_to_save`` matches one by one (:func:`saved_count`)."""

    @property
    def num_params(self) -> int:
        if self.buffer:
            return 0
        return self.rows * self.cols * self.count


@dataclass(frozen=True, slots=True)
class LayerType:
    """One kind of transformer layer; a model is a sequence of runs of these."""

    attention: AttentionKind
    window: int | None
    moe: bool
    tensors: tuple[TensorGroup, ...]
    kv_elems: int | None = None
    """K + V elements this layer caches per token on one device, as the framework's cache
    keeps them (measured); None: ``2 x kv_heads x head_dim`` (or MLA's latent)."""
    state: tuple[tuple[int, str | None], ...] = ()
    """Per-sequence state the layer keeps whatever the context (Mamba / linear-attention conv
    and recurrent states): (elements, fixed dtype or None for the compute dtype)."""
    stored: tuple[int, int] | None = None
    """(payload, quantization metadata) bytes of this layer as its checkpoint stores them
    (exact, from the safetensors headers); None: computed from the tensors and the precision.
    Buffers the checkpoint does not store are computed either way."""

    @property
    def num_params(self) -> int:
        return sum(t.num_params for t in self.tensors)


@dataclass(frozen=True, slots=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2 §2.1): the KV cache holds the compressed latent."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, slots=True)
class MoE:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int
    """Total intermediate width of the always-on shared expert(s); 0 when there are none."""


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """A config's ``rope_scaling``: only what sizes a precomputed rotary table."""

    kind: str
    """``rope_type`` (or the older ``type``), lower case; ``default`` when absent."""
    factor: float | None
    original_max_positions: int | None


@dataclass(frozen=True, slots=True, eq=False)
class Arch:
    """Compared and hashed by identity: architectures are resolved once and cached, and the
    statics cache keys on them on every request."""

    model_type: str
    kind: Literal["decoder", "encoder"]
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    mlp: Literal["gated", "dense"]
    norm: Literal["rmsnorm", "layernorm"]
    tie_word_embeddings: bool
    qk_norm: bool
    sandwich_norms: bool
    """Gemma 2/3: extra norms after attention and around the MLP (4 per layer)."""
    layer_runs: tuple[tuple[LayerType, int], ...]
    embeddings: tuple[TensorGroup, ...]
    head: tuple[TensorGroup, ...]
    """Final norm, the LM head (when untied), BERT's pooler."""
    extras: tuple[TensorGroup, ...] = ()
    """Loaded with the model but outside the text stack (Gemma 3's vision tower)."""
    mla: MLA | None = None
    moe: MoE | None = None
    rope_scaling: RopeScaling | None = None
    attention_softcap: bool = False
    """Gemma 2: the attention logits are soft-capped (tanh), which SDPA cannot do: transformers
    (``Gemma2PreTrainedModel._supports_sdpa = False``) and LitGPT (``# with softcapping we
    cannot use SDPA``) materialize the scores, as eager attention does; flash-attn caps inside
    its kernel."""
    eager_softmax_fp32: bool = True
    """Eager attention runs the softmax in fp32 and casts the probabilities back
    (transformers' ``eager_attention_forward``: ``softmax(attn_weights, dim=-1,
    dtype=torch.float32).to(query.dtype)``); GPT-2 and BERT run it in the scores' dtype
    (``nn.functional.softmax(attn_weights, dim=-1)``), in fp32 only under autocast, whose
    fp32 list has softmax."""
    final_softcap: bool = False
    """Gemma 2 (``final_logit_softcapping``, 30.0 by default in transformers' Gemma2Config) and
    any config that sets it: the LM head's output is soft-capped, ``tanh(logits / cap) * cap``
    (transformers modeling_gemma2.py Gemma2ForCausalLM.forward; LitGPT model.py GPT.forward),
    and tanh saves its output for backward."""
    activation: str = ""
    """The MLP's activation as the config names it (``hidden_act``, GPT-2's
    ``activation_function``): what transformers' module for it keeps for backward
    (:data:`~vrambudget.core.formulas.activations.MODEL_CODE_ACTIVATIONS`); empty: unknown, one
    kernel assumed."""
    shifted_loss_copy: bool = False
    """The modelling code's own loss takes a contiguous copy of the shifted logits in the
    compute dtype, whatever the framework release (Qwen (v1)'s remote ``modeling_qwen.py``
    ``QWenLMHeadModel.forward``: ``lm_logits[..., :-1, :].contiguous()``)."""
    checkpoint_only_params: int = 0
    """Parameters in the published checkpoint that inference stacks do not load by default
    (DeepSeek-V3's multi-token-prediction layer)."""
    mtp_layers: int = 0
    """Multi-token-prediction modules the checkpoint carries (DeepSeek-V3's
    ``num_nextn_predict_layers``), each a full decoder layer of the last kind: what vLLM's MTP
    speculative decoding loads."""
    stored_top: tuple[tuple[str, int, int], ...] = ()
    """(``embeddings`` | ``head`` | ``extras``, payload, metadata) bytes of the tensors outside
    the layer stack as the checkpoint stores them; empty: computed."""
    _num_params: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        total = sum(layer.num_params * n for layer, n in self.layer_runs)
        total += sum(t.num_params for t in (*self.embeddings, *self.head, *self.extras))
        object.__setattr__(self, "_num_params", total)

    @property
    def num_params(self) -> int:
        """Parameters that the model loads (all layers, embeddings, head, extras)."""
        return self._num_params

    @property
    def checkpoint_num_params(self) -> int:
        return self._num_params + self.checkpoint_only_params


SCORES_MATERIALIZED = frozenset({"eager", "math"})
"""The attention implementations that run hold every head's s x s scores."""


def attention_run(attention: str, arch: Arch, sdpa_math: bool = False) -> str:
    """The attention implementation that runs for a requested one: ``sdpa`` on a model whose
    attention logits are soft-capped falls back to ``eager`` (:attr:`Arch.attention_softcap`);
    ``sdpa`` runs as ``math``, torch's composite path with the scores materialized in fp32,
    where the device and stack leave it no fused kernel (``sdpa_math``:
    :meth:`vrambudget.core.overheads.Overheads.sdpa_math`)."""
    if attention != "sdpa":
        return attention
    if arch.attention_softcap:
        return "eager"
    return "math" if sdpa_math else attention


ALL_LINEAR = "all-linear"
"""PEFT's shorthand target (``peft.utils.constants.INCLUDE_LINEAR_LAYERS_SHORTHAND``): every
``nn.Linear`` / ``Conv1D`` of the model except its output embedding (peft 0.21.2
``tuners/tuners_utils.py`` ``_maybe_include_all_linear_layers``, lines 2430-2490) -- here, every
projection of the layers (dense and routed expert); the LM head is the output embedding."""


def lora_targeted(
    g: TensorGroup, targets: tuple[str, ...] | frozenset[str], experts: bool = True
) -> bool:
    """Whether a LoRA target list adapts this tensor: a projection (dense, or routed expert
    where ``experts``: the modelling code builds them as modules,
    :attr:`vrambudget.core.stack.Stack.lora_reaches_experts`) whose name's last component is
    one of ``targets`` (PEFT's rule for a list of names), or any such for :data:`ALL_LINEAR`."""
    return (g.role is Role.LINEAR or (experts and g.role is Role.EXPERT)) and (
        ALL_LINEAR in targets or module_name(g) in targets
    )


def module_name(g: TensorGroup) -> str:
    """The last component of the name of the module a tensor belongs to: what a LoRA target
    and ``modules_to_save`` match -- the module's own (:attr:`TensorGroup.module`: Mixtral's
    experts are ``w1`` / ``w3`` / ``w2`` under transformers < 5), else the tensor's name less
    ``.weight`` / ``.bias`` (a bias is its projection's)."""
    if g.module:
        return g.module
    return g.name.removesuffix(".bias").removesuffix(".weight").rsplit(".", 1)[-1]


def _projection_names(arch: Arch) -> tuple[str, ...]:
    """The last name components of the model's projections, in the order the layers list
    them (each once)."""
    return tuple(
        dict.fromkeys(
            module_name(g)
            for layer, _ in arch.layer_runs
            for g in layer.tensors
            if g.role in (Role.LINEAR, Role.EXPERT)
        )
    )


def projection_names(arch: Arch) -> frozenset[str]:
    """The last name components of the model's projections: the names a LoRA target can
    match (:func:`lora_targeted`)."""
    return frozenset(_projection_names(arch))


def lora_target_names(targets: tuple[str, ...], arch: Arch) -> tuple[str, ...]:
    """The target names a LoRA target list stands for on ``arch``: :data:`ALL_LINEAR` spelled
    out as the model's projection names; a list of names as it is."""
    return _projection_names(arch) if ALL_LINEAR in targets else targets


def saved_count(g: TensorGroup, names: tuple[str, ...]) -> int:
    """How many of the group's ``count`` tensors PEFT's ``modules_to_save`` trains a copy of:
    those of a module whose name ends with one of ``names`` (peft 0.21.2 ``utils/other.py``
    ``_set_trainable``, line 1088: ``key.endswith(target_key)``; ``norm`` reaches every
    ``*_layernorm`` too), compared on the module's own name (``names`` are such names: the
    request takes no dotted path)."""
    if g.buffer or not names:
        return 0
    if g.modules:
        return sum(1 for m in g.modules if any(m.endswith(n) for n in names))
    return g.count if any(module_name(g).endswith(n) for n in names) else 0


def saved_by(g: TensorGroup, names: tuple[str, ...]) -> bool:
    """Whether ``modules_to_save`` reaches any tensor of the group (:func:`saved_count`)."""
    return saved_count(g, names) > 0


def saved_names(g: TensorGroup, names: tuple[str, ...]) -> tuple[str, ...]:
    """The names of the group's modules that ``modules_to_save`` reaches."""
    own = g.modules or (module_name(g),)
    return tuple(m for m in own if any(m.endswith(n) for n in names))
