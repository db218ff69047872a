"""Model sources to architectures, cached: a model is resolved once per process, not per request.

Presets, explicit dimensions and the configs of closed-form families resolve here, in
microseconds. A Hub repository, a checkpoint's stored tensors and any other family need the
service's lookups and the framework (:class:`~vrambudget.core.resolved.ResolvedModel`); given
one of those unresolved, :class:`NeedsResolution` says so.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Any

from .arch import Arch, AttentionKind, LayerType, MoE, Role, Split, TensorGroup
from .catalog import preset, preset_arch
from .errors import InvalidWorkload
from .families import arch_from_hf_config, gated_mlp, linear, norm
from .families.inventory import arch_from_inventory, assumptions
from .hf_config import CLOSED_FORM_FAMILIES, config_key, typed_config
from .memo import BoundedCache
from .resolved import ResolvedModel
from .result import ModelOrigin
from .spec import DimensionsModel, HFConfigModel, HubModel, ModelSource, PresetModel
from .stored import with_stored_tensors

__all__ = [
    "AnyModel",
    "NeedsResolution",
    "engine_model",
    "model_name",
    "model_origin",
    "needs_resolution",
    "resolve_model",
]

AnyModel = ModelSource | ResolvedModel
"""What a workload's ``model`` holds: a wire source, or the service's resolution of one."""


class NeedsResolution(InvalidWorkload):
    """The source needs the service's lookups or the framework before the core can use it."""


def needs_resolution(source: AnyModel) -> bool:
    """A Hub repository, a config with a checkpoint header, or a config of a family without a
    closed form: the service resolves it (fetch, framework inventory) before computing."""
    match source:
        case HubModel():
            return True
        case HFConfigModel():
            return (
                source.checkpoint is not None
                or source.config.get("model_type") not in CLOSED_FORM_FAMILIES
            )
    return False


def resolve_model(source: AnyModel) -> Arch:
    """Errors name fields relative to the workload (``model.config.hidden_size``)."""
    match source:
        case PresetModel():
            return preset_arch(source.id)
        case ResolvedModel():
            return _from_resolved(source)
        case HFConfigModel():
            if needs_resolution(source):
                raise NeedsResolution(
                    "model.config.model_type",
                    f"{source.config.get('model_type')!r} has no closed form here; it is built "
                    "by the framework (the service does this; in a program, resolve it with "
                    "vrambudget.workloads.hf.resolve)",
                )
            return _from_config(source.config)
        case HubModel():
            raise NeedsResolution(
                "model", "a hub model is fetched by the service before it is budgeted"
            )
        case DimensionsModel():
            try:
                return _from_dimensions(source)
            except InvalidWorkload as exc:
                raise InvalidWorkload(f"model.{exc.field}", exc.message) from None


def model_name(source: AnyModel) -> str:
    match source:
        case PresetModel():
            return str(source.id)
        case ResolvedModel():
            return source.name
        case HFConfigModel():
            return source.name or str(source.config.get("model_type"))
        case HubModel():
            return source.name or source.id
        case DimensionsModel():
            return source.name or "custom"


def engine_model(source: AnyModel) -> str:
    """The model word of a serving engine's launch command: what the engine loads. A preset's
    Hugging Face repository (``llama-3.1-8b`` -> ``meta-llama/Llama-3.1-8B``), a Hub model's
    repository; otherwise the workload's name for it (a config or dimensions: the caller puts
    its checkpoint's path there)."""
    match source:
        case PresetModel():
            return preset(source.id).hf_repo
        case HubModel():
            return source.id
        case ResolvedModel() if source.origin.startswith("hub "):
            return source.origin.removeprefix("hub ").split("@")[0]
    return model_name(source)


def model_origin(source: AnyModel) -> ModelOrigin:
    """Where the architecture came from, in words, with what is inferred (framework-built)."""
    match source:
        case PresetModel():
            config = preset(source.id).config or {}
            family = config.get("model_type", "?")
            return ModelOrigin(source=f"preset {source.id}: closed form ({family})")
        case ResolvedModel():
            inv = source.inventory
            if inv is None:
                family = source.config.get("model_type")
                return ModelOrigin(source=f"{source.origin}: closed form ({family})")
            return ModelOrigin(
                source=f"{source.origin}: {inv.library} {inv.architecture}",
                assumptions=assumptions(inv),
            )
        case HFConfigModel():
            return ModelOrigin(
                source=f"inline config.json: closed form ({source.config.get('model_type')})"
            )
        case HubModel():
            return ModelOrigin(source=f"hub {source.id} (unresolved)")
        case DimensionsModel():
            return ModelOrigin(source="dimensions: closed form")


_CONFIGS: BoundedCache[bytes, Arch] = BoundedCache(512)
_RESOLVED: BoundedCache[str, Arch] = BoundedCache(256)


def _from_config(config: dict[str, Any]) -> Arch:
    key = config_key(config)
    cached = _CONFIGS.get(key)
    if cached is not None:
        return cached
    try:
        arch = arch_from_hf_config(typed_config(config))
    except InvalidWorkload as exc:
        raise InvalidWorkload(f"model.{exc.field}", exc.message) from None
    _CONFIGS.put(key, arch)
    return arch


