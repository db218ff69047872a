"""The VAE decode: ``AutoencoderKL.decode`` with its slicing and tiling (diffusers 0.42.1
``models/autoencoders/autoencoder_kl.py`` lines 199-245 and ``tiled_decode`` lines 364-411) and
the ``Decoder`` of ``models/autoencoders/vae.py`` (``forward``, lines 282-313).

The decoder's feature maps at full resolution dominate: in the last up block the first resnet
maps 256 to 128 channels at H x W with a 1x1 shortcut, so its input (256), norm1 and silu of
the input (2 x 256) are live at once: 768 channels x H x W x e. Worked numbers: SD 1.5 at
512 x 512 in fp16, 768 x 262,144 x 2 B = 402,653,184 B; SDXL at 1024 x 1024, decoded in fp32
(the pipeline upcasts the VAE, ``force_upcast``), 768 x 1,048,576 x 4 B = 3,221,225,472 B.

Tiling (``enable_tiling``) decodes latents larger than ``tile_latent_min_size`` =
``sample_size`` / 2^(levels - 1) in tiles of that size overlapping by 25 %
(``overlap_size = int(tile_latent_min_size x 0.75)``), keeps every decoded tile, blends and
concatenates them: the peak is one tile's decoder peak plus the tiles decoded so far. A latent
no larger than one tile is decoded whole -- SD 1.5 at 512 px (sample_size 512) and SDXL at
1024 px (sample_size 1024) are not tiled at all. Slicing (``enable_slicing``) decodes one image
at a time and concatenates the decoded images.
"""

from __future__ import annotations

from .blocks import resnet, sdpa, upsample
from .configs import VAEConfig
from .walk import Walk

__all__ = ["tile_grid", "vae_decode"]

_OVERLAP = 0.25  # tile_overlap_factor


def _mid_attention(w: Walk, n: int, c: int, e: int, b: int, s: int) -> int:
    """The decoder's single-head ``Attention`` over the latent pixels (AttnProcessor2_0 on a
    4-D input): group_norm, q, k, v (each Linear on the transposed view copies its input
    first), the memory-efficient kernel (head dim ``c`` > 256), ``to_out``, the reshape back
    (a copy), the residual and the rescale."""
    u = n * c * e
    g = w.alloc(u)  # group_norm
    projections = []
    for _ in range(3):
        copy = w.alloc(u)  # the (b, s, c) view made contiguous for the GEMM
        projections.append(w.alloc(u))
        w.free(copy)
    out = sdpa(w, b, 1, s, s, c, e)
    o = w.alloc(u)  # to_out[0]
    w.free(out)
    back = w.alloc(u)  # transpose(-1, -2).reshape(b, c, h, w)
    w.free(o)
    r = w.alloc(u)  # + residual
    w.free(back)
    d = w.alloc(u)  # / rescale_output_factor
    w.free(r, g, *projections)
    return d


def decoder_forward(w: Walk, c: VAEConfig, b: int, h: int, wd: int, e: int) -> int:
    """``Decoder.forward`` on ``b`` latents of ``h`` x ``wd`` (input held by the caller)."""
    rch = list(reversed(c.block_out_channels))
    n_levels = len(rch)
    n = b * h * wd
    x_in = w.alloc(n * rch[0] * e)  # conv_in; held by sample until the mid block returns
    m = resnet(w, n, rch[0], rch[0], e, temb=False)
    if c.mid_block_add_attention:
        a = _mid_attention(w, n, rch[0], e, b, h * wd)
        w.free(m)
        m = a
    x = resnet(w, n, rch[0], rch[0], e, temb=False)
    w.free(m, x_in)
    prev = rch[0]
    for i in range(n_levels):
        block_in = x
        for j in range(c.layers_per_block + 1):
            r = resnet(w, n, prev if j == 0 else rch[i], rch[i], e, temb=False)
            if x != block_in:
                w.free(x)
            x = r
        if i < n_levels - 1:
            u = upsample(w, n, rch[i], e)
            w.free(x)
            x = u
            n *= 4
        w.free(block_in)  # the caller's sample, rebound
        prev = rch[i]
    g = w.alloc(n * rch[-1] * e)  # conv_norm_out
    w.free(x)
    act = w.alloc(n * rch[-1] * e)  # conv_act
    w.free(g)
    out = w.alloc(n * c.out_channels * e)  # conv_out
    w.free(act)
    return out


def _decode_one(w: Walk, c: VAEConfig, b: int, h: int, wd: int, e: int) -> int:
    """``_decode``: ``post_quant_conv`` then the decoder (no tiling)."""
    z = w.alloc(b * h * wd * c.latent_channels * e) if c.use_post_quant_conv else None
    out = decoder_forward(w, c, b, h, wd, e)
    if z is not None:
        w.free(z)
    return out


def tile_grid(c: VAEConfig, h: int, wd: int) -> tuple[list[int], list[int]] | None:
    """The tile origins (latent rows, columns) of ``tiled_decode``, or None when the latent fits
    in one tile (``_decode`` then decodes it whole)."""
    t = c.tile_sample // c.scale
    if h <= t and wd <= t:
        return None
    step = int(t * (1 - _OVERLAP))
    return list(range(0, h, step)), list(range(0, wd, step))


def _tiled(w: Walk, c: VAEConfig, b: int, h: int, wd: int, e: int) -> int:
    grid = tile_grid(c, h, wd)
    assert grid is not None
    t = c.tile_sample // c.scale
    tiles: list[int] = []
    for i in grid[0]:
        for j in grid[1]:
            th, tw = min(t, h - i), min(t, wd - j)
            tiles.append(_decode_one(w, c, b, th, tw, e))
    rows = [w.alloc(b * c.out_channels * c.tile_sample * wd * c.scale * e) for _ in grid[0]]
    out = w.alloc(b * c.out_channels * h * wd * c.scale**2 * e)  # torch.cat(result_rows)
    w.free(*rows, *tiles)
    return out


def vae_decode(
    w: Walk, c: VAEConfig, b: int, h: int, wd: int, e: int, tiling: bool, slicing: bool
) -> int:
    """``AutoencoderKL.decode`` of ``b`` latents (held by the caller); returns the image."""
    tiled = tiling and tile_grid(c, h, wd) is not None
    one = _tiled if tiled else _decode_one
    if slicing and b > 1:
        images = [one(w, c, 1, h, wd, e) for _ in range(b)]
        out = w.alloc(b * c.out_channels * h * wd * c.scale**2 * e)  # torch.cat(slices)
        w.free(*images)
        return out
    return one(w, c, b, h, wd, e)
