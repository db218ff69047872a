"""The walked working sets against hand computations from diffusers' code: each block's peak
above its input, the UNet's and the VAE decoder's peaks, tiling and slicing, attention
slicing's score matrices."""

from __future__ import annotations

import pytest

from vrambudget.core.diffusion.blocks import attention, resnet, transformer_2d
from vrambudget.core.diffusion.configs import read_config
from vrambudget.core.diffusion.dit import flux_forward, sd3_forward
from vrambudget.core.diffusion.presets import presets
from vrambudget.core.diffusion.unet import unet_forward
from vrambudget.core.diffusion.vae import tile_grid, vae_decode
from vrambudget.core.diffusion.walk import Walk


def _peak(fn: object, *args: object) -> tuple[int, int]:
    """(peak above what was live before, bytes left live) of one walked call."""
    w = Walk()
    w.phase("test")
    out = fn(w, *args)  # type: ignore[operator]
    return w.peak, w._sizes[out]


def _config(preset: str, role: str, cls: str) -> object:
    return read_config(cls, presets()[preset].components[role].config, role)


@pytest.mark.parametrize(
    ("cin", "cout", "temb", "channels"),
    [
        (960, 320, True, 2 * 960),  # 2 cin: norm1 and silu of the input
        (640, 320, True, 2 * 640),  # 2 cin = 4 cout
        (320, 320, True, 4 * 320),  # no shortcut: conv2 out, sum and the division, + silu? no: 3
        (256, 128, False, 2 * 256),  # the VAE's last level (no time embedding)
        (128, 256, False, 5 * 256),  # widening: conv2, shortcut, sum, division (4) + ... = 4
    ],
)
def test_resnet_peak(cin: int, cout: int, temb: bool, channels: int) -> None:
    """max(2 cin, cin + cout, 3 cout + cout with a shortcut) channels x n x e above the input;
    the output (cout) is what stays."""
    n, e = 8192, 2
    expected = max(2 * cin, cin + cout, 3 * cout + (cout if cin != cout else 0))
    if cin == cout == 320:
        assert expected == 3 * 320
    elif cin == 128:
        assert expected == 4 * 256
    else:
        assert expected == channels
    peak, out = _peak(resnet, n, cin, cout, e, temb)
    assert peak == expected * n * e
    assert out == cout * n * e


def test_resnet_worked_number() -> None:
    """SD 1.5's last up block: 960 -> 320 at 64 x 64 x 2 (CFG): 2 x 960 x 8192 x 2 B."""
    peak, _ = _peak(resnet, 64 * 64 * 2, 960, 320, 2, True)
    assert peak == 31_457_280


def test_transformer_2d_is_20_channels_per_token() -> None:
    """Above the residual: the block input (1), cross-attention output, residual stream and
    norm3 output (3), GEGLU proj (8), gelu (4) and product (4): 20 x c x tokens x e.
    SD 1.5 at 64 x 64 x 2, c = 320: 20 x 320 x 8192 x 2 = 104,857,600 B."""
    b, s, c, e = 2, 64 * 64, 320, 2
    peak, out = _peak(transformer_2d, b, s, c, 8, 1, e, 77, False, None)
    assert peak == 20 * c * b * s * e == 104_857_600
    assert out == c * b * s * e
    # depth does not add (each block's input is dropped when the next returns)
    peak10, _ = _peak(transformer_2d, b, s, c, 8, 10, e, 77, True, None)
    assert peak10 == peak


def test_attention_slicing_materializes_two_score_slices() -> None:
    """``SlicedAttnProcessor`` with slice 4 (``auto`` for 8 heads) over (b x heads) = 16 rows:
    at the softmax two score slices of 4 x 4096 x 4096 x 2 B are live, beside q, k, v (as
    (b x heads) copies) and the zeros output (4 x 320 x 8192 x 2 B)."""
    b, s, c, heads, e = 2, 4096, 320, 8, 2
    u = b * s * c * e
    peak, _ = _peak(attention, b, s, s, c, heads, e)
    # SDPA: q, k, v, the kernel's output and to_out's (the fp32 log-sum-exp, b x h x s x 4 B,
    # is dropped with the kernel's return): 5 u
    assert peak == 5 * u
    sliced, _ = _peak(lambda w: attention(w, b, s, s, c, heads, e, slice_size=4))
    assert sliced == 4 * u + 2 * 4 * s * s * e
    assert sliced - peak > 200 * 2**20  # slicing costs memory against the SDPA kernels


def test_unet_peak_sd15() -> None:
    """SD 1.5, 512 x 512, CFG (batch 2): the last up block's attention at 64 x 64 holds the
    block's input (640 channels), its three skips (960), the attention's input (320) and 20 x
    320: 8,320 channels x 8,192 positions x 2 B."""
    c = _config("sd-1.5", "unet", "UNet2DConditionModel")
    peak, out = _peak(unet_forward, c, 2, 64, 64, 2, 77, "none")
    assert peak == (640 + 960 + 320 + 20 * 320) * 8192 * 2 == 136_314_880
    assert out == 2 * 4 * 64 * 64 * 2


