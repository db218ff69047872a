"""The subset of a Hugging Face ``config.json`` that decides memory, as a wire type.

Unknown keys are ignored on purpose: real ``config.json`` files carry dozens of keys
(token ids, generation defaults) that do not change a byte of memory, and a caller
must be able to paste the file as published. The JSON schema says so (no
``additionalProperties: false`` here, unlike every other request object).

A key that is absent and a key that is ``null`` differ, as in ``transformers``: absent keys
(``UNSET``) take the defaults below, an explicit ``null`` stays null (DeepSeek-V2-Lite's
``"q_lora_rank": null`` means a plain ``q_proj``; Mistral v0.3's ``"sliding_window": null`` means
no sliding window).

Missing keys take the defaults of the family's ``transformers`` configuration class, exactly as
``AutoConfig`` would fill them (see ``FAMILY_DEFAULTS`` in :mod:`vrambudget.core.hf_defaults`):
Gemma 3 checkpoints, for example, publish a sparse ``text_config`` and rely on
``Gemma3TextConfig``'s defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .errors import InvalidWorkload
from .memo import BoundedCache

__all__ = [
    "CLOSED_FORM_FAMILIES",
    "HFConfig",
    "HFRopeScaling",
    "HFTextConfig",
    "HFVisionConfig",
    "ModelType",
    "check_config",
    "check_framework_limits",
    "config_key",
    "typed_config",
]

ModelType = Literal[
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "phi3",
    "qwen",
    "granite",
    "deepseek_v2",
    "deepseek_v3",
    "gpt2",
    "bert",
]

CLOSED_FORM_FAMILIES: frozenset[str] = frozenset(get_args(ModelType))
"""Model types whose tensor inventory has a closed form here (microseconds, no framework);
every other ``model_type`` is built by the framework's own code."""
MODEL_TYPE_PATTERN = r"^[A-Za-z0-9_\-]{1,64}$"

Dim = Annotated[int, Meta(ge=1, le=1 << 24, description="A model dimension (1 .. 2^24).")]
Count = Annotated[int, Meta(ge=0, le=1 << 20, description="A count (0 .. 2^20).")]
LayerCount = Annotated[
    int, Meta(ge=1, le=1024, description="Number of layers (1 .. 1024).")
]  # = vrambudget.core.spec.limits.MAX_LAYERS (not imported: spec imports this module)
Vocab = Annotated[int, Meta(ge=1, le=1 << 26, description="Vocabulary size (1 .. 2^26).")]
Positions = Annotated[int, Meta(ge=1, le=1 << 40, description="Positions (1 .. 2^40).")]


