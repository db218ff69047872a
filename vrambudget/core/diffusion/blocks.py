"""The tensors of diffusers' building blocks, in the order their ``forward`` allocates them
(inference: ``torch.no_grad``, nothing saved for backward). Every function receives its input
already allocated and held by the caller (a Python variable of the calling frame keeps it alive
until the call returns) and returns the handle of its output; everything else it allocates is
freed where CPython drops the last reference (a rebound variable, a consumed temporary, the
frame's return).

Sizes: ``n`` positions (batch x height x width, or batch x tokens) times channels times ``e``
bytes of the compute dtype. Norm statistics (mean / rstd per group or row) and time embeddings
are a few KB and left out.

Sources (diffusers 0.42.1, ``models/``): ``resnet.py`` ``ResnetBlock2D.forward`` (lines
319-377), ``attention_processor.py`` ``AttnProcessor2_0.__call__``, ``SlicedAttnProcessor``
(lines 4000-4085) and ``Attention.get_attention_scores`` (lines 659-704), ``attention.py``
``BasicTransformerBlock.forward`` and ``FeedForward``, ``activations.py`` ``GEGLU`` / ``GELU``,
``transformers/transformer_2d.py`` (``_operate_on_continuous_inputs``,
``_get_output_for_continuous_inputs``), ``upsampling.py`` ``Upsample2D.forward`` (lines
140-190), ``downsampling.py`` ``Downsample2D.forward``. The attention kernels allocate what
PyTorch's CUDA SDPA backends allocate (the backend ``sdp_utils.cpp`` selects,
:func:`vrambudget.core.formulas.sdpa.sdpa_backend`, the rule the trace tier emulates;
``flash_api.cpp``, ``attention.cu``, ``attention.cpp`` ``_scaled_dot_product_attention_math``).
"""

from __future__ import annotations

from ..formulas.sdpa import lse_rows, sdpa_backend
from .walk import Walk

__all__ = [
    "attention",
    "downsample",
    "resnet",
    "sdpa",
    "transformer_2d",
    "upsample",
]


def resnet(w: Walk, n: int, cin: int, cout: int, e: int, temb: bool) -> int:
    """``ResnetBlock2D`` (``time_embedding_norm="default"``): norm1, silu, conv1, (+ temb),
    norm2, silu, conv2, the 1x1 ``conv_shortcut`` when the channels change, then
    ``(input + hidden) / output_scale_factor``.

    Live above the input, at most ``max(2 cin, cin + cout, 3 cout [+ cout with a shortcut])``
    channels x ``n`` x ``e``. Worked number: SD 1.5's last up block, 960 -> 320 channels at
    64 x 64 x 2 (CFG): 2 x 960 x 8192 x 2 B = 31,457,280 B."""
    s_in, s_out = n * cin * e, n * cout * e
    g = w.alloc(s_in)  # norm1
    a = w.alloc(s_in)  # nonlinearity
    w.free(g)
    h = w.alloc(s_out)  # conv1
    w.free(a)
    if temb:
        t = w.alloc(s_out)  # hidden_states + temb[:, :, None, None]
        w.free(h)
        h = t
    g = w.alloc(s_out)  # norm2
    w.free(h)
    a = w.alloc(s_out)  # nonlinearity (dropout is the identity in eval)
    w.free(g)
    h = w.alloc(s_out)  # conv2
    w.free(a)
    sc = w.alloc(s_out) if cin != cout else None  # conv_shortcut(input_tensor)
    total = w.alloc(s_out)  # input_tensor + hidden_states
    out = w.alloc(s_out)  # / output_scale_factor
    w.free(total, h)
    if sc is not None:
        w.free(sc)
    return out


def sdpa(w: Walk, b: int, heads: int, sq: int, sk: int, d: int, e: int, mask: bool = False) -> int:
    """``F.scaled_dot_product_attention`` on CUDA, inference, with the backend ``sdp_utils.cpp``
    picks (:func:`~vrambudget.core.formulas.sdpa.sdpa_backend`): flash (fp16/bf16, head dim
    <= 256 and a multiple of 8, no mask) allocates the output and an fp32 log-sum-exp of
    ``b x heads x sq``; the memory-efficient kernel (an aligned head dim: fp32, a larger head,
    an additive mask) the output and the log-sum-exp padded to 32 rows -- both O(s), the
    log-sum-exp dropped on return; math (a head dim the kernels cannot align, or bf16 on a GPU
    below sm80: :attr:`Walk.flash_hw`) materializes the ``sq x sk`` scores
    (:func:`_math_sdpa`)."""
    backend = sdpa_backend(
        half=e == 2,
        bf16=w.bf16 and e == 2,
        head_dim=d,
        v_head_dim=d,
        mask=mask,
        gqa=False,
        flash_hw=w.flash_hw,
    )
    if backend == "math":
        return _math_sdpa(w, b * heads, sq, sk, d, e)
    out = w.alloc(b * sq * heads * d * e)
    w.temp(b * heads * lse_rows(backend, sq) * 4)
    return out