def test_unet_peak_sdxl() -> None:
    """SDXL at 1024 x 1024, CFG: the second up block's attention at 64 x 64 (640 channels):
    its input (1280 after the upsample), its skips (640 + 640 + 320), the level-0 skips still
    held (3 x 320 at 128 x 128 = 4 x 960 at 64 x 64), the attention input (640) and 20 x 640."""
    c = _config("sdxl-base-1.0", "unet", "UNet2DConditionModel")
    peak, _ = _peak(unet_forward, c, 2, 128, 128, 2, 77, "none")
    channels = 1280 + (640 + 640 + 320) + 4 * 960 + 640 + 20 * 640
    assert peak == channels * 64 * 64 * 2 * 2


@pytest.mark.parametrize(
    ("preset", "px", "e", "expected"),
    [
        ("sd-1.5", 512, 2, 402_653_184),  # 768 x 512^2 x 2
        ("sdxl-base-1.0", 1024, 4, 3_221_225_472),  # 768 x 1024^2 x 4 (fp32 upcast)
        ("flux.1-schnell", 1024, 2, 1_610_612_736),  # 768 x 1024^2 x 2
    ],
)
def test_vae_decode_is_768_channels_at_full_resolution(
    preset: str, px: int, e: int, expected: int
) -> None:
    """The last up block's first resnet (256 -> 128 with a shortcut) at H x W: its input and
    norm1 / silu of it: 3 x 256 = 768 channels; plus the few tensors below 1 MiB left to the
    small pool (none here: the latent input is held by the caller)."""
    c = _config(preset, "vae", "AutoencoderKL")
    peak, out = _peak(vae_decode, c, 1, px // 8, px // 8, e, False, False)
    assert 768 * px * px * e == expected
    post_quant = c.latent_channels * (px // 8) ** 2 * e if c.use_post_quant_conv else 0  # type: ignore[attr-defined]
    assert peak == expected + post_quant
    assert out == 3 * px * px * e


def test_tiles_follow_tiled_decode() -> None:
    """``tile_latent_min_size`` = sample_size / 8; origins every 75 % of it; a latent no larger
    than one tile is not tiled (SD 1.5 at 512, SDXL at 1024)."""
    sd15 = _config("sd-1.5", "vae", "AutoencoderKL")
    sdxl = _config("sdxl-base-1.0", "vae", "AutoencoderKL")
    assert tile_grid(sd15, 64, 64) is None  # type: ignore[arg-type]
    assert tile_grid(sdxl, 128, 128) is None  # type: ignore[arg-type]
    assert tile_grid(sd15, 128, 128) == ([0, 48, 96], [0, 48, 96])  # type: ignore[arg-type]
    assert tile_grid(sdxl, 256, 192) == ([0, 96, 192], [0, 96])  # type: ignore[arg-type]


def test_tiling_bounds_the_decode_by_one_tile() -> None:
    """SD 1.5 at 1024 x 1024 tiled: one 512 x 512 tile's decoder peak (768 x 512^2 x 2) plus
    the tiles already decoded (8 full or cut tiles of 3 channels, kept for blending)."""
    c = _config("sd-1.5", "vae", "AutoencoderKL")
    whole, _ = _peak(vae_decode, c, 1, 128, 128, 2, False, False)
    tiled, _ = _peak(vae_decode, c, 1, 128, 128, 2, True, False)
    tile = 768 * 512 * 512 * 2 + 4 * 64 * 64 * 2  # + the tile's post_quant_conv output
    # tiles decoded before the last: 4 of 512 x 512, 4 of 512 x 256, the last 256 x 256
    kept = 3 * 2 * (4 * 512 * 512 + 4 * 512 * 256)
    assert tiled <= tile + kept + 3 * 2 * 1024 * 1024 * 2  # + the rows and the final image
    assert tiled >= tile
    assert whole == 768 * 1024 * 1024 * 2 + 4 * 128 * 128 * 2
    assert tiled < whole / 3


def test_slicing_decodes_one_image_at_a_time() -> None:
    c = _config("sdxl-base-1.0", "vae", "AutoencoderKL")
    one, _ = _peak(vae_decode, c, 1, 128, 128, 4, False, False)
    four, _ = _peak(vae_decode, c, 4, 128, 128, 4, False, False)
    sliced, _ = _peak(vae_decode, c, 4, 128, 128, 4, False, True)
    image = 3 * 1024 * 1024 * 4
    assert four == 4 * one
    assert sliced == one + 3 * image  # three decoded images wait for the concatenation


def test_dit_tokens() -> None:
    """SD3: (1024 / 8 / 2)^2 = 4096 image tokens beside 77 + 256 text tokens; FLUX: 4096 and
    512. The feed-forward's 4 x dim projection and activation (8 x dim per token) bound the
    step from below."""
    sd3 = _config("sd3-medium", "transformer", "SD3Transformer2DModel")
    flux = _config("flux.1-schnell", "transformer", "FluxTransformer2DModel")
    peak3, out3 = _peak(sd3_forward, sd3, 2, 128, 128, 2, 77 + 256)
    assert out3 == 2 * 16 * 128 * 128 * 2
    assert peak3 > 8 * 2 * 4096 * 1536 * 2
    peakf, outf = _peak(flux_forward, flux, 1, 128, 128, 2, 512)
    assert outf == 1 * 4096 * 64 * 2
    assert peakf > 8 * (4096 + 512) * 3072 * 2
