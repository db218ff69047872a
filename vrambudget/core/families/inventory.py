"""A framework's tensor inventory (:mod:`vrambudget.core.inventory`) to an ``Arch``: any model
``transformers`` can build, without a closed form of its family.

Weights are exact (every tensor the framework creates, in the dtype it loads it in); the KV
cache and recurrent state per layer are the framework cache's, measured; what the closed forms
know and an inventory does not say -- how tensor parallelism would split an unfamiliar
projection, the activations of an unfamiliar layer -- is inferred from module names and listed
in :func:`assumptions`.

Tensor-parallel splits follow module names as Megatron-LM and vLLM shard them (column-parallel
inputs of attention and MLP, row-parallel outputs, key/value heads, vocabulary rows); a matrix
whose name says nothing is replicated, which can only overstate a device's share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

from ..arch import Arch, AttentionKind, LayerType, MoE, Role, Split, TensorGroup
from ..dtypes import torch_dtype_name
from ..inventory import CacheLayer, InvTensor, ModelInventory
from .tensors import compress_runs

__all__ = ["arch_from_inventory", "assumptions"]

_COLUMN = frozenset(
    {
        "q_proj", "query", "q", "wq", "q_lin", "gate_proj", "up_proj", "fc1", "c_fc", "w1",
        "w3", "gate_up_proj", "query_key_value", "qkv_proj", "qkv", "Wqkv", "c_attn",
        "dense_h_to_4h", "in_proj", "in_proj_qkvz", "in_proj_ba", "wi", "wi_0", "wi_1",
        "fc_in", "lin1", "intermediate", "ff1", "linear_fc1", "gate", "up",
    }
)  # fmt: skip
_KV = frozenset({"k_proj", "v_proj", "key", "value", "k", "v", "wk", "wv", "k_lin", "v_lin"})
_ROW = frozenset(
    {
        "o_proj", "out_proj", "c_proj", "down_proj", "fc2", "w2", "dense_4h_to_h", "wo",
        "fc_out", "out_lin", "lin2", "ff2", "linear_fc2", "down", "proj", "o",
    }
)  # fmt: skip
_GATED = frozenset({"gate_proj", "gate_up_proj", "w1", "wi_0", "gate", "linear_fc1"})
_MULTIMODAL = (
    "vision",
    "visual",
    "image",
    "audio",
    "multi_modal_projector",
    "mm_projector",
    "patch_embed",
    "speech",
)


def _numel(shape: Iterable[int]) -> int:
    return math.prod(shape)


def _module_name(t: InvTensor) -> tuple[str, str, str]:
    """(parent module name, module name, parameter name) of a pattern."""
    parts = t.pattern.split(".")
    leaf = parts[-1]
    module = parts[-2] if len(parts) > 1 else ""
    parent = parts[-3] if len(parts) > 2 else ""
    return parent, module, leaf


def _split_of(parent: str, module: str, leaf: str) -> Split:
    name = module
    if leaf in ("gate_up_proj", "down_proj", "up_proj"):  # fused 3-D expert parameters
        name = leaf
    if name == "dense":  # BERT / GPT-NeoX / Phi: intermediate.dense widens, the others narrow
        return Split.COLUMN if parent == "intermediate" else Split.ROW
    if name in _KV:
        return Split.KV_COLUMN
    if name in _COLUMN:
        return Split.COLUMN
    if name in _ROW:
        return Split.ROW
    return Split.REPLICATED


def _group(t: InvTensor, vocab: int, per_layer: bool, experts: frozenset[int]) -> TensorGroup:
    parent, module, leaf = _module_name(t)
    owner = t.module
    multiplicity = t.count // max(len(t.layers), 1) if per_layer else t.count
    dtype = None if t.follows else (torch_dtype_name(t.dtype) or "fp32")
    name = t.pattern.split("{}.")[-1] if per_layer else t.pattern
    if leaf == "weight":
        name = name.removesuffix(".weight")
    shape = t.shape or (1,)
    lowered = t.pattern.lower()

    def make(rows: int, cols: int, role: Role, split: Split, count: int) -> TensorGroup:
        return TensorGroup(
            name, rows, cols, role, split, count,
            dtype=dtype, fp32_at_fp16=t.fp32_at_fp16, buffer=t.kind == "buffer",
        )  # fmt: skip

    if any(m in lowered for m in _MULTIMODAL) and not per_layer:
        return make(shape[0], _numel(shape[1:]), Role.VISION, Split.REPLICATED, multiplicity)
    if t.kind == "buffer" or not t.follows:
        return make(shape[0], _numel(shape[1:]), Role.OTHER, Split.REPLICATED, multiplicity)
    if "Norm" in owner or "norm" in module.lower():
        return make(_numel(shape), 1, Role.NORM, Split.REPLICATED, multiplicity)
    if "Embedding" in owner and leaf == "weight":
        split = Split.VOCAB if shape[0] == vocab else Split.REPLICATED
        return make(shape[0], _numel(shape[1:]), Role.EMBEDDING, split, multiplicity)
    if _expert_like(t):
        if leaf.endswith("bias"):
            return make(shape[1], shape[2], Role.BIAS, Split.REPLICATED, shape[0] * multiplicity)
        return make(
            shape[1],
            shape[2],
            Role.EXPERT,
            _split_of(parent, module, leaf),
            shape[0] * multiplicity,
        )
    if leaf.endswith("bias") and len(shape) == 2 and "Expert" in owner:
        return make(shape[1], 1, Role.BIAS, Split.REPLICATED, shape[0] * multiplicity)
    if len(shape) == 1:
        if leaf == "bias":
            split = _split_of(parent, module, leaf)
            bias_split = Split.REPLICATED if split in (Split.ROW, Split.REPLICATED) else split
            if module == "lm_head" or (not per_layer and shape[0] == vocab):
                bias_split = Split.VOCAB
            return make(shape[0], 1, Role.BIAS, bias_split, multiplicity)
        return make(shape[0], 1, Role.OTHER, Split.REPLICATED, multiplicity)
    if len(shape) == 2 and leaf == "weight":
        if not per_layer and shape[0] == vocab and module in ("lm_head", "proj_out", "embed_out"):
            return make(shape[0], shape[1], Role.LM_HEAD, Split.VOCAB, multiplicity)
        if module in ("gate", "router") and (
            "Router" in owner or "Gate" in owner or (shape[0] in experts)
        ):
            return make(shape[0], shape[1], Role.ROUTER, Split.REPLICATED, multiplicity)
        return make(shape[0], shape[1], Role.LINEAR, _split_of(parent, module, leaf), multiplicity)
    # Convolutions and other n-d parameters: first dim by the rest, replicated.
    return make(shape[0], _numel(shape[1:]), Role.OTHER, Split.REPLICATED, multiplicity)


def _expert_like(t: InvTensor) -> bool:
    """A 3-D stack of per-expert parameters (experts first)."""
    return len(t.shape) == 3 and ("Expert" in t.module or "experts" in t.pattern.lower())


def _routers(tensors: tuple[InvTensor, ...]) -> frozenset[int]:
    """Expert counts of the model's 3-D expert parameters (to recognise its routers)."""
    return frozenset(t.shape[0] for t in tensors if _expert_like(t))