def _math_sdpa(w: Walk, bh: int, sq: int, sk: int, d: int, e: int) -> int:
    """``_scaled_dot_product_attention_math`` (a composite of plain ops, the same on every
    device) on ``bh`` = batch x heads rows: 16-bit inputs are upcast to fp32 first (q, k, v
    copies), q and the transposed k scaled by sqrt(scale), the fp32 scores, ``_safe_softmax``
    (an additive mask is added in place; inside, an ``isneginf`` bool mask of the scores and a
    flag per row), the probabilities cast back (returned as the second output and dropped by
    ``F.scaled_dot_product_attention``), the product with v in fp32 and its cast back (the
    same ops as :func:`vrambudget.workloads.kernels.emulated_sdpa` runs). Worked number: 2 x 3
    rows of 50 tokens, head dim 20, fp16: 231,300 B live above the inputs inside the softmax."""
    nq, nk, ns = bh * sq * d, bh * sk * d, bh * sq * sk
    upcast = e != 4
    copies = [w.alloc(4 * n) for n in (nq, nk, nk)] if upcast else []  # query_acc, key_acc ...
    q = w.alloc(4 * nq)  # query * sqrt(scale)
    k = w.alloc(4 * nk)  # key.transpose(-2, -1) * sqrt(scale)
    scores = w.alloc(4 * ns)  # matmul
    w.free(k)
    probs = w.alloc(4 * ns)  # _safe_softmax: its output,
    w.temp(ns, bh * sq)  # its isneginf bool mask and all-masked-rows flags (freed inside)
    w.free(scores)
    if not upcast:
        out = w.alloc(4 * nq)  # matmul(attn, value); .to(fp32) is the same tensor
        w.free(q, probs)
        return out
    attn = w.alloc(e * ns)  # attn.to(origin dtype)
    out32 = w.alloc(4 * nq)  # matmul(attn, value_acc)
    out = w.alloc(e * nq)  # .to(origin dtype)
    w.free(out32, probs, q, *reversed(copies), attn)
    return out


def _sliced(w: Walk, b: int, heads: int, sq: int, sk: int, d: int, e: int, slice_size: int) -> int:
    """``SlicedAttnProcessor``: q, k, v to (batch x heads, s, d) copies, a zeros output, and per
    slice of ``slice_size`` of the batch x heads rows ``baddbmm`` on an empty input
    (``get_attention_scores``) then ``softmax``: two ``slice x sq x sk`` score matrices live at
    once, then ``bmm`` with v."""
    rows = b * heads
    out = w.alloc(rows * sq * d * e)  # torch.zeros((batch*heads, s, d))
    for start in range(0, rows, slice_size):
        k = min(slice_size, rows - start)
        scores = k * sq * sk * e
        base = w.alloc(scores)  # torch.empty(...) baddbmm input
        s = w.alloc(scores)  # baddbmm
        w.free(base)
        p = w.alloc(scores)  # softmax
        w.free(s)
        a = w.alloc(k * sq * d * e)  # bmm(attn_slice, value)
        w.free(p, a)  # copied into the output slice
    return out


def _copied(w: Walk, size: int) -> int:
    """A projection immediately copied by a reshape (the projection is dropped)."""
    proj = w.alloc(size)
    copy = w.alloc(size)
    w.free(proj)
    return copy


def attention(
    w: Walk,
    b: int,
    sq: int,
    sk: int,
    inner: int,
    heads: int,
    e: int,
    *,
    slice_size: int | None = None,
) -> int:
    """``Attention`` with ``AttnProcessor2_0`` on a 3-D input held by the caller: q, k, v
    projections, the kernel, ``to_out`` and the division by ``rescale_output_factor``; q, k, v
    live until the processor returns. With attention slicing (``slice_size``),
    ``SlicedAttnProcessor``: the projections are reshaped to (batch x heads) copies."""
    d = inner // heads
    kv = b * sk * inner * e
    u = b * sq * inner * e
    if slice_size is None:
        q = w.alloc(u)  # to_q
        k = w.alloc(kv)  # to_k
        v = w.alloc(kv)  # to_v
        out = sdpa(w, b, heads, sq, sk, d, e)
    else:
        q = _copied(w, u)  # to_q, then head_to_batch_dim (a reshape of a permute: a copy)
        k = _copied(w, kv)
        v = _copied(w, kv)
        sliced = _sliced(w, b, heads, sq, sk, d, e, slice_size)
        out = w.alloc(u)  # batch_to_head_dim copy
        w.free(sliced)
    o = w.alloc(u)  # to_out[0]
    w.free(out)
    r = w.alloc(u)  # / rescale_output_factor
    w.free(o, q, k, v)
    return r