class HFRopeScaling(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``rope_scaling`` as published. It changes no weight, but vLLM precomputes a cos/sin table
    over the scaled positions (Gemma 3's linear factor 8 makes its global table 8 x longer).
    Other keys (llama3's frequency factors, longrope's lists) are accepted and not used."""

    rope_type: Annotated[
        str | None | UnsetType,
        Meta(description="`default`, `linear`, `dynamic`, `yarn`, `llama3`, `longrope`, ..."),
    ] = UNSET
    type: Annotated[
        str | None | UnsetType,
        Meta(description="The older name of `rope_type`; used when `rope_type` is absent."),
    ] = UNSET
    factor: Annotated[
        float | None | UnsetType,
        Meta(
            description="Scaling factor; one that is absent or not above 0 scales nothing (as "
            "published configs are pasted, it is not range-checked)."
        ),
    ] = UNSET
    original_max_position_embeddings: Annotated[
        Positions | None | UnsetType,
        Meta(description="The context length before scaling (yarn, longrope, llama3)."),
    ] = UNSET


ActivationName = Annotated[str, Meta(max_length=64)]
"""An activation's name as transformers' ``ACT2FN`` knows it (``silu``, ``gelu_new`` ...)."""


class _ConfigBase(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Fields shared by a top-level config and Gemma 3's nested ``text_config``."""

    architectures: Annotated[
        tuple[str, ...] | None | UnsetType,
        Meta(description="Model classes the checkpoint was saved from; accepted, not used."),
    ] = UNSET
    hidden_size: Annotated[
        Dim | None | UnsetType,
        Meta(description="Model width (d_model), elements."),
    ] = UNSET
    intermediate_size: Annotated[
        Dim | None | UnsetType,
        Meta(description="Width of the dense MLP, elements (Mixtral: of each expert)."),
    ] = UNSET
    num_hidden_layers: Annotated[
        LayerCount | None | UnsetType,
        Meta(description="Decoder (or encoder) layers."),
    ] = UNSET
    num_attention_heads: Annotated[
        Dim | None | UnsetType,
        Meta(description="Query heads per layer."),
    ] = UNSET
    num_key_value_heads: Annotated[
        Dim | None | UnsetType,
        Meta(
            description="KV heads (GQA/MQA); must divide the query heads. Absent: the family's "
            "default; null or no default: as many as query heads."
        ),
    ] = UNSET
    head_dim: Annotated[
        Dim | None | UnsetType,
        Meta(
            description="Width of one attention head, elements. Absent: the family's default; "
            "null or no default: hidden_size / num_attention_heads."
        ),
    ] = UNSET
    vocab_size: Annotated[
        Vocab | None | UnsetType,
        Meta(description="Vocabulary size: rows of the token embedding and the LM head."),
    ] = UNSET
    max_position_embeddings: Annotated[
        Positions | None | UnsetType,
        Meta(
            description="Longest context the model supports, tokens (BERT: rows of the learned "
            "position table)."
        ),
    ] = UNSET
    hidden_act: Annotated[
        ActivationName | None | UnsetType,
        Meta(
            description="The MLP's activation, as transformers' `ACT2FN` names it: the GELUs "
            "written as Python compositions (`gelu_new`, `gelu_fast`, `quick_gelu` ...) keep "
            "several tensors of the MLP's width for backward, one kernel keeps one.",
        ),
    ] = UNSET
    hidden_activation: Annotated[
        ActivationName | None | UnsetType,
        Meta(description="Gemma: the MLP's activation (as `hidden_act`)."),
    ] = UNSET
    activation_function: Annotated[
        ActivationName | None | UnsetType,
        Meta(description="GPT-2: the MLP's activation (as `hidden_act`)."),
    ] = UNSET
    kv_channels: Annotated[
        Dim | None | UnsetType,
        Meta(description="Qwen (v1, model_type `qwen`): width of one attention head."),
    ] = UNSET
    no_bias: Annotated[
        bool | None | UnsetType,
        Meta(
            description="Qwen (v1): no bias on the attention output and MLP projections "
            "(`c_attn` keeps its bias)."
        ),
    ] = UNSET
    rope_scaling: Annotated[
        HFRopeScaling | None | UnsetType,
        Meta(description="RoPE scaling; sizes vLLM's precomputed cos/sin table (serving)."),
    ] = UNSET
    original_max_position_embeddings: Annotated[
        Positions | None | UnsetType,
        Meta(description="Phi-3 longrope: the pre-scaling context, at the top level."),
    ] = UNSET
    tie_word_embeddings: Annotated[
        bool | None | UnsetType,
        Meta(description="The LM head shares the token embedding (no separate lm_head)."),
    ] = UNSET
    torch_dtype: Annotated[
        str | None | UnsetType,
        Meta(
            description="The checkpoint's dtype (`bfloat16`, `float16`, `float32`): the weights' "
            "dtype when `precision.weights` is `auto`."
        ),
    ] = UNSET
    dtype: Annotated[
        str | None | UnsetType,
        Meta(description="The name transformers >= 4.56 saves `torch_dtype` under."),
    ] = UNSET
    attention_bias: Annotated[
        bool | None | UnsetType,
        Meta(description="q/k/v/o projections have biases (Qwen2 always has q/k/v biases)."),
    ] = UNSET
    mlp_bias: Annotated[
        bool | None | UnsetType,
        Meta(description="MLP projections have biases."),
    ] = UNSET
    # Sliding-window attention (Mistral, Qwen2, Phi-3, Gemma 2/3).
    sliding_window: Annotated[
        Positions | None | UnsetType,
        Meta(
            description="Window of the sliding-window layers, tokens (their KV cache holds at "
            "most this many); null: no sliding window."
        ),
    ] = UNSET
    use_sliding_window: Annotated[
        bool | None | UnsetType,
        Meta(description="Qwen2/Qwen3: enable the sliding window (default false)."),
    ] = UNSET
    max_window_layers: Annotated[
        Count | None | UnsetType,
        Meta(
            description="Qwen2/Qwen3: layers below this index use full attention; the rest slide."
        ),
    ] = UNSET
    sliding_window_pattern: Annotated[
        Dim | None | UnsetType,
        Meta(description="Gemma 3: every n-th layer is global, the others slide (default 6)."),
    ] = UNSET
    layer_types: Annotated[
        tuple[str, ...] | None | UnsetType,
        Meta(
            description="Attention type per layer (`sliding_attention` or full); overrides the "
            "family's rule and must have num_hidden_layers entries."
        ),
    ] = UNSET
    # Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek).
    num_local_experts: Annotated[
        Count | None | UnsetType,
        Meta(description="Mixtral: routed experts per layer."),
    ] = UNSET
    num_experts: Annotated[
        Count | None | UnsetType,
        Meta(description="Qwen2-MoE/Qwen3-MoE: routed experts per layer; 0: a dense model."),
    ] = UNSET
    num_experts_per_tok: Annotated[
        Count | None | UnsetType,
        Meta(description="Experts each token is routed to (top-k)."),
    ] = UNSET
    moe_intermediate_size: Annotated[
        Dim | None | UnsetType,
        Meta(description="MLP width of each routed expert, elements."),
    ] = UNSET
    shared_expert_intermediate_size: Annotated[
        Count | None | UnsetType,
        Meta(description="Qwen2-MoE: width of the always-on shared expert, elements."),
    ] = UNSET
    decoder_sparse_step: Annotated[
        Dim | None | UnsetType,
        Meta(description="Qwen2-MoE/Qwen3-MoE: every n-th layer is a MoE layer (default 1)."),
    ] = UNSET
    mlp_only_layers: Annotated[
        tuple[Annotated[int, Meta(ge=0)], ...] | None | UnsetType,
        Meta(
            description="Qwen2-MoE/Qwen3-MoE: indices of layers with a dense MLP instead of "
            "experts."
        ),
    ] = UNSET
    n_routed_experts: Annotated[
        Count | None | UnsetType,
        Meta(description="DeepSeek: routed experts per MoE layer; null: a dense model."),
    ] = UNSET
    n_shared_experts: Annotated[
        Count | None | UnsetType,
        Meta(description="DeepSeek: shared experts, each moe_intermediate_size wide."),
    ] = UNSET
    first_k_dense_replace: Annotated[
        Count | None | UnsetType,
        Meta(description="DeepSeek: the first k layers have a dense MLP."),
    ] = UNSET
    moe_layer_freq: Annotated[
        Dim | None | UnsetType,
        Meta(
            description="DeepSeek: past the dense layers, those whose index is a multiple of "
            "n are MoE layers (default 1)."
        ),
    ] = UNSET
    topk_method: Annotated[
        str | None | UnsetType,
        Meta(description="DeepSeek-V3: `noaux_tc` adds an fp32 router correction bias per expert."),
    ] = UNSET
    # Multi-head latent attention (DeepSeek-V2/V3).
    kv_lora_rank: Annotated[
        Dim | None | UnsetType,
        Meta(
            description="DeepSeek MLA: rank of the compressed KV (cached per token with the rope "
            "part)."
        ),
    ] = UNSET
    q_lora_rank: Annotated[
        Dim | None | UnsetType,
        Meta(description="DeepSeek MLA: rank of the compressed query; null: a plain q_proj."),
    ] = UNSET
    qk_nope_head_dim: Annotated[
        Dim | None | UnsetType,
        Meta(description="DeepSeek MLA: per-head query/key width without rotary embedding."),
    ] = UNSET
    qk_rope_head_dim: Annotated[
        Dim | None | UnsetType,
        Meta(description="DeepSeek MLA: per-head query/key width with rotary embedding."),
    ] = UNSET
    v_head_dim: Annotated[
        Dim | None | UnsetType,
        Meta(description="DeepSeek MLA: per-head value width."),
    ] = UNSET
    num_nextn_predict_layers: Annotated[
        Count | None | UnsetType,
        Meta(
            description="DeepSeek-V3: multi-token-prediction layers stored in the checkpoint (on "
            "disk only, not loaded)."
        ),
    ] = UNSET
    # GPT-2 names its dimensions differently.
    n_embd: Annotated[
        Dim | None | UnsetType,
        Meta(description="GPT-2: model width, elements."),
    ] = UNSET
    n_layer: Annotated[
        LayerCount | None | UnsetType,
        Meta(description="GPT-2: layers."),
    ] = UNSET
    n_head: Annotated[
        Dim | None | UnsetType,
        Meta(description="GPT-2: attention heads."),
    ] = UNSET
    n_inner: Annotated[
        Dim | None | UnsetType,
        Meta(description="GPT-2: MLP width, elements; null: 4 x n_embd."),
    ] = UNSET
    n_positions: Annotated[
        Positions | None | UnsetType,
        Meta(description="GPT-2: longest context, tokens (rows of the learned position table)."),
    ] = UNSET
    # BERT.
    type_vocab_size: Annotated[
        Count | None | UnsetType,
        Meta(description="BERT: rows of the token-type embedding (default 2)."),
    ] = UNSET


class HFTextConfig(_ConfigBase, frozen=True, kw_only=True, omit_defaults=True):
    """Gemma 3's nested ``text_config`` (model_type ``gemma3_text``)."""

    model_type: Annotated[
        Literal["gemma3_text"], Meta(description="Always `gemma3_text` (the default).")
    ] = "gemma3_text"


class HFVisionConfig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Gemma 3's SigLIP ``vision_config``: its parameters are loaded beside the language model."""

    model_type: Annotated[
        str | None | UnsetType,
        Meta(description="The vision tower's type (`siglip_vision_model`); accepted, not checked."),
    ] = UNSET
    hidden_size: Annotated[
        Dim | None | UnsetType,
        Meta(description="Vision tower width, elements."),
    ] = UNSET
    intermediate_size: Annotated[
        Dim | None | UnsetType,
        Meta(description="Vision tower MLP width, elements."),
    ] = UNSET
    num_hidden_layers: Annotated[
        LayerCount | None | UnsetType,
        Meta(description="Vision tower layers."),
    ] = UNSET
    num_attention_heads: Annotated[
        Dim | None | UnsetType,
        Meta(description="Vision tower attention heads."),
    ] = UNSET
    image_size: Annotated[
        Dim | None | UnsetType,
        Meta(description="Input image side, pixels (sets the patch count and position table)."),
    ] = UNSET
    patch_size: Annotated[
        Dim | None | UnsetType,
        Meta(description="Patch side, pixels."),
    ] = UNSET
    num_channels: Annotated[
        Dim | None | UnsetType,
        Meta(description="Input image channels."),
    ] = UNSET
    vision_use_head: Annotated[
        bool | None | UnsetType,
        Meta(description="A pooling head on the vision tower; true is refused (not supported)."),
    ] = UNSET


class HFConfig(_ConfigBase, frozen=True, kw_only=True, omit_defaults=True):
    """A Hugging Face ``config.json`` as published; keys that do not affect memory are ignored.
    The keys listed are read by the closed forms of their families; any other family's keys are
    read by ``transformers`` itself."""

    model_type: Annotated[
        str,
        Meta(
            pattern=MODEL_TYPE_PATTERN,
            description="The family: any `model_type` the service's `transformers` knows. "
            "Closed forms: " + ", ".join(get_args(ModelType)) + "; the others are built by the "
            "framework.",
        ),
    ]
    quantization_config: Annotated[
        dict[str, Any] | None | UnsetType,
        Meta(
            description="The checkpoint's quantization (`quant_method` awq, gptq, "
            "bitsandbytes, fp8, compressed-tensors, mxfp4, modelopt ...): the deployed format "
            "unless `precision.quantization` is given."
        ),
    ] = UNSET
    text_config: Annotated[
        HFTextConfig | None | UnsetType,
        Meta(
            description="Gemma 3 (model_type `gemma3`): the language model's config; its "
            "missing keys take Gemma3TextConfig's defaults. Ignored by other families."
        ),
    ] = UNSET
    vision_config: Annotated[
        HFVisionConfig | None | UnsetType,
        Meta(
            description="Gemma 3 (model_type `gemma3`): the SigLIP vision tower loaded beside "
            "the language model; missing keys take SiglipVisionConfig's defaults."
        ),
    ] = UNSET


_MODEL_TYPE = re.compile(MODEL_TYPE_PATTERN)


def check_config(config: Mapping[str, Any]) -> None:
    """A pasted ``config.json``: ``model_type`` is a family name; a closed-form family's keys
    have the types and ranges above (errors name the key, e.g. ``- at `$.config.hidden_size```).
    Other families' keys are checked by ``transformers`` when the model is built."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not _MODEL_TYPE.match(model_type):
        raise ValueError(
            "model_type is required: a family name such as `llama` or `t5` (1..64 of "
            "A-Z a-z 0-9 _ -) - at `$.config.model_type`"
        )
    if model_type in CLOSED_FORM_FAMILIES:
        typed_config(config)


def check_framework_limits(config: Mapping[str, Any]) -> None:
    """What the framework may be asked to build: layer counts within 0 .. 1024 (in the config
    and its nested sub-configs) and layers x routed experts at most 65,536 -- checked before a
    model is built (``InvalidWorkload`` naming ``config.<key>``), since a framework-built model
    has Python objects per layer and expert."""
    counts = _check_layer_counts(config, "config")
    layers = max((v for k, v in counts if k == "layers"), default=1)
    experts = max((v for k, v in counts if k == "experts"), default=1)
    if layers * experts > MAX_FRAMEWORK_EXPERT_LAYERS:
        raise InvalidWorkload(
            "config",
            f"layers x experts must be at most {MAX_FRAMEWORK_EXPERT_LAYERS} (a framework-"
            f"built model has a module per expert and layer), got {layers} x {experts}",
        )


_LAYER_KEY = re.compile(r"(^|_)(layers?|blocks?|depth)$|^n_layers?$")
MAX_FRAMEWORK_LAYERS = 1024
"""The most layers a key of a framework-built config may name (the service builds the model on
the meta device: a layer costs no memory but Python objects and time)."""


_EXPERT_KEY = re.compile(r"(^|_)(experts|local_experts|routed_experts)$")
MAX_FRAMEWORK_EXPERT_LAYERS = 1 << 16
"""Layers x routed experts of a framework-built config (DeepSeek-V3: 61 x 256 = 15,616)."""


def _check_layer_counts(
    config: Mapping[str, Any], path: str, depth: int = 0
) -> list[tuple[str, int]]:
    """Layer counts of a config the framework builds stay within 0 .. 1024 (as a closed-form
    family's ``num_hidden_layers``), in the config and its nested sub-configs; the layer and
    expert counts found."""
    found: list[tuple[str, int]] = []
    if depth > 4:
        return found
    for key, value in config.items():
        if isinstance(value, Mapping):
            found += _check_layer_counts(value, f"{path}.{key}", depth + 1)
        elif isinstance(value, int) and not isinstance(value, bool):
            if _LAYER_KEY.search(key):
                if not 0 <= value <= MAX_FRAMEWORK_LAYERS:
                    raise InvalidWorkload(
                        f"{path}.{key}",
                        f"must be in 0 .. {MAX_FRAMEWORK_LAYERS} (layers), got {value}",
                    )
                found.append(("layers", value))
            elif _EXPERT_KEY.search(key) and value > 0:
                found.append(("experts", value))
    return found


_KEYS: BoundedCache[int, tuple[Mapping[Any, Any], bytes]] = BoundedCache(1024)


def config_key(config: Mapping[Any, Any]) -> bytes:
    """The canonical encoding of a config (keys sorted): the key of every cache over configs.
    Kept per config object, so a request's config is encoded once however many caches it
    reaches (the entry holds the object, so its id cannot be reused while it is kept; a config
    is never changed once decoded)."""
    hit = _KEYS.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    return _KEYS.put(id(config), (config, msgspec.json.encode(config, order="sorted")))[1]


_TYPED: BoundedCache[bytes, HFConfig] = BoundedCache(512)


def typed_config(config: Mapping[str, Any]) -> HFConfig:
    """The typed view of a closed-form family's config (``ValueError`` naming the key)."""
    key = config_key(config)
    cached = _TYPED.get(key)
    if cached is not None:
        return cached
    try:
        typed = msgspec.convert(config, HFConfig)
    except msgspec.ValidationError as exc:
        message = str(exc).replace("- at `$", "- at `$.config", 1)
        if "- at `$.config" not in message:
            message += " - at `$.config`"
        raise ValueError(message) from None
    return _TYPED.put(key, typed)
