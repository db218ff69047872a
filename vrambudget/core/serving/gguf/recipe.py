"""The ggml type llama-quantize gives each tensor of a named file type (Q4_K_M, IQ3_M, ...).

A transcription of llama.cpp ``src/llama-quant.cpp`` (llama.cpp commit 0c1e570 of 2026-10-01,
as vendored by llama-cpp-python 0.3.36): ``llama_ftype_get_default_type`` (line 881),
``tensor_allows_quantization`` (line 286), ``tensor_get_category`` (line 119),
``llama_tensor_get_type_impl`` (line 446) and ``tensor_type_fallback`` (line 390). Each branch
below names its source line. A file quantized without an importance matrix is assumed (the
``has_imatrix`` branches change three IQ3/Q4_0/Q5_0 cases only).

The K-quant mixes follow one pattern: the default type for the bulk, more bits for ``attn_v``
and ``ffn_down`` of the first and last eighth of the layers and every third one between
(``use_more_bits``), Q6_K for the output head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...arch import Arch
from .types import BLOCKS

__all__ = ["QuantState", "file_type_default", "tensor_type"]

# llama_ftype_get_default_type (llama-quant.cpp:881)
_DEFAULT: dict[str, str] = {
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q8_0": "Q8_0",
    "F16": "F16",
    "BF16": "BF16",
    "F32": "F32",
    "Q2_K_S": "Q2_K",
    "Q2_K": "Q2_K",
    "IQ3_XS": "IQ3_S",
    "Q3_K_S": "Q3_K",
    "Q3_K_M": "Q3_K",
    "Q3_K_L": "Q3_K",
    "Q4_K_S": "Q4_K",
    "Q4_K_M": "Q4_K",
    "Q5_K_S": "Q5_K",
    "Q5_K_M": "Q5_K",
    "Q6_K": "Q6_K",
    "IQ2_XXS": "IQ2_XXS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_XS",
    "IQ2_M": "IQ2_S",
    "IQ3_XXS": "IQ3_XXS",
    "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_M",
    "IQ4_NL": "IQ4_NL",
    "IQ4_XS": "IQ4_XS",
    "IQ3_S": "IQ3_S",
    "IQ3_M": "IQ3_S",
}

_UNQUANTIZED = frozenset({"F32", "F16", "BF16"})
_IQ12 = frozenset({"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_OUTPUT_Q5K = frozenset({"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"})
_MOE8_ATTN_OUT_Q5K = frozenset(
    {
        "Q2_K",
        "IQ3_XS",
        "IQ3_XXS",
        "Q3_K_S",
        "Q3_K_M",
        "IQ4_NL",
        "Q4_K_S",
        "Q4_K_M",
        "IQ3_S",
        "IQ3_M",
        "IQ4_XS",
    }
)
# tensor_type_fallback (llama-quant.cpp:390): rows that are not whole blocks of the target
_FALLBACK: dict[str, str] = {
    **dict.fromkeys(
        ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"), "IQ4_NL"
    ),
    **dict.fromkeys(("Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"),
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}


def file_type_default(file_type: str) -> str:
    """The bulk type of a file type (``llama_ftype_get_default_type``)."""
    return _DEFAULT[file_type]


def _use_more_bits(i: int, n: int) -> bool:
    # llama-quant.cpp:452
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _category(kind: str) -> str:
    """``tensor_get_category`` (llama-quant.cpp:119) on the tensor's GGUF name."""
    if kind == "output":
        return "output"
    if kind == "token_embd":
        return "token_embd"
    for needle, cat in (
        ("attn_qkv", "attn_qkv"),
        ("attn_kv_b", "attn_kv_b"),
        ("attn_v", "attn_v"),
        ("attn_k", "attn_k"),
        ("attn_q", "attn_q"),
        ("attn_output", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        # the source matches "<needle>.weight" for attention and a prefix for the FFN
        if needle.startswith("attn_") and kind == needle:
            return cat
        if needle.startswith("ffn_") and kind.startswith(needle):
            return cat
    return "other"


@dataclass(slots=True)
class QuantState:
    """``quantize_state_impl`` (llama-quant.cpp:168): the counters the mixes read."""

    file_type: str
    n_layer: int
    n_gqa: int
    n_expert: int
    is_70b: bool
    falcon: bool
    n_attention_wv: int
    has_tied_embeddings: bool
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(cls, arch: Arch, file_type: str) -> QuantState:
        n_wv = 0
        for layer, count in arch.layer_runs:
            names = {t.name for t in layer.tensors}
            if names & {"v_proj", "qkv_proj", "attn.c_attn", "kv_b_proj"}:
                n_wv += count
        moe = arch.moe
        return cls(
            file_type=file_type,
            n_layer=arch.num_layers,
            n_gqa=arch.num_heads // max(arch.num_kv_heads, 1),
            n_expert=moe.num_experts if moe is not None else 0,
            # LLM_TYPE_70B: llama-model.cpp sets it for 80-layer Llama / Qwen2 models
            is_70b=arch.num_layers == 80 and arch.model_type in ("llama", "qwen2"),
            falcon=arch.model_type == "falcon",
            n_attention_wv=n_wv,
            has_tied_embeddings=arch.tie_word_embeddings,
        )


def tensor_type(
    qs: QuantState,
    default: str,
    kind: str,
    name: str,
    shape: tuple[int, ...],
    layer: int,
) -> str:
    """The type of one quantizable tensor (2-D or 3-D, not a norm or a router), in file order
    (the counters advance as llama-quantize's do)."""
    if default in _UNQUANTIZED:
        return default
    new = _impl(qs, default, _category(kind), shape, layer)
    return _fallback(new, shape[0])


def _fallback(target: str, ncols: int) -> str:
    block = BLOCKS[target][0]
    if ncols % block == 0:
        return target
    out = _FALLBACK.get(target, target)
    if ncols % BLOCKS[out][0]:
        return "F16"  # llama-quant.cpp:431 "must use F16 due to unusual shape"
    return out


def _impl(qs: QuantState, new: str, cat: str, shape: tuple[int, ...], layer: int) -> str:
    ft = qs.file_type
    if cat == "output" or (qs.has_tied_embeddings and cat == "token_embd"):
        # llama-quant.cpp:490
        if qs.falcon or shape[0] % BLOCKS[new][0]:
            return "Q8_0"
        if ft in _OUTPUT_Q5K:
            return "Q5_K"
        return new if new == "Q8_0" else "Q6_K"
    if cat == "token_embd":
        # llama-quant.cpp:525
        if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return "Q2_K"
        if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return "IQ3_S"
        return new
    attn_v = cat in ("attn_v", "attn_qkv", "attn_kv_b")
    if ft in _IQ12:
        # llama-quant.cpp:543
        if attn_v:
            if qs.n_gqa >= 4 or qs.n_expert >= 4:
                new = "Q4_K"
            else:
                new = "IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K"
            qs.i_attention_wv += 1
        elif qs.n_expert == 8 and cat == "attn_k":
            new = "Q4_K"
        elif cat == "ffn_down":
            if qs.i_ffn_down < qs.n_layer // 8:
                new = "IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K"
            qs.i_ffn_down += 1
        elif cat == "attn_output":
            if qs.n_expert == 8:
                new = "Q5_K"
            elif ft in ("IQ1_S", "IQ1_M"):
                new = "IQ2_XXS"
            elif ft in ("IQ2_S", "IQ2_M"):
                new = "IQ3_S"
        return new
    if attn_v:
        # llama-quant.cpp:567
        gqa4 = qs.n_gqa >= 4
        if ft == "Q2_K":
            new = "Q4_K" if gqa4 else "Q3_K"
        elif ft == "Q2_K_S" and gqa4:
            new = "Q4_K"
        elif ft == "IQ3_XXS":
            new = "Q4_K" if gqa4 else "IQ3_S"  # no imatrix
        elif (ft in ("IQ3_XS", "IQ3_S") and gqa4) or ft == "IQ3_M":
            new = "Q4_K"
        elif ft == "Q3_K_M":
            new = "Q5_K" if qs.i_attention_wv < 2 else "Q4_K"
        elif ft == "Q3_K_L" or (ft in ("IQ4_NL", "IQ4_XS") and gqa4):
            new = "Q5_K"
        elif ft in ("Q4_K_M", "Q5_K_M") and _use_more_bits(qs.i_attention_wv, qs.n_attention_wv):
            new = "Q6_K"
        elif ft == "Q4_K_S" and qs.i_attention_wv < 4:
            new = "Q5_K"
        if qs.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"  # llama-quant.cpp:594
        if qs.n_expert == 8:
            new = "Q8_0"  # llama-quant.cpp:600
        qs.i_attention_wv += 1
        return new
    if cat == "attn_k":
        # llama-quant.cpp:605
        if qs.n_expert == 8:
            return "Q8_0"
        if ft == "IQ3_XS":
            return "IQ3_XXS"
        if ft == "IQ3_XXS":
            return "IQ2_S"
        return new
    if cat == "attn_q":
        # llama-quant.cpp:617
        if ft == "IQ3_XS":
            return "IQ3_XXS"
        if ft == "IQ3_XXS":
            return "IQ2_S"
        return new
    if cat == "ffn_down":
        # llama-quant.cpp:624; the layer comes from the tensor's name when the model has experts
        i, n = (layer if qs.n_expert > 1 else qs.i_ffn_down), qs.n_layer
        if ft == "Q2_K":
            new = "Q3_K"
        elif ft == "Q2_K_S":
            if i < n // 8:
                new = "Q4_K"
        elif ft == "IQ3_XXS":
            new = "Q4_K" if i < n // 8 else "Q3_K"  # no imatrix
        elif ft == "Q3_K_M":
            if i < n // 16:
                new = "Q5_K"
            elif not qs.falcon or _use_more_bits(i, n):
                new = "Q4_K"
            else:
                new = "Q3_K"
        elif ft == "IQ3_M" and (i < n // 8 or (qs.n_expert == 8 and _use_more_bits(i, n))):
            new = "Q4_K"
        elif ft == "Q3_K_L":
            new = "Q4_K" if qs.falcon else "Q5_K"
        elif ft == "Q4_K_M":
            if qs.falcon:
                new = "Q6_K" if i < n // 16 else ("Q5_K" if _use_more_bits(i, n) else "Q4_K")
            elif _use_more_bits(i, n):
                new = "Q6_K"
        elif i < n // 8 and ft in ("IQ4_NL", "IQ4_XS"):
            new = "Q5_K"  # no imatrix
        elif ft == "Q5_K_M" and _use_more_bits(i, n):
            new = "Q6_K"
        elif ft == "Q4_K_S" and not qs.falcon and i < n // 8:
            new = "Q5_K"
        qs.i_ffn_down += 1
        return new
    if cat == "attn_output":
        # llama-quant.cpp:669
        if not qs.falcon:
            if qs.n_expert == 8:
                if ft in _MOE8_ATTN_OUT_Q5K:
                    new = "Q5_K"
            else:
                new = {
                    "Q2_K": "Q3_K",
                    "IQ3_XXS": "IQ3_S",
                    "Q3_K_M": "Q4_K",
                    "Q3_K_L": "Q5_K",
                    "IQ3_M": "Q4_K",
                }.get(ft, new)
        elif ft == "Q3_K_L":
            new = "Q4_K"
        return new
    if cat in ("ffn_gate", "ffn_up"):
        # llama-quant.cpp:696 / 704
        key = f"i_{cat}"
        i = layer if qs.n_expert > 1 else qs.counters.get(key, 0)
        n = qs.n_layer
        if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
            new = "IQ3_XXS"
        qs.counters[key] = qs.counters.get(key, 0) + 1
        return new
    return new