def basic_transformer_block(
    w: Walk,
    b: int,
    s: int,
    c: int,
    heads: int,
    e: int,
    cross_tokens: int,
    slice_size: int | None,
) -> int:
    """``BasicTransformerBlock`` (``norm_type="layer_norm"``, GEGLU feed-forward): norm1,
    self-attention, residual, norm2, cross-attention on the text tokens, residual, norm3, GEGLU
    (``proj`` to 8c, ``gelu`` of the gate half, the product), ``net[2]``, residual.

    Live above the input at the GEGLU product: the cross-attention output, the residual stream,
    norm3's output (1 each), ``proj`` 8, ``gelu`` 4 and the product 4: 19 x ``c`` x ``b s e``.
    Worked number: SD 1.5 at 64 x 64 x 2 (CFG), c = 320: 19 x 320 x 8192 x 2 B =
    99,614,720 B."""
    u = b * s * c * e
    n1 = w.alloc(u)  # norm1
    d1 = attention(w, b, s, s, c, heads, e, slice_size=slice_size)
    h = w.alloc(u)  # attn_output + hidden_states
    n2 = w.alloc(u)  # norm2
    w.free(n1)
    d2 = attention(w, b, s, cross_tokens, c, heads, e, slice_size=slice_size)
    w.free(d1)  # attn_output rebound
    h2 = w.alloc(u)  # attn_output + hidden_states
    w.free(h)
    n3 = w.alloc(u)  # norm3
    w.free(n2)
    proj = w.alloc(8 * u)  # GEGLU proj: hidden_states, gate = chunk(2)
    gate = w.alloc(4 * u)  # gelu(gate)
    prod = w.alloc(4 * u)  # hidden_states * gelu(gate)
    w.free(gate, proj)
    f = w.alloc(u)  # net[2]
    w.free(prod)
    h3 = w.alloc(u)  # ff_output + hidden_states
    w.free(h2, f, n3, d2)
    return h3


def transformer_2d(
    w: Walk,
    b: int,
    s: int,
    c: int,
    heads: int,
    depth: int,
    e: int,
    cross_tokens: int,
    linear: bool,
    slice_size: int | None,
) -> int:
    """``Transformer2DModel`` on continuous inputs: GroupNorm, ``proj_in`` (1x1 conv then the
    (b, s, c) copy, or the copy then a Linear), ``depth`` blocks, the copy back and
    ``proj_out``, plus the residual. Its input (the residual) is held by the caller.

    Worked number: one block at SD 1.5's 64 x 64 x 2, c = 320: the block input and the 19
    above: 20 x 320 x 8192 x 2 B = 104,857,600 B live above the residual."""
    u = b * s * c * e
    g = w.alloc(u)  # norm
    if linear:
        x = w.alloc(u)  # permute(0, 2, 3, 1).reshape
        w.free(g)
        p = w.alloc(u)  # proj_in
        w.free(x)
    else:
        q = w.alloc(u)  # proj_in
        w.free(g)
        p = w.alloc(u)  # permute(0, 2, 3, 1).reshape
        w.free(q)
    x = p
    for _ in range(depth):
        out = basic_transformer_block(w, b, s, c, heads, e, cross_tokens, slice_size)
        w.free(x)
        x = out
    a = w.alloc(u)  # proj_out (linear) / the contiguous copy (conv)
    w.free(x)
    o = w.alloc(u)  # the contiguous copy (linear) / proj_out (conv)
    w.free(a)
    r = w.alloc(u)  # hidden_states + residual
    w.free(o)
    return r


def upsample(w: Walk, n: int, c: int, e: int) -> int:
    """``Upsample2D``: ``F.interpolate(scale_factor=2, mode="nearest")`` then the 3x3 conv, both
    4 x ``n`` positions."""
    i = w.alloc(4 * n * c * e)
    o = w.alloc(4 * n * c * e)
    w.free(i)
    return o


def downsample(w: Walk, n: int, c: int, e: int, pad: bool = False) -> int:
    """``Downsample2D``: the stride-2 conv (the VAE encoder pads first); ``n`` / 4 out."""
    if pad:
        w.temp(n * c * e)
    return w.alloc(n // 4 * c * e)
