"""Where the model comes from: a preset, an inline ``config.json``, or its dimensions."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from ..catalog import ModelId
from ..hf_config import HFConfig
from .limits import MAX_LAYERS, MAX_TOKENS, Dim, Layers, Name, Wire

__all__ = ["DimensionsModel", "HFConfigModel", "MoESpec", "ModelSource", "PresetModel"]


class PresetModel(Wire, tag="preset", tag_field="source", frozen=True, kw_only=True):
    """A model from the preset catalog (``GET /v1/models``)."""

    id: Annotated[ModelId, Meta(description="Preset id, e.g. `llama-3.1-8b`.")]


class HFConfigModel(Wire, tag="hf_config", tag_field="source", frozen=True, kw_only=True):
    """An inline Hugging Face ``config.json``, pasted as published."""

    config: Annotated[HFConfig, Meta(description="The model's `config.json` as published.")]
    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the config's model_type.")
    ] = None


class MoESpec(Wire, frozen=True, kw_only=True):
    """Mixture-of-experts MLPs."""

    num_experts: Annotated[int, Meta(ge=1, le=1 << 16, description="Routed experts per layer.")]
    experts_per_token: Annotated[int, Meta(ge=1, le=1 << 16, description="Top-k routing.")]
    expert_intermediate_size: Annotated[
        Dim, Meta(description="MLP width of each routed expert (gated, 3 matrices), elements.")
    ]
    shared_intermediate_size: Annotated[
        int, Meta(ge=0, le=1 << 24, description="Total width of always-on shared experts.")
    ] = 0
    num_dense_layers: Annotated[
        int, Meta(ge=0, le=MAX_LAYERS, description="Leading layers with a dense MLP instead.")
    ] = 0


class DimensionsModel(Wire, tag="dimensions", tag_field="source", frozen=True, kw_only=True):
    """A transformer given by its dimensions (for a model with no preset or config)."""

    name: Annotated[Name | None, Meta(description="Label in the answer; default: `custom`.")] = None
    kind: Annotated[
        Literal["decoder", "encoder"],
        Meta(
            description="`decoder`: generates tokens, has an LM head and a KV cache; "
            "`encoder`: one forward pass, no LM head."
        ),
    ] = "decoder"
    hidden_size: Annotated[Dim, Meta(description="Model width (d_model), elements.")]
    num_layers: Layers
    num_attention_heads: Annotated[Dim, Meta(description="Query heads per layer.")]
    num_key_value_heads: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 24)] | None,
        Meta(
            description="KV heads (GQA/MQA); must divide the query heads. Default (null): "
            "as many as query heads."
        ),
    ] = None
    head_dim: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 24)] | None,
        Meta(
            description="Width of one attention head, elements. Default (null): "
            "hidden_size / num_attention_heads."
        ),
    ] = None
    intermediate_size: Annotated[
        Dim,
        Meta(
            description="Width of the dense MLP, elements (also the dense layers of a MoE model)."
        ),
    ]
    vocab_size: Annotated[int, Meta(ge=1, le=1 << 26, description="Vocabulary (1 .. 2^26).")]
    max_position_embeddings: Annotated[
        int,
        Meta(
            ge=1,
            le=MAX_TOKENS,
            description="Longest context the model supports, tokens: "
            "longer requests warn, fits stop there; rows of a learned position table. "
            "Default: 2^40 (no limit).",
        ),
    ] = 1 << 40
    mlp: Annotated[
        Literal["gated", "dense"],
        Meta(description="`gated`: SwiGLU/GeGLU, 3 matrices; `dense`: GELU, 2 matrices."),
    ] = "gated"
    norm: Annotated[
        Literal["rmsnorm", "layernorm"],
        Meta(description="`rmsnorm`: a weight per norm; `layernorm`: a weight and a bias."),
    ] = "rmsnorm"
    tie_word_embeddings: Annotated[
        bool, Meta(description="The LM head shares the token embedding (no separate lm_head).")
    ] = False
    attention_bias: Annotated[bool, Meta(description="q/k/v/o projections have biases.")] = False
    mlp_bias: Annotated[bool, Meta(description="MLP projections have biases.")] = False
    learned_position_embeddings: Annotated[
        bool, Meta(description="A learned position table (GPT-2/BERT style).")
    ] = False
    sliding_window: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None,
        Meta(
            description="Window of the sliding-window layers, tokens (their KV cache holds at "
            "most this many). Required with num_sliding_window_layers; default: none."
        ),
    ] = None
    num_sliding_window_layers: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_LAYERS,
            description="How many layers use the sliding window (the last ones); 0: none.",
        ),
    ] = 0
    moe: Annotated[
        MoESpec | None, Meta(description="Mixture-of-experts MLPs; default (null): dense MLPs.")
    ] = None


ModelSource = PresetModel | HFConfigModel | DimensionsModel
