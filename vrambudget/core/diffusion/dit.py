"""One forward of a diffusion transformer: ``SD3Transformer2DModel`` (MMDiT) and
``FluxTransformer2DModel`` (double- and single-stream blocks), in the order the code allocates
(diffusers 0.42.1: ``models/transformers/transformer_sd3.py`` ``forward``;
``models/attention.py`` ``JointTransformerBlock.forward`` and ``attention_processor.py``
``JointAttnProcessor2_0``; ``models/transformers/transformer_flux.py`` ``FluxTransformerBlock``,
``FluxSingleTransformerBlock``, ``FluxAttnProcessor``; ``models/embeddings.py``
``apply_rotary_emb`` (lines 973-999); ``models/normalization.py`` ``AdaLayerNormZero``).

Tokens: the latent patches, ``(H / 8 / p) x (W / 8 / p)`` per image with patch p = 2 (SD3
patches inside the model, FLUX packs 2 x 2 latents into 64 channels), and the text tokens (SD3:
77 CLIP + the T5 length; FLUX: the T5 length). Attention is joint over both (O(s) with the SDPA
kernels). Per block the feed-forward is the largest working set: the 4 x dim GELU projection
and its activation (8 x dim per token) beside the residual streams.
"""

from __future__ import annotations

from .blocks import sdpa
from .configs import FluxConfig, SD3Config
from .walk import Walk

__all__ = ["flux_forward", "sd3_forward"]


def _ada_norm(w: Walk, u: int) -> int:
    """``norm(x) * (1 + scale)[:, None] + shift[:, None]``: LayerNorm, the product, the sum
    (each temporary dropped as the next is made)."""
    ln = w.alloc(u)
    p = w.alloc(u)
    w.free(ln)
    s = w.alloc(u)
    w.free(p)
    return s


def _ff(w: Walk, u: int) -> int:
    """``FeedForward(activation_fn="gelu-approximate")``: proj (4u), gelu (4u), net[2] (u)."""
    proj = w.alloc(4 * u)
    g = w.alloc(4 * u)
    w.free(proj)
    out = w.alloc(u)
    w.free(g)
    return out


def _gated_add(w: Walk, residual: int, u: int, x: int) -> int:
    """``residual + gate.unsqueeze(1) * x``: the product, then the sum; ``x`` dropped."""
    g = w.alloc(u)
    w.free(x)
    out = w.alloc(u)
    w.free(g)
    return out


