"""Prompt encoding: one forward of a CLIP text tower or of the T5 encoder on ``b`` prompts of
``s`` tokens (transformers 5.23.0 ``models/clip/modeling_clip.py`` ``CLIPEncoderLayer``,
``CLIPAttention``, ``CLIPMLP``; ``models/t5/modeling_t5.py`` ``T5Block``, ``T5LayerFF`` and
``T5DenseGatedActDense``).

The working set is small next to the weights (CLIP: 77 tokens; T5: 256 or 512 tokens with a
10,240-wide feed-forward, whose ``wo`` runs in fp32 at fp16 so its input is cast to fp32 first);
what the pipeline keeps are the outputs: SDXL and SD3 ask for every hidden state
(``output_hidden_states=True``) and keep the penultimate one.
"""

from __future__ import annotations

from .blocks import sdpa
from .configs import CLIPTextConfig, T5Config
from .walk import Walk

__all__ = ["clip_forward", "t5_forward"]


def clip_forward(
    w: Walk, c: CLIPTextConfig, b: int, s: int, e: int, hidden_states: bool
) -> tuple[int, list[int]]:
    """Returns (the last hidden state, the kept hidden states: every layer's output with
    ``output_hidden_states``)."""
    h, f = c.hidden_size, c.intermediate_size
    u, uf = b * s * h * e, b * s * f * e
    x = w.alloc(u)  # embeddings: token + position
    kept: list[int] = [x] if hidden_states else []
    for _ in range(c.num_hidden_layers):
        n1 = w.alloc(u)  # layer_norm1
        q, k, v = w.alloc(u), w.alloc(u), w.alloc(u)
        a = sdpa(w, b, c.num_attention_heads, s, s, h // c.num_attention_heads, e)
        o = w.alloc(u)  # out_proj
        w.free(q, k, v, a, n1)
        r = w.alloc(u)  # residual + hidden_states
        w.free(o)
        n2 = w.alloc(u)  # layer_norm2
        f1 = w.alloc(uf)  # fc1
        w.free(n2)
        m = w.alloc(uf)  # quick_gelu: 1.702 * x
        sg = w.alloc(uf)  # sigmoid
        w.free(m)
        act = w.alloc(uf)  # x * sigmoid
        w.free(sg, f1)
        f2 = w.alloc(u)  # fc2
        w.free(act)
        out = w.alloc(u)  # residual + hidden_states
        w.free(f2, r)
        if hidden_states:
            kept.append(out)
        else:
            w.free(x)
        x = out
    last = w.alloc(u)  # final_layer_norm
    if not hidden_states:
        w.free(x)
    return last, kept


def t5_forward(w: Walk, c: T5Config, b: int, s: int, e: int, fp32_wo: bool) -> int:
    """The T5 encoder's last hidden state (layer 0's relative position bias of ``heads x s x
    s`` is kept for every layer; T5LayerNorm computes its variance in fp32)."""
    d, f, heads = c.d_model, c.d_ff, c.num_heads
    inner = heads * c.d_kv
    u, ui, uf = b * s * d * e, b * s * inner * e, b * s * f * e
    x = w.alloc(u)  # embed_tokens
    bias = w.alloc(heads * s * s * e)  # compute_bias, shared by the layers
    for _ in range(c.num_layers):
        n = w.alloc(u)  # layer_norm
        q, k, v = w.alloc(ui), w.alloc(ui), w.alloc(ui)
        a = sdpa(w, b, heads, s, s, c.d_kv, e, mask=True)
        o = w.alloc(u)
        w.free(q, k, v, a, n)
        r = w.alloc(u * (2 if fp32_wo else 1))  # + attention output (fp32 after a fp32 wo)
        w.free(o, x)
        n = w.alloc(u)  # layer_norm
        g0 = w.alloc(uf)  # wi_0
        act = w.alloc(uf)  # act(wi_0)
        w.free(g0)
        g1 = w.alloc(uf) if c.gated else None  # wi_1
        prod = w.alloc(uf) if c.gated else act  # act * wi_1
        if g1 is not None:
            w.free(act, g1)
        if fp32_wo:
            up = w.alloc(2 * uf)  # .to(wo.weight.dtype): fp32
            w.free(prod)
            prod = up
        out = w.alloc(u * (2 if fp32_wo else 1))  # wo
        w.free(prod, n)
        x = w.alloc(u * (2 if fp32_wo else 1))  # hidden_states + dropout(forwarded_states)
        w.free(out, r)
    last = w.alloc(u)  # final_layer_norm
    w.free(x, bias)
    return last
