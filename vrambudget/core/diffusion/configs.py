"""A component's ``config.json`` read as the library reads it: every absent key takes the
default of the class's ``__init__`` (diffusers 0.42.1 ``register_to_config`` signatures,
transformers 5.23.0 config classes), keys that do not change memory are ignored, and the
options the closed forms do not model are refused with the key's path.

Sources (diffusers 0.42.1): ``models/unets/unet_2d_condition.py`` ``UNet2DConditionModel.
__init__`` (lines 178-224), ``models/autoencoders/autoencoder_kl.py`` ``AutoencoderKL.__init__``
(lines 78-97), ``models/transformers/transformer_sd3.py`` ``SD3Transformer2DModel.__init__``
(lines 120-136), ``models/transformers/transformer_flux.py`` ``FluxTransformer2DModel.
__init__``; transformers 5.23.0 ``models/clip/configuration_clip.py`` ``CLIPTextConfig`` and
``models/t5/configuration_t5.py`` ``T5Config``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..errors import InvalidWorkload

__all__ = [
    "CLIPTextConfig",
    "ComponentClass",
    "FluxConfig",
    "SD3Config",
    "T5Config",
    "UNetConfig",
    "VAEConfig",
    "read_config",
]

ComponentClass = Literal[
    "UNet2DConditionModel",
    "AutoencoderKL",
    "SD3Transformer2DModel",
    "FluxTransformer2DModel",
    "CLIPTextModel",
    "CLIPTextModelWithProjection",
    "T5EncoderModel",
]


class _Config(msgspec.Struct, frozen=True, kw_only=True):
    """Unknown keys are ignored (``_class_name``, ``act_fn``, ``scaling_factor`` ...)."""


class UNetConfig(_Config, frozen=True, kw_only=True):
    in_channels: int = 4
    out_channels: int = 4
    down_block_types: tuple[str, ...] = (
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "DownBlock2D",
    )
    mid_block_type: str | None = "UNetMidBlock2DCrossAttn"
    up_block_types: tuple[str, ...] = (
        "UpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
    )
    only_cross_attention: bool | tuple[bool, ...] = False
    block_out_channels: tuple[int, ...] = (320, 640, 1280, 1280)
    layers_per_block: int | tuple[int, ...] = 2
    norm_num_groups: int | None = 32
    cross_attention_dim: int | tuple[int, ...] = 1280
    transformer_layers_per_block: int | tuple[int, ...] = 1
    reverse_transformer_layers_per_block: Any = None
    encoder_hid_dim: int | None = None
    encoder_hid_dim_type: str | None = None
    attention_head_dim: int | tuple[int, ...] = 8
    num_attention_heads: int | tuple[int, ...] | None = None
    dual_cross_attention: bool = False
    use_linear_projection: bool = False
    class_embed_type: str | None = None
    addition_embed_type: str | None = None
    addition_time_embed_dim: int | None = None
    num_class_embeds: int | None = None
    upcast_attention: bool | None = False
    resnet_time_scale_shift: str = "default"
    time_embedding_type: str = "positional"
    time_embedding_dim: int | None = None
    time_cond_proj_dim: int | None = None
    conv_in_kernel: int = 3
    conv_out_kernel: int = 3
    projection_class_embeddings_input_dim: int | None = None
    attention_type: str = "default"
    class_embeddings_concat: bool = False
    mid_block_only_cross_attention: bool | None = None
    cross_attention_norm: str | None = None
    sample_size: int | tuple[int, int] | None = None

    def per_block(self, value: Any, name: str) -> tuple[Any, ...]:
        """A per-down-block value (an int is repeated, a list is taken as is)."""
        n = len(self.down_block_types)
        if isinstance(value, tuple):
            if len(value) != n:
                raise InvalidWorkload(name, f"has {len(value)} entries for {n} down blocks")
            return value
        return (value,) * n

    @property
    def heads(self) -> tuple[int, ...]:
        """Attention heads per down block: ``num_attention_heads or attention_head_dim`` (the
        historical naming of ``unet_2d_condition.py`` lines 244-252: SD 1.5's
        ``attention_head_dim: 8`` is 8 heads)."""
        value = self.num_attention_heads or self.attention_head_dim
        return tuple(self.per_block(value, "attention_head_dim"))


class VAEConfig(_Config, frozen=True, kw_only=True):
    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",)
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",)
    block_out_channels: tuple[int, ...] = (64,)
    layers_per_block: int = 1
    latent_channels: int = 4
    norm_num_groups: int = 32
    sample_size: int | tuple[int, int] = 32
    force_upcast: bool = True
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True

    @property
    def scale(self) -> int:
        """Pixels per latent along a side: 2^(levels - 1) (8 for the SD VAEs)."""
        return int(2 ** (len(self.block_out_channels) - 1))

    @property
    def tile_sample(self) -> int:
        """``tile_sample_min_size`` = ``sample_size`` (``autoencoder_kl.py`` line 133)."""
        s = self.sample_size
        return int(s[0] if isinstance(s, tuple) else s)


class SD3Config(_Config, frozen=True, kw_only=True):
    sample_size: int = 128
    patch_size: int = 2
    in_channels: int = 16
    num_layers: int = 18
    attention_head_dim: int = 64
    num_attention_heads: int = 18
    joint_attention_dim: int = 4096
    caption_projection_dim: int = 1152
    pooled_projection_dim: int = 2048
    out_channels: int | None = 16
    pos_embed_max_size: int | None = 96
    dual_attention_layers: tuple[int, ...] = ()
    qk_norm: str | None = None

    @property
    def inner(self) -> int:
        return self.num_attention_heads * self.attention_head_dim


class FluxConfig(_Config, frozen=True, kw_only=True):
    patch_size: int = 1
    in_channels: int = 64
    out_channels: int | None = None
    num_layers: int = 19
    num_single_layers: int = 38
    attention_head_dim: int = 128
    num_attention_heads: int = 24
    joint_attention_dim: int = 4096
    pooled_projection_dim: int = 768
    guidance_embeds: bool = False

    @property
    def inner(self) -> int:
        return self.num_attention_heads * self.attention_head_dim


class CLIPTextConfig(_Config, frozen=True, kw_only=True):
    vocab_size: int = 49408
    hidden_size: int = 512
    intermediate_size: int = 2048
    projection_dim: int = 512
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77


class T5Config(_Config, frozen=True, kw_only=True):
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    feed_forward_proj: str = "relu"

    @property
    def gated(self) -> bool:
        """``gated-gelu`` / ``gated-silu``: two input projections (``wi_0``, ``wi_1``)."""
        return self.feed_forward_proj.startswith("gated-")


_TYPES: dict[str, type[_Config]] = {
    "UNet2DConditionModel": UNetConfig,
    "AutoencoderKL": VAEConfig,
    "SD3Transformer2DModel": SD3Config,
    "FluxTransformer2DModel": FluxConfig,
    "CLIPTextModel": CLIPTextConfig,
    "CLIPTextModelWithProjection": CLIPTextConfig,
    "T5EncoderModel": T5Config,
}

_UNET_BLOCKS = {
    "down": ("DownBlock2D", "CrossAttnDownBlock2D"),
    "up": ("UpBlock2D", "CrossAttnUpBlock2D"),
}
# Options of UNet2DConditionModel the closed forms do not model: (key, the values they do).
_UNET_FIXED: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("mid_block_type", ("UNetMidBlock2DCrossAttn",)),
    ("only_cross_attention", (False,)),
    ("encoder_hid_dim", (None,)),
    ("encoder_hid_dim_type", (None,)),
    ("dual_cross_attention", (False,)),
    ("class_embed_type", (None,)),
    ("num_class_embeds", (None,)),
    ("addition_embed_type", (None, "text_time")),
    ("resnet_time_scale_shift", ("default",)),
    ("time_embedding_type", ("positional",)),
    ("time_embedding_dim", (None,)),
    ("time_cond_proj_dim", (None,)),
    ("attention_type", ("default",)),
    ("class_embeddings_concat", (False,)),
    ("mid_block_only_cross_attention", (None, False)),
    ("reverse_transformer_layers_per_block", (None,)),
    ("cross_attention_norm", (None,)),
)


def read_config(class_name: str, config: dict[str, Any], field: str) -> Any:
    """The typed view of ``config`` for ``class_name``; errors name ``field`` (the config's
    path in the request)."""
    kind = _TYPES[class_name]
    try:
        typed = msgspec.convert(config, type=kind, strict=False)
    except msgspec.ValidationError as exc:
        raise InvalidWorkload(field, f"{class_name} config: {exc}") from None
    _check(class_name, typed, field)
    return typed


def _positive(field: str, values: dict[str, Any]) -> None:
    for key, v in values.items():
        items = v if isinstance(v, tuple) else (v,)
        for x in items:
            if isinstance(x, int) and not isinstance(x, bool) and not 0 < x <= 1 << 24:
                raise InvalidWorkload(f"{field}.{key}", f"must be between 1 and 2^24 (got {x})")


def _check(class_name: str, c: Any, field: str) -> None:
    sizes = {}
    for f in msgspec.structs.fields(c):
        v = getattr(c, f.name)
        if f.name != "dual_attention_layers" and isinstance(v, int | tuple):
            sizes[f.name] = v
    _positive(field, sizes)
    if isinstance(c, UNetConfig):
        _check_unet(c, field)
    elif isinstance(c, VAEConfig):
        if not c.block_out_channels:
            raise InvalidWorkload(f"{field}.block_out_channels", "must not be empty")
        n = len(c.block_out_channels)
        if c.down_block_types != ("DownEncoderBlock2D",) * n:
            raise InvalidWorkload(
                f"{field}.down_block_types", f"must be {n} x 'DownEncoderBlock2D' (modelled)"
            )
        if c.up_block_types != ("UpDecoderBlock2D",) * n:
            raise InvalidWorkload(
                f"{field}.up_block_types", f"must be {n} x 'UpDecoderBlock2D' (modelled)"
            )
        if any(ch % c.norm_num_groups for ch in c.block_out_channels):
            raise InvalidWorkload(
                f"{field}.norm_num_groups", "must divide every block_out_channels entry"
            )
    elif isinstance(c, SD3Config):
        if c.qk_norm not in (None, "rms_norm", "layer_norm"):
            raise InvalidWorkload(f"{field}.qk_norm", "must be null, 'rms_norm' or 'layer_norm'")
        if c.pos_embed_max_size is None:
            raise InvalidWorkload(f"{field}.pos_embed_max_size", "must be set (SD3 crops it)")
        if c.out_channels is None:
            raise InvalidWorkload(f"{field}.out_channels", "must be set")
    elif isinstance(c, T5Config):
        if c.feed_forward_proj not in ("relu", "gelu", "gated-gelu", "gated-silu", "gated-relu"):
            raise InvalidWorkload(f"{field}.feed_forward_proj", "is not a T5 activation")
    elif isinstance(c, CLIPTextConfig) and c.hidden_size % c.num_attention_heads:
        raise InvalidWorkload(f"{field}.num_attention_heads", "must divide hidden_size")


def _check_unet(c: UNetConfig, field: str) -> None:
    n = len(c.down_block_types)
    if n == 0 or n != len(c.block_out_channels) or n != len(c.up_block_types):
        raise InvalidWorkload(
            f"{field}.block_out_channels",
            "down_block_types, up_block_types and block_out_channels must have one entry per "
            "level (at least one)",
        )
    for name, allowed in _UNET_BLOCKS.items():
        for i, t in enumerate(getattr(c, f"{name}_block_types")):
            if t not in allowed:
                raise InvalidWorkload(
                    f"{field}.{name}_block_types[{i}]", f"must be one of {', '.join(allowed)}"
                )
    for key, values in _UNET_FIXED:
        if getattr(c, key) not in values:
            raise InvalidWorkload(
                f"{field}.{key}",
                f"{getattr(c, key)!r} is not modelled (supported: {values[:3]!r})",
            )
    if c.addition_embed_type == "text_time" and (
        c.addition_time_embed_dim is None or c.projection_class_embeddings_input_dim is None
    ):
        raise InvalidWorkload(
            f"{field}.addition_time_embed_dim",
            "'text_time' needs addition_time_embed_dim and projection_class_embeddings_input_dim",
        )
    if c.norm_num_groups is None:
        raise InvalidWorkload(f"{field}.norm_num_groups", "must be set (GroupNorm)")
    heads = c.heads
    for i, ch in enumerate(c.block_out_channels):
        if ch % heads[i]:
            raise InvalidWorkload(
                f"{field}.attention_head_dim", f"{heads[i]} heads do not divide {ch} channels"
            )
        if ch % c.norm_num_groups:
            raise InvalidWorkload(f"{field}.norm_num_groups", f"must divide {ch}")
    for key in ("layers_per_block", "cross_attention_dim", "transformer_layers_per_block"):
        c.per_block(getattr(c, key), f"{field}.{key}")