def _cache_layer(profile: tuple[CacheLayer, ...] | None, i: int) -> CacheLayer | None:
    if profile is None or i >= len(profile):
        return None
    return profile[i]


def _layer_type(groups: list[TensorGroup], cache: CacheLayer | None) -> LayerType:
    moe = any(g.role is Role.EXPERT for g in groups)
    if cache is None:
        return LayerType(AttentionKind.FULL, None, moe, tuple(groups))
    state = tuple((s.numel, None if s.follows else (torch_dtype_name(s.dtype) or "fp32"))
                  for s in cache.state)  # fmt: skip
    sliding = cache.kind == "sliding" and cache.window is not None
    return LayerType(
        AttentionKind.SLIDING if sliding else AttentionKind.FULL,
        cache.window if sliding else None,
        moe,
        tuple(groups),
        kv_elems=cache.kv_elems_per_token,
        state=state,
    )


def arch_from_inventory(inv: ModelInventory) -> Arch:
    """The ``Arch`` of an inventoried model (cached by the caller, like every ``Arch``)."""
    d = inv.dims
    experts = _routers(inv.tensors)
    stack = inv.stack
    per_layer: dict[int, list[TensorGroup]] = {}
    embeddings: list[TensorGroup] = []
    head: list[TensorGroup] = []
    extras: list[TensorGroup] = []
    for t in inv.tensors:
        if stack is not None and t.pattern.startswith(stack):
            group = _group(t, d.vocab_size, True, experts)
            for i in t.layers:
                per_layer.setdefault(i, []).append(group)
            continue
        group = _group(t, d.vocab_size, False, experts)
        if group.role is Role.EMBEDDING:
            embeddings.append(group)
        elif group.role is Role.LM_HEAD or (
            group.role is Role.NORM and "{}" not in t.pattern and "encoder" not in t.pattern
        ):
            head.append(group)
        else:
            extras.append(group)
    if not embeddings:  # a model without token embeddings (vision, speech): keep a 0-row table
        embeddings.append(TensorGroup("(no token embedding)", 0, 1, Role.EMBEDDING, Split.VOCAB))
    profile = inv.cache.layers if inv.cache else None
    indices = sorted(per_layer)
    layers = [_layer_type(per_layer[i], _cache_layer(profile, n)) for n, i in enumerate(indices)]
    if not layers:  # no stack: one empty layer keeps the stage machinery whole
        layers = [LayerType(AttentionKind.FULL, None, False, (), kv_elems=0)]
    names = {g.name.rsplit(".", 1)[-1] for layer in layers for g in layer.tensors}
    num_experts = max(experts, default=0)
    moe = None
    if num_experts:
        expert_rows = [g for layer in layers for g in layer.tensors if g.role is Role.EXPERT]
        down = [g for g in expert_rows if g.name.endswith("down_proj")]
        width = down[0].cols if down else expert_rows[0].rows
        if down and down[0].rows != d.hidden_size:  # stored (in, out): the width is the rows
            width = down[0].rows
        shared = sum(
            g.rows
            for layer in layers[:1]
            for g in layer.tensors
            if "shared" in g.name and g.name.endswith(("up_proj", "gate_proj"))
            and g.role is Role.LINEAR
        )  # fmt: skip
        moe = MoE(num_experts, d.experts_per_token or 1, width, shared // 2 if shared else 0)
    kind: Literal["decoder", "encoder"] = "encoder" if inv.kind == "encoder" else "decoder"
    heads = d.num_heads
    kv_heads = d.num_kv_heads if d.num_kv_heads and heads % d.num_kv_heads == 0 else heads
    return Arch(
        model_type=inv.model_type,
        kind=kind,
        hidden_size=d.hidden_size,
        num_layers=len(layers),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=d.head_dim,
        intermediate_size=d.intermediate_size,
        vocab_size=d.vocab_size,
        max_positions=d.max_positions,
        mlp="gated" if names & _GATED else "dense",
        norm="rmsnorm" if any("RMS" in t.module for t in inv.tensors) else "layernorm",
        tie_word_embeddings=any(
            a.endswith(("lm_head.weight", "proj_out.weight")) for a, _ in inv.tied
        ),
        qk_norm="q_norm" in names,
        sandwich_norms=False,
        layer_runs=compress_runs(layers),
        embeddings=tuple(embeddings),
        head=tuple(head),
        extras=tuple(extras),
        moe=moe,
        activation=d.activation,
    )


def assumptions(inv: ModelInventory) -> tuple[str, ...]:
    """What the answer for an inventoried model infers rather than knows, in words."""
    out = [
        f"weights: every tensor {inv.library} creates for {inv.architecture} (exact)",
        "activations: the generic transformer formulas over the model's dimensions "
        "(the trace tier runs the model's own code)",
    ]
    if inv.cache is not None:
        out.append(f"KV cache and state: {inv.library} {inv.cache.cache_class} per layer, measured")
    else:
        out.append("KV cache: 2 x kv_heads x head_dim per layer and token (not profiled)")
    out.append("tensor-parallel splits: inferred from module names; unknown ones replicated")
    out.extend(inv.notes)
    return tuple(out)
