"""Where the model comes from: a preset, an inline ``config.json`` (with, optionally, its
checkpoint's tensor headers), a Hugging Face Hub repository, or its dimensions."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta

from ..catalog import ModelId
from ..checkpoint import StoredTensor
from ..hf_config import (
    CLOSED_FORM_FAMILIES,
    MODEL_TYPE_PATTERN,
    HFConfig,
    check_config,
    config_key,
)
from .limits import MAX_LAYERS, MAX_TOKENS, Dim, Layers, Name, Wire

__all__ = [
    "CheckpointHeader",
    "DimensionsModel",
    "HFConfigModel",
    "HubModel",
    "MoESpec",
    "ModelSource",
    "PresetModel",
]

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model_type"],
    "properties": {"model_type": {"type": "string", "pattern": MODEL_TYPE_PATTERN}},
    "if": {
        "properties": {"model_type": {"enum": sorted(CLOSED_FORM_FAMILIES)}},
        "required": ["model_type"],
    },
    "then": {"$ref": "#/components/schemas/HFConfig"},
}
"""A ``config.json``: any object with a ``model_type``; a closed-form family's keys are
checked against ``HFConfig`` (other families' keys are read by ``transformers``)."""

MAX_CHECKPOINT_TENSORS = 1 << 18
"""Tensors of an inline checkpoint header (DeepSeek-V3 stores ~91,000)."""


class PresetModel(Wire, tag="preset", tag_field="source", frozen=True, kw_only=True):
    """A model from the preset catalog (``GET /v1/models``)."""

    id: Annotated[ModelId, Meta(description="Preset id, e.g. `llama-3.1-8b`.")]


class CheckpointHeader(Wire, frozen=True, kw_only=True):
    """What a checkpoint stores, as its safetensors headers say (read the header only, never the
    data): the exact stored bytes of every tensor. ``vrambudget estimate --checkpoint DIR``
    reads it from a local directory; a `hub` model has it fetched."""

    tensors: Annotated[
        tuple[StoredTensor, ...],
        Meta(
            max_length=MAX_CHECKPOINT_TENSORS,
            description="Every stored tensor as `[name, dtype, shape, nbytes]`: the "
            "safetensors dtype code (`BF16`, `F8_E4M3`, `I32`, `U8`, `F4` ...), the shape, and "
            "the stored bytes (`data_offsets` end - begin).",
        ),
    ]
    total_size: Annotated[
        Annotated[int, Meta(ge=0, le=1 << 62)] | None,
        Meta(description="`metadata.total_size` of the index, when known."),
    ] = None


class HFConfigModel(Wire, tag="hf_config", tag_field="source", frozen=True, kw_only=True):
    """An inline Hugging Face ``config.json``, pasted as published: any ``model_type`` the
    service's ``transformers`` can build. The families with a closed form are computed in
    microseconds; the others from the framework's own module tree (built once per config on the
    meta device, then cached)."""

    config: Annotated[
        dict[str, Any],
        Meta(
            description="The model's `config.json` as published (keys that do not change "
            "memory are ignored; `quantization_config` and `torch_dtype` set the deployed "
            "format unless `precision` says otherwise).",
            extra_json_schema=CONFIG_SCHEMA,
        ),
    ]
    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the config's model_type.")
    ] = None
    checkpoint: Annotated[
        CheckpointHeader | None,
        Meta(description="The checkpoint's tensor headers: exact stored bytes per tensor."),
    ] = None

    __typed_dicts__: ClassVar[dict[str, type]] = {"config": HFConfig}
    """``config`` is a free JSON object checked against ``HFConfig`` (error hints read it)."""

    def __post_init__(self) -> None:
        check_config(self.config)

    def __hash__(self) -> int:
        return hash((config_key(self.config), self.name, self.checkpoint))


class HubModel(Wire, tag="hub", tag_field="source", frozen=True, kw_only=True):
    """A Hugging Face Hub repository: its ``config.json`` and the headers of its safetensors
    files (HTTP range requests; never the weights), fetched by the service, cached per revision.
    Gated repositories need a token in the service's environment."""

    id: Annotated[
        str,
        Meta(
            min_length=3,
            max_length=96,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
            description="Repository id, `owner/name` (e.g. `Qwen/Qwen2.5-7B-Instruct-AWQ`).",
        ),
    ]
    revision: Annotated[
        Annotated[str, Meta(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]
        | None,
        Meta(description="Branch, tag or commit sha; default (null): `main`."),
    ] = None
    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the repository id.")
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


ModelSource = PresetModel | HFConfigModel | HubModel | DimensionsModel
