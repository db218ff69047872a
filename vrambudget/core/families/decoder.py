"""Decoder families with RMSNorm and gated MLPs (Llama and descendants, Gemma, Qwen, DeepSeek):
which layers use a sliding window or experts, the attention (including MLA) and MoE tensors,
and the resolved ``Arch``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..arch import MLA, Arch, AttentionKind, LayerType, MoE, Role, RopeScaling, Split, TensorGroup
from ..errors import InvalidWorkload
from .config import _Cfg
from .tensors import T, compress_runs, gated_mlp, linear, norm

# ---------------------------------------------------------------------------------------------
# Decoder families with RMSNorm and gated MLPs (Llama and descendants, Gemma, Qwen, DeepSeek).
# ---------------------------------------------------------------------------------------------

_QKV_BIAS_FAMILIES = frozenset({"qwen2", "qwen2_moe"})  # Qwen2Attention: q/k/v bias, o_proj none
_QK_NORM_FAMILIES = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text"})
_SANDWICH_FAMILIES = frozenset({"gemma2", "gemma3", "gemma3_text"})
# Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj (modeling_phi3.py Phi3Attention,
# Phi3MLP): the same parameters, but LoRA targets and tensor-parallel splits see two matrices.
# Qwen (v1) fuses q/k/v (c_attn) only.
_FUSED_QKV_FAMILIES = frozenset({"phi3", "qwen"})
_FUSED_GATE_UP_FAMILIES = frozenset({"phi3"})
# Qwen (v1), modeling_qwen.py (trust_remote_code, Qwen/Qwen-72B at 4c539df): QWenAttention's
# fused c_attn (always biased) and c_proj (bias = not no_bias); QWenMLP's w1 (up), w2 (the
# SiLU-gated half) and c_proj, each intermediate_size // 2 wide; wte, ln_f, an untied lm_head.
_QWEN_MODULES = {
    "qkv_proj": "c_attn",
    "o_proj": "c_proj",
    "up_proj": "w1",
    "gate_proj": "w2",
    "down_proj": "c_proj",
    "embed_tokens": "wte",
    "norm": "ln_f",
}


def _layer_attention_kinds(model_type: str, c: _Cfg, num_layers: int) -> list[int | None]:
    """Per layer: the sliding window size, or None for full attention."""
    layer_types = c.get("layer_types")
    window = c.get("sliding_window")
    if layer_types is not None:
        if len(layer_types) != num_layers:
            raise InvalidWorkload(
                "config.layer_types",
                f"has {len(layer_types)} entries; num_hidden_layers is {num_layers}",
            )
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    if model_type in ("mistral", "mixtral", "phi3"):
        return [window] * num_layers  # applied to every layer when set
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if not c.get("use_sliding_window", False) or window is None:
            return [None] * num_layers
        first = c.get("max_window_layers", 0)
        return [window if i >= first else None for i in range(num_layers)]
    if model_type == "gemma2":
        return [window if i % 2 == 0 else None for i in range(num_layers)]
    if model_type in ("gemma3", "gemma3_text"):
        pattern = c.get("sliding_window_pattern", 6)
        return [window if (i + 1) % pattern else None for i in range(num_layers)]
    return [None] * num_layers


def _moe_layer_flags(model_type: str, c: _Cfg, num_layers: int) -> tuple[list[bool], MoE | None]:
    if model_type == "mixtral":
        experts = c.require("num_local_experts")
        moe = MoE(experts, c.require("num_experts_per_tok"), c.require("intermediate_size"), 0)
        return [True] * num_layers, moe
    if model_type in ("qwen2_moe", "qwen3_moe"):
        experts = c.get("num_experts", 0)
        if not experts:
            return [False] * num_layers, None
        step = c.get("decoder_sparse_step", 1)
        only_mlp = set(c.get("mlp_only_layers", ()))
        flags = [i not in only_mlp and (i + 1) % step == 0 for i in range(num_layers)]
        shared = c.get("shared_expert_intermediate_size", 0) if model_type == "qwen2_moe" else 0
        moe = MoE(
            experts, c.require("num_experts_per_tok"), c.require("moe_intermediate_size"), shared
        )
        return flags, moe
    if model_type in ("deepseek_v2", "deepseek_v3"):
        experts = c.get("n_routed_experts")
        if not experts:
            return [False] * num_layers, None
        first_dense = c.get("first_k_dense_replace", 0)
        freq = c.get("moe_layer_freq", 1)
        flags = [i >= first_dense and i % freq == 0 for i in range(num_layers)]
        expert_width = c.require("moe_intermediate_size")
        shared = c.get("n_shared_experts", 0) * expert_width
        return flags, MoE(experts, c.require("num_experts_per_tok"), expert_width, shared)
    return [False] * num_layers, None


def _attention_tensors(
    model_type: str, c: _Cfg, h: int, a: int, kv: int, d: int, mla: MLA | None
) -> list[TensorGroup]:
    if mla is not None:
        qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        groups: list[TensorGroup] = []
        if mla.q_lora_rank:
            groups += linear("q_a_proj", mla.q_lora_rank, h, Split.REPLICATED)
            groups += norm("q_a_layernorm", mla.q_lora_rank, layernorm=False)
            groups += linear("q_b_proj", a * qk_head, mla.q_lora_rank, Split.COLUMN)
        else:
            groups += linear("q_proj", a * qk_head, h, Split.COLUMN)
        groups += linear(
            "kv_a_proj_with_mqa", mla.kv_lora_rank + mla.qk_rope_head_dim, h, Split.REPLICATED
        )
        groups += norm("kv_a_layernorm", mla.kv_lora_rank, layernorm=False)
        groups += linear(
            "kv_b_proj", a * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank, Split.COLUMN
        )
        groups += linear("o_proj", h, a * mla.v_head_dim, Split.ROW)
        return groups
    attention_bias = bool(c.get("attention_bias", False))
    qkv_bias = attention_bias or model_type in _QKV_BIAS_FAMILIES
    if model_type == "qwen":
        qkv_bias, attention_bias = True, not c.get("no_bias", True)
    groups = []
    if model_type in _FUSED_QKV_FAMILIES:  # Phi3Attention: one qkv_proj (modeling_phi3.py)
        groups += linear("qkv_proj", a * d + 2 * kv * d, h, Split.COLUMN, bias=qkv_bias)
        groups += linear("o_proj", h, a * d, Split.ROW, bias=attention_bias)
        return groups
    groups += linear("q_proj", a * d, h, Split.COLUMN, bias=qkv_bias)
    groups += linear("k_proj", kv * d, h, Split.KV_COLUMN, bias=qkv_bias)
    groups += linear("v_proj", kv * d, h, Split.KV_COLUMN, bias=qkv_bias)
    groups += linear("o_proj", h, a * d, Split.ROW, bias=attention_bias)
    if model_type in _QK_NORM_FAMILIES:
        groups += norm("q_norm", d, layernorm=False)
        groups += norm("k_norm", d, layernorm=False)
    return groups


_W123_EXPERTS = frozenset({"mixtral"})
"""Closed-form families whose transformers < 5 experts are ``w1`` / ``w3`` / ``w2`` modules
(``modeling_mixtral.py`` ``MixtralBlockSparseTop2MLP``)."""
_W123 = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def _moe_tensors(model_type: str, c: _Cfg, h: int, moe: MoE) -> list[TensorGroup]:
    groups = [T("router", moe.num_experts, h, Role.ROUTER, Split.REPLICATED)]
    if model_type == "deepseek_v3" and c.get("topk_method") == "noaux_tc":
        # DeepseekV3TopkRouter.e_score_correction_bias: one fp32 bias per expert.
        # transformers keeps it in fp32 (DeepseekV3TopkRouter registers it as an fp32 tensor);
        # the checkpoint stores it F32.
        groups.append(
            T(
                "router.e_score_correction_bias",
                moe.num_experts,
                1,
                Role.ROUTER,
                Split.REPLICATED,
                dtype="fp32",
            )
        )
    experts = gated_mlp(
        "experts.", h, moe.expert_intermediate_size, role=Role.EXPERT, count=moe.num_experts
    )
    if model_type in _W123_EXPERTS:
        # transformers < 5 MixtralBlockSparseTop2MLP: w1 (gate), w3 (up), w2 (down)
        experts = [replace(g, module=_W123[g.name.rsplit(".", 1)[-1]]) for g in experts]
    groups += experts
    if moe.shared_intermediate_size:
        groups += gated_mlp("shared_experts.", h, moe.shared_intermediate_size)
        if model_type == "qwen2_moe":
            groups.append(T("shared_expert_gate", 1, h, Role.ROUTER, Split.REPLICATED))
    return groups


def _mla_from(c: _Cfg) -> MLA:
    return MLA(
        kv_lora_rank=c.require("kv_lora_rank"),
        q_lora_rank=c.get("q_lora_rank"),
        qk_nope_head_dim=c.require("qk_nope_head_dim"),
        qk_rope_head_dim=c.require("qk_rope_head_dim"),
        v_head_dim=c.require("v_head_dim"),
    )


def _decoder(model_type: str, c: _Cfg, *, extras: list[TensorGroup]) -> Arch:
    h = c.require("hidden_size")
    L = c.require("num_hidden_layers")
    a = c.require("num_attention_heads")
    kv = c.get("num_key_value_heads", a)
    d = c.get("head_dim", h // a)
    V = c.require("vocab_size")
    f = c.require("intermediate_size")
    if model_type == "qwen":  # w1 and w2 are each intermediate_size // 2 wide
        d, kv, f = c.get("kv_channels", d), a, f // 2
    tie = bool(c.get("tie_word_embeddings", False))
    mla = _mla_from(c) if model_type in ("deepseek_v2", "deepseek_v3") else None
    if mla is not None:
        d = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        kv = a
    if a % kv:
        raise InvalidWorkload(
            "config.num_key_value_heads", f"must divide num_attention_heads ({a}); got {kv}"
        )
    mlp_bias = bool(c.get("mlp_bias", False)) or (
        model_type == "qwen" and not c.get("no_bias", True)
    )
    windows = _layer_attention_kinds(model_type, c, L)
    moe_flags, moe = _moe_layer_flags(model_type, c, L)
    attention = _attention_tensors(model_type, c, h, a, kv, d, mla)
    norms = 4 if model_type in _SANDWICH_FAMILIES else 2
    norm_groups = [
        T("layernorms", h, 1, Role.NORM, Split.REPLICATED, norms, modules=_norm_modules(model_type))
    ]
    dense_mlp = (
        [
            *linear("gate_up_proj", 2 * f, h, Split.COLUMN, bias=mlp_bias),
            *linear("down_proj", h, f, Split.ROW, bias=mlp_bias),
        ]
        if model_type in _FUSED_GATE_UP_FAMILIES
        else gated_mlp("", h, f, bias=mlp_bias)
    )
    if model_type == "qwen":
        attention, dense_mlp = (
            list(_qwen_modules(tuple(attention))),
            list(_qwen_modules(tuple(dense_mlp))),
        )
    moe_mlp = _moe_tensors(model_type, c, h, moe) if moe else []
    cache: dict[tuple[int | None, bool], LayerType] = {}
    layers = []
    for window, is_moe in zip(windows, moe_flags, strict=True):
        key = (window, is_moe)
        if key not in cache:
            cache[key] = LayerType(
                attention=AttentionKind.SLIDING if window else AttentionKind.FULL,
                window=window,
                moe=is_moe,
                tensors=tuple(norm_groups + attention + (moe_mlp if is_moe else dense_mlp)),
            )
        layers.append(cache[key])
    head = [T("norm", h, 1, Role.NORM, Split.REPLICATED)]
    if not tie:
        head.append(T("lm_head", V, h, Role.LM_HEAD, Split.VOCAB))
    embeddings = [T("embed_tokens", V, h, Role.EMBEDDING, Split.VOCAB)]
    if model_type == "qwen":
        head, embeddings = list(_qwen_modules(tuple(head))), list(_qwen_modules(tuple(embeddings)))
    checkpoint_only = 0
    if model_type == "deepseek_v3" and c.get("num_nextn_predict_layers", 0):
        # The hub checkpoint stores the multi-token-prediction module (DeepSeek-V3 report §2.2):
        # enorm, hnorm, eh_proj (h x 2h), its own embed_tokens and shared_head (norm + head),
        # and one full MoE decoder layer. transformers and vLLM (without speculative decoding)
        # do not load it.
        mtp_layer = LayerType(
            AttentionKind.FULL, None, True, tuple(norm_groups + attention + moe_mlp)
        )
        per_mtp = mtp_layer.num_params + 2 * h + 2 * h * h + V * h + h + V * h
        checkpoint_only = per_mtp * c.get("num_nextn_predict_layers")
    return Arch(
        model_type=model_type,
        kind="decoder",
        hidden_size=h,
        num_layers=L,
        num_heads=a,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=f,
        vocab_size=V,
        max_positions=c.get("max_position_embeddings", 1 << 40),
        mlp="gated",
        norm="rmsnorm",
        tie_word_embeddings=tie,
        qk_norm=model_type in _QK_NORM_FAMILIES,
        sandwich_norms=norms == 4,
        # transformers' Gemma2Config defaults attn_logit_softcapping to 50.0
        attention_softcap=model_type == "gemma2"
        and c.get("attn_logit_softcapping", 50.0) is not None,
        # transformers' Gemma2Config defaults final_logit_softcapping to 30.0 (Gemma 3: None)
        final_softcap=c.get("final_logit_softcapping", 30.0 if model_type == "gemma2" else None)
        is not None,
        layer_runs=compress_runs(layers),
        embeddings=tuple(embeddings),
        head=tuple(head),
        extras=tuple(extras),
        mla=mla,
        moe=moe,
        rope_scaling=_rope_scaling(
            c.get("rope_scaling"), c.get("original_max_position_embeddings")
        ),
        checkpoint_only_params=checkpoint_only,
        mtp_layers=c.get("num_nextn_predict_layers", 0) if model_type == "deepseek_v3" else 0,
        shifted_loss_copy=model_type == "qwen",
        # the key the family's model code reads (Gemma's MLPs: config.hidden_activation)
        activation=(
            c.get("hidden_activation") or c.get("hidden_act")
            if model_type.startswith("gemma")
            else c.get("hidden_act")
        )
        or "",
    )


def _norm_modules(model_type: str) -> tuple[str, ...]:
    """A decoder layer's norms as its modelling code names them: Llama's input_layernorm and
    post_attention_layernorm; Gemma 2/3's sandwich adds pre_ and post_feedforward_layernorm;
    Qwen (v1)'s QWenBlock has ln_1 and ln_2."""
    if model_type == "qwen":
        return ("ln_1", "ln_2")
    pair = ("input_layernorm", "post_attention_layernorm")
    if model_type in _SANDWICH_FAMILIES:
        return (*pair, "pre_feedforward_layernorm", "post_feedforward_layernorm")
    return pair


def _qwen_modules(groups: tuple[TensorGroup, ...]) -> tuple[TensorGroup, ...]:
    """Qwen (v1)'s module names on the shared tensor inventory (what LoRA targets and
    ``modules_to_save`` match: ``_QWEN_MODULES``)."""
    out = []
    for g in groups:
        base = g.name.removesuffix(".bias")
        module = _QWEN_MODULES.get(base)
        out.append(replace(g, module=module) if module else g)
    return tuple(out)


def _rope_scaling(r: Any, top_original: int | None) -> RopeScaling | None:
    """A config's ``rope_scaling``; ``original_max_position_embeddings`` inside it, else at the
    top level (Phi-3's longrope configs put it there)."""
    if r is None:
        return None
    kind = r.rope_type if isinstance(r.rope_type, str) else r.type
    factor = r.factor if isinstance(r.factor, float | int) else None
    original = r.original_max_position_embeddings
    if not isinstance(original, int):
        original = top_original
    return RopeScaling(
        kind=kind.lower() if isinstance(kind, str) else "default",
        factor=factor,
        original_max_positions=original,
    )