def _from_resolved(m: ResolvedModel) -> Arch:
    cached = _RESOLVED.get(m.key)
    if cached is not None:
        return cached
    try:
        if m.inventory is not None:
            base = arch_from_inventory(m.inventory)
        elif m.config.get("model_type") in CLOSED_FORM_FAMILIES:
            base = arch_from_hf_config(typed_config(m.config))
        else:
            raise NeedsResolution(
                "model", "this model needs the framework's inventory, which is missing"
            )
        arch = with_stored_tensors(base, m.stored, m.inventory) if m.stored else base
    except InvalidWorkload as exc:
        raise InvalidWorkload(f"model.{exc.field}", exc.message) from None
    _RESOLVED.put(m.key, arch)
    return arch


@lru_cache(maxsize=512)
def _from_dimensions(d: DimensionsModel) -> Arch:
    h, L, a = d.hidden_size, d.num_layers, d.num_attention_heads
    kv = d.num_key_value_heads or a
    if a % kv:
        raise InvalidWorkload("num_key_value_heads", f"{kv} must divide num_attention_heads ({a})")
    if d.head_dim is None and h % a:
        raise InvalidWorkload(
            "hidden_size", f"{h} is not a multiple of num_attention_heads ({a}); give head_dim"
        )
    if d.num_sliding_window_layers > L:
        raise InvalidWorkload("num_sliding_window_layers", f"must be <= num_layers ({L})")
    if d.num_sliding_window_layers and d.sliding_window is None:
        raise InvalidWorkload("sliding_window", "is required with num_sliding_window_layers")
    if d.moe is not None:
        if d.moe.experts_per_token > d.moe.num_experts:
            raise InvalidWorkload(
                "moe.experts_per_token", f"must be <= num_experts ({d.moe.num_experts})"
            )
        if d.moe.num_dense_layers > L:
            raise InvalidWorkload("moe.num_dense_layers", f"must be <= num_layers ({L})")
    hd = d.head_dim or h // a
    f, V = d.intermediate_size, d.vocab_size
    layernorm = d.norm == "layernorm"
    attention = [
        *linear("q_proj", a * hd, h, Split.COLUMN, bias=d.attention_bias),
        *linear("k_proj", kv * hd, h, Split.KV_COLUMN, bias=d.attention_bias),
        *linear("v_proj", kv * hd, h, Split.KV_COLUMN, bias=d.attention_bias),
        *linear("o_proj", h, a * hd, Split.ROW, bias=d.attention_bias),
    ]
    norms = [
        g
        for name in ("input_layernorm", "post_attention_layernorm")
        for g in norm(name, h, layernorm=layernorm)
    ]
    if d.mlp == "gated":
        dense = gated_mlp("", h, f, bias=d.mlp_bias)
    else:
        dense = [
            *linear("fc1", f, h, Split.COLUMN, bias=d.mlp_bias),
            *linear("fc2", h, f, Split.ROW, bias=d.mlp_bias),
        ]
    moe = None
    moe_mlp: list[TensorGroup] = []
    if d.moe is not None:
        m = d.moe
        moe = MoE(
            m.num_experts,
            m.experts_per_token,
            m.expert_intermediate_size,
            m.shared_intermediate_size,
        )
        moe_mlp = [
            TensorGroup("router", m.num_experts, h, Role.ROUTER, Split.REPLICATED),
            *gated_mlp(
                "experts.", h, m.expert_intermediate_size, role=Role.EXPERT, count=m.num_experts
            ),
        ]
        if m.shared_intermediate_size:
            moe_mlp += gated_mlp("shared_experts.", h, m.shared_intermediate_size)
    num_dense = d.moe.num_dense_layers if d.moe else L
    sliding_from = L - d.num_sliding_window_layers  # the last layers slide
    # Build runs directly (a layer list of 10^6 entries would cost time for nothing).
    runs: list[tuple[LayerType, int]] = []
    boundaries = sorted({0, min(num_dense, L), max(sliding_from, 0), L})
    for lo, hi in itertools.pairwise(boundaries):
        if lo >= hi:
            continue
        is_moe = moe is not None and lo >= num_dense
        sliding = lo >= sliding_from and d.num_sliding_window_layers > 0
        layer = LayerType(
            attention=AttentionKind.SLIDING if sliding else AttentionKind.FULL,
            window=d.sliding_window if sliding else None,
            moe=is_moe,
            tensors=tuple(norms + attention + (moe_mlp if is_moe else dense)),
        )
        runs.append((layer, hi - lo))
    embeddings = [TensorGroup("embed_tokens", V, h, Role.EMBEDDING, Split.VOCAB)]
    if d.learned_position_embeddings:
        embeddings.append(
            TensorGroup(
                "position_embeddings",
                d.max_position_embeddings,
                h,
                Role.EMBEDDING,
                Split.REPLICATED,
            )
        )
    head = list(norm("norm", h, layernorm=layernorm))
    if not d.tie_word_embeddings and d.kind == "decoder":
        head.append(TensorGroup("lm_head", V, h, Role.LM_HEAD, Split.VOCAB))
    return Arch(
        model_type="dimensions",
        kind=d.kind,
        hidden_size=h,
        num_layers=L,
        num_heads=a,
        num_kv_heads=kv,
        head_dim=hd,
        intermediate_size=f,
        vocab_size=V,
        max_positions=d.max_position_embeddings,
        mlp=d.mlp,
        norm=d.norm,
        tie_word_embeddings=d.tie_word_embeddings,
        qk_norm=False,
        sandwich_norms=False,
        layer_runs=tuple(runs),
        embeddings=tuple(embeddings),
        head=tuple(head),
        moe=moe,
    )