def _rope(w: Walk, u: int) -> int:
    """``apply_rotary_emb`` (``use_real_unbind_dim=-1``): the rotated copy (-x_imag, then the
    stack), ``x.float() * cos``, ``x_rotated.float() * sin`` and their sum in fp32 (2 bytes
    more per element than bf16), cast back."""
    neg = w.alloc(u // 2)
    rot = w.alloc(u)
    w.free(neg)
    xf = w.alloc(2 * u)
    a = w.alloc(2 * u)
    w.free(xf)
    rf = w.alloc(2 * u)
    b = w.alloc(2 * u)
    w.free(rf)
    s = w.alloc(2 * u)
    w.free(a, b)
    out = w.alloc(u)
    w.free(s, rot)
    return out


def _joint_attention(
    w: Walk,
    b: int,
    t: int,
    l_: int,
    d: int,
    heads: int,
    e: int,
    *,
    context_out: bool,
    rope: bool,
    pre_only: bool = False,
) -> tuple[int, int | None]:
    """q, k, v of the image tokens and of the text tokens, concatenated along the sequence
    (the originals dropped by the rebinding), RoPE (FLUX), the kernel on ``t + l_`` tokens, the
    split, ``to_out`` (and ``to_add_out``) on the halves -- a copy first when the batch is
    above 1 (a sequence slice of a batched tensor is not contiguous)."""
    u, uc, ut = b * t * d * e, b * l_ * d * e, b * (t + l_) * d * e
    q, k, v = w.alloc(u), w.alloc(u), w.alloc(u)
    aq, ak, av = w.alloc(uc), w.alloc(uc), w.alloc(uc)
    cats = []
    for x in (q, k, v):
        cats.append(w.alloc(ut))
        w.free(x)
    if rope:
        for i in (0, 1):
            r = _rope(w, ut)
            w.free(cats[i])
            cats[i] = r
    out = sdpa(w, b, heads, t + l_, t + l_, d // heads, e)
    if pre_only:  # FluxSingleTransformerBlock's attention: no to_out
        w.free(*cats, aq, ak, av)
        return out, None
    copy = w.alloc(u) if b > 1 else None
    ctx: int | None = None
    if context_out:
        c2 = w.alloc(uc) if b > 1 else None
        ctx = w.alloc(uc)
        if c2 is not None:
            w.free(c2)
    o = w.alloc(u)
    if copy is not None:
        w.free(copy)
    w.free(out, *cats, aq, ak, av)
    return o, ctx


def sd3_forward(w: Walk, c: SD3Config, b: int, h: int, wd: int, e: int, text: int) -> int:
    """``SD3Transformer2DModel.forward`` on ``b`` latents of ``h`` x ``wd`` and ``text`` tokens of
    ``joint_attention_dim`` (held by the caller); returns the output's handle."""
    d = c.inner
    p = c.patch_size
    t = (h // p) * (wd // p)
    u, uc = b * t * d * e, b * text * d * e
    proj = w.alloc(u)  # pos_embed.proj
    pos = w.alloc(t * d * e)  # cropped_pos_embed (a copy)
    x = w.alloc(u)  # latent + pos_embed
    w.free(proj, pos)
    ctx = w.alloc(uc)  # context_embedder
    for i in range(c.num_layers):
        last = i == c.num_layers - 1
        nx = _ada_norm(w, u)  # norm1
        nc = _ada_norm(w, uc)  # norm1_context (AdaLayerNormZero, or Continuous on the last)
        a, ca = _joint_attention(
            w, b, t, text, d, c.num_attention_heads, e, context_out=not last, rope=False,
        )  # fmt: skip
        x2 = _gated_add(w, x, u, a)  # hidden_states + gate_msa * attn_output
        n2 = _ada_norm(w, u)  # norm2 and the modulation
        w.free(nx)
        f = _ff(w, u)
        x3 = _gated_add(w, x2, u, f)
        w.free(x2, n2)
        if last or ca is None:
            w.free(nc, x, ctx)
            ctx_next = None
        else:
            c2 = _gated_add(w, ctx, uc, ca)
            m = _ada_norm(w, uc)
            w.free(nc)
            fc = _ff(w, uc)
            ctx_next = _gated_add(w, c2, uc, fc)
            w.free(c2, m, x, ctx)
        x = x3
        if ctx_next is not None:
            ctx = ctx_next
    n = _ada_norm(w, u)  # norm_out
    w.free(x)
    o = w.alloc(b * t * p * p * (c.out_channels or c.in_channels) * e)  # proj_out
    w.free(n)
    out = w.alloc(b * t * p * p * (c.out_channels or c.in_channels) * e)  # unpatchify copy
    w.free(o)
    return out


def flux_forward(w: Walk, c: FluxConfig, b: int, h: int, wd: int, e: int, text: int) -> int:
    """``FluxTransformer2DModel.forward`` on ``b`` packed latents (``h`` x ``wd`` latent pixels,
    2 x 2 per token) and ``text`` T5 tokens (held by the caller); returns the output's
    handle."""
    d = c.inner
    t = (h // 2) * (wd // 2)
    u, uc, ut = b * t * d * e, b * text * d * e, b * (t + text) * d * e
    x = w.alloc(u)  # x_embedder
    ctx = w.alloc(uc)  # context_embedder
    rope = w.alloc(2 * (t + text) * c.attention_head_dim * 4)  # pos_embed: cos, sin (fp32)
    for _ in range(c.num_layers):
        nx = _ada_norm(w, u)
        nc = _ada_norm(w, uc)
        a, ca = _joint_attention(
            w, b, t, text, d, c.num_attention_heads, e, context_out=True, rope=True,
        )  # fmt: skip
        assert ca is not None
        x2 = _gated_add(w, x, u, a)
        n2 = _ada_norm(w, u)
        w.free(nx)
        f = _ff(w, u)
        x3 = _gated_add(w, x2, u, f)
        w.free(x2, n2)
        c2 = _gated_add(w, ctx, uc, ca)
        m = _ada_norm(w, uc)
        w.free(nc)
        fc = _ff(w, uc)
        c3 = _gated_add(w, c2, uc, fc)
        w.free(c2, m, x, ctx)
        x, ctx = x3, c3
    for _ in range(c.num_single_layers):
        cat = w.alloc(ut)  # torch.cat([encoder_hidden_states, hidden_states], dim=1)
        w.free(x, ctx)  # the caller's tensors are the previous block's views
        nx = _ada_norm(w, ut)  # norm (AdaLayerNormZeroSingle)
        mlp = w.alloc(4 * ut)  # proj_mlp
        act = w.alloc(4 * ut)  # act_mlp (GELU tanh)
        w.free(mlp)
        a, _ = _joint_attention(
            w, b, t + text, 0, d, c.num_attention_heads, e,
            context_out=False, rope=True, pre_only=True,
        )  # fmt: skip
        both = w.alloc(5 * ut)  # torch.cat([attn_output, mlp_hidden_states], dim=2)
        w.free(a, act)
        po = w.alloc(ut)  # proj_out
        w.free(both)
        out = _gated_add(w, cat, ut, po)  # residual + gate * proj_out(...)
        w.free(nx, cat)
        x, ctx = out, w.alloc(0)  # the two halves are views of one tensor
    w.free(ctx)
    n = _ada_norm(w, u)  # norm_out on the image half
    w.free(x)
    o = w.alloc(b * t * c.in_channels * e)  # proj_out
    w.free(n, rope)
    return o
