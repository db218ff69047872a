"""GPT-2 and BERT: LayerNorm, learned positions, GELU MLP with biases."""

from __future__ import annotations

from ..arch import Arch, AttentionKind, LayerType, Role, Split
from .config import _Cfg
from .tensors import T, linear, norm


def _gpt2(c: _Cfg) -> Arch:
    h, L, a = c.require("n_embd"), c.require("n_layer"), c.require("n_head")
    f = c.get("n_inner") or 4 * h
    V, P = c.require("vocab_size"), c.require("n_positions")
    layer = LayerType(
        AttentionKind.FULL,
        None,
        False,
        tuple(
            [
                *norm("ln_1", h, layernorm=True),
                *linear("attn.c_attn", 3 * h, h, Split.COLUMN, bias=True),
                *linear("attn.c_proj", h, h, Split.ROW, bias=True),
                *norm("ln_2", h, layernorm=True),
                *linear("mlp.c_fc", f, h, Split.COLUMN, bias=True),
                *linear("mlp.c_proj", h, f, Split.ROW, bias=True),
            ]
        ),
    )
    return Arch(
        model_type="gpt2",
        # GPT2Config's default; GPT2MLP runs ACT2FN[config.activation_function]
        activation=c.get("activation_function", "gelu_new"),
        eager_softmax_fp32=False,  # modeling_gpt2.py eager_attention_forward: softmax(w, dim=-1)
        kind="decoder",
        hidden_size=h,
        num_layers=L,
        num_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        intermediate_size=f,
        vocab_size=V,
        max_positions=P,
        mlp="dense",
        norm="layernorm",
        tie_word_embeddings=True,
        qk_norm=False,
        sandwich_norms=False,
        layer_runs=((layer, L),),
        embeddings=(
            T("wte", V, h, Role.EMBEDDING, Split.VOCAB),
            T("wpe", P, h, Role.EMBEDDING, Split.REPLICATED),
        ),
        head=tuple(norm("ln_f", h, layernorm=True)),
    )


def _bert(c: _Cfg) -> Arch:
    h, L, a = (
        c.require("hidden_size"),
        c.require("num_hidden_layers"),
        c.require("num_attention_heads"),
    )
    f, V = c.require("intermediate_size"), c.require("vocab_size")
    P, types = c.require("max_position_embeddings"), c.get("type_vocab_size", 2)
    layer = LayerType(
        AttentionKind.FULL,
        None,
        False,
        tuple(
            [
                *linear("attention.self.query", h, h, Split.COLUMN, bias=True),
                *linear("attention.self.key", h, h, Split.KV_COLUMN, bias=True),
                *linear("attention.self.value", h, h, Split.KV_COLUMN, bias=True),
                *linear("attention.output.dense", h, h, Split.ROW, bias=True),
                *norm("attention.output.LayerNorm", h, layernorm=True),
                *linear("intermediate.dense", f, h, Split.COLUMN, bias=True),
                *linear("output.dense", h, f, Split.ROW, bias=True),
                *norm("output.LayerNorm", h, layernorm=True),
            ]
        ),
    )
    # BertModel with its pooler (what AutoModel loads). The pre-training heads of the hub
    # checkpoint (BertForPreTraining: MLM transform + decoder bias, NSP classifier) are counted
    # as checkpoint-only parameters: transform dense h*h+h, LayerNorm 2h, decoder bias V
    # (decoder weight tied to word embeddings), seq_relationship 2h+2.
    mlm_nsp_heads = (h * h + h) + 2 * h + V + (2 * h + 2)
    return Arch(
        model_type="bert",
        activation=c.get("hidden_act", "gelu"),  # BertConfig's default
        eager_softmax_fp32=False,  # modeling_bert.py eager_attention_forward: softmax(w, dim=-1)
        kind="encoder",
        hidden_size=h,
        num_layers=L,
        num_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        intermediate_size=f,
        vocab_size=V,
        max_positions=P,
        mlp="dense",
        norm="layernorm",
        tie_word_embeddings=True,
        qk_norm=False,
        sandwich_norms=False,
        layer_runs=((layer, L),),
        embeddings=(
            T("word_embeddings", V, h, Role.EMBEDDING, Split.VOCAB),
            T("position_embeddings", P, h, Role.EMBEDDING, Split.REPLICATED),
            T("token_type_embeddings", types, h, Role.EMBEDDING, Split.REPLICATED),
            *norm("embeddings.LayerNorm", h, layernorm=True),
        ),
        head=tuple(linear("pooler.dense", h, h, Split.REPLICATED, bias=True)),
        checkpoint_only_params=mlm_nsp_heads,
    )
