"""One ``UNet2DConditionModel`` forward: the tensors in the order ``forward`` allocates them
(diffusers 0.42.1 ``models/unets/unet_2d_condition.py`` lines 1000-1200 and the blocks of
``unet_2d_blocks.py``).

What stays alive is what the code keeps referenced: every down block's outputs (``conv_in``'s
output, each resnet's or attention's output, each downsampler's) are the skip connections held
in ``down_block_res_samples`` until the up block that consumes them has returned (its
``res_samples`` is rebound at the next up block); a block's input is held by the caller's
``sample`` until the block returns; inside an up block each resnet runs on
``torch.cat([hidden_states, res_hidden_states], dim=1)``.

The peak of SD 1.5 at 512 x 512 with CFG (batch 2) is in the last up block's attention at
64 x 64: the up block's input (640 channels), its three skips (960), the attention's input
(320) and 20 x 320 inside: 8,320 channels x 8,192 positions x 2 B = 136,314,880 B.
"""

from __future__ import annotations

from .blocks import downsample, resnet, transformer_2d, upsample
from .configs import UNetConfig
from .walk import Walk

__all__ = ["unet_forward"]


def _slice(slicing: str, heads: int) -> int | None:
    """``set_attention_slice``: ``auto`` = heads // 2, ``max`` = 1 (rows of batch x heads)."""
    if slicing == "auto":
        return max(1, heads // 2)
    if slicing == "max":
        return 1
    return None


def unet_forward(
    w: Walk,
    c: UNetConfig,
    b: int,
    h: int,
    wd: int,
    e: int,
    cross_tokens: int,
    slicing: str = "none",
) -> int:
    """Walk one forward of batch ``b`` on ``h`` x ``wd`` latents (input held by the caller);
    returns the output's handle."""
    ch = c.block_out_channels
    n_levels = len(ch)
    heads = c.heads
    layers = c.per_block(c.layers_per_block, "layers_per_block")
    depth = c.per_block(c.transformer_layers_per_block, "transformer_layers_per_block")
    linear = c.use_linear_projection
    sizes = [(h >> i, wd >> i) for i in range(n_levels)]
    # down: conv_in, then each block's outputs become skips.
    sample = w.alloc(b * h * wd * ch[0] * e)  # conv_in
    skips: list[tuple[int, int]] = [(sample, ch[0])]  # (handle, channels)
    cin = ch[0]
    for i, kind in enumerate(c.down_block_types):
        hh, ww = sizes[i]
        n = b * hh * ww
        x = sample
        for j in range(layers[i]):
            r = resnet(w, n, cin if j == 0 else ch[i], ch[i], e, temb=True)
            if kind == "CrossAttnDownBlock2D":
                a = transformer_2d(
                    w, b, hh * ww, ch[i], heads[i], depth[i], e, cross_tokens, linear,
                    _slice(slicing, heads[i]),
                )  # fmt: skip
                w.free(r)
                r = a
            skips.append((r, ch[i]))
            x = r
        if i < n_levels - 1:
            x = downsample(w, n, ch[i], e)
            skips.append((x, ch[i]))
        sample = x
        cin = ch[i]
    # mid: resnet, attention, resnet; its input stays a skip.
    hh, ww = sizes[-1]
    n = b * hh * ww
    m0 = resnet(w, n, ch[-1], ch[-1], e, temb=True)
    a = transformer_2d(
        w, b, hh * ww, ch[-1], heads[-1], depth[-1], e, cross_tokens, linear,
        _slice(slicing, heads[-1]),
    )  # fmt: skip
    w.free(m0)
    sample = resnet(w, n, ch[-1], ch[-1], e, temb=True)
    w.free(a)
    # up: each block consumes layers + 1 skips from the end.
    rch = list(reversed(ch))
    rheads = list(reversed(heads))
    rdepth = list(reversed(depth))
    rlayers = list(reversed(layers))
    previous: list[int] = []
    for i, kind in enumerate(c.up_block_types):
        level = n_levels - 1 - i
        hh, ww = sizes[level]
        n = b * hh * ww
        count = rlayers[i] + 1
        res = skips[-count:]
        del skips[-count:]
        w.free(*previous)  # the previous block's res_samples, rebound
        previous = [hd for hd, _ in res]
        x = sample
        prev_ch = rch[i - 1] if i else rch[0]
        hidden, hidden_ch = x, prev_ch
        for j in range(count):
            _skip, skip_ch = res[-1 - j]  # the skip is concatenated, then held by res
            cat = w.alloc(n * (hidden_ch + skip_ch) * e)  # torch.cat([hidden, skip], dim=1)
            if hidden != x:
                w.free(hidden)
            r = resnet(w, n, hidden_ch + skip_ch, rch[i], e, temb=True)
            w.free(cat)
            if kind == "CrossAttnUpBlock2D":
                a = transformer_2d(
                    w, b, hh * ww, rch[i], rheads[i], rdepth[i], e, cross_tokens, linear,
                    _slice(slicing, rheads[i]),
                )  # fmt: skip
                w.free(r)
                r = a
            hidden, hidden_ch = r, rch[i]
        if i < n_levels - 1:
            u = upsample(w, n, rch[i], e)
            w.free(hidden)
            hidden = u
        w.free(x)  # sample rebound to the block's output
        sample = hidden
    # conv_norm_out, conv_act, conv_out
    n = b * h * wd
    g = w.alloc(n * ch[0] * e)
    w.free(sample)
    act = w.alloc(n * ch[0] * e)
    w.free(g)
    out = w.alloc(n * c.out_channels * e)
    w.free(act, *previous)
    return out
