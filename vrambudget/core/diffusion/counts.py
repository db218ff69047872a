"""Each component's leaf modules in closed form, as the library's ``__init__`` builds them.

A ``Conv2d(i, o, k)`` holds ``i x o x k^2 + o`` parameters, a ``Linear(i, o)`` ``i x o + o``
(without bias ``i x o``), an affine ``GroupNorm`` / ``LayerNorm`` of ``c`` channels ``2c``.
The structure follows (diffusers 0.42.1): ``models/unets/unet_2d_condition.py`` (``__init__``,
lines 285-470), ``models/unets/unet_2d_blocks.py`` (``CrossAttnDownBlock2D``, ``DownBlock2D``,
``UNetMidBlock2DCrossAttn``, ``CrossAttnUpBlock2D``, ``UpBlock2D``), ``models/resnet.py``
(``ResnetBlock2D``), ``models/transformers/transformer_2d.py`` and ``models/attention.py``
(``BasicTransformerBlock``, ``FeedForward``, ``JointTransformerBlock``),
``models/attention_processor.py`` (``Attention.__init__``, lines 95-300),
``models/autoencoders/vae.py`` (``Encoder``, ``Decoder``), ``models/transformers/
transformer_sd3.py``, ``models/transformers/transformer_flux.py``; transformers 5.23.0
``models/clip/modeling_clip.py`` and ``models/t5/modeling_t5.py`` (``_keep_in_fp32_modules =
["wo"]``).

Worked numbers (the tests hold them equal to diffusers' own module trees and to the published
counts): SD 1.5 UNet 859,520,964; SDXL UNet 2,567,463,684; the SD VAE 83,653,863; SD3-medium
transformer 2,028,328,000; FLUX.1-dev transformer 11,901,408,320; CLIP ViT-L/14 text
123,060,480; T5 XXL encoder 4,762,310,656.
"""

from __future__ import annotations

from typing import Any

from .configs import (
    CLIPTextConfig,
    FluxConfig,
    SD3Config,
    T5Config,
    UNetConfig,
    VAEConfig,
)
from .inventory import BufferGroup, ComponentInventory, ModuleGroup

__all__ = ["component_inventory"]


class _Modules:
    """Collects leaf modules; the same (pattern, module, tensors, fp32) adds to one group."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, tuple[int, ...], bool], int] = {}

    def add(
        self,
        pattern: str,
        module: str,
        tensors: tuple[int, ...],
        count: int = 1,
        fp32: bool = False,
    ) -> None:
        if count <= 0:
            return
        key = (pattern, module, tensors, fp32)
        self.rows[key] = self.rows.get(key, 0) + count

    def linear(self, pattern: str, i: int, o: int, bias: bool = True, count: int = 1) -> None:
        self.add(pattern, "Linear", (o * i, o) if bias else (o * i,), count)

    def conv(self, pattern: str, i: int, o: int, k: int = 3, count: int = 1) -> None:
        self.add(pattern, "Conv2d", (o * i * k * k, o), count)

    def norm(self, pattern: str, c: int, module: str = "GroupNorm", count: int = 1) -> None:
        self.add(pattern, module, (c, c), count)

    def groups(self) -> tuple[ModuleGroup, ...]:
        return tuple(
            ModuleGroup(pattern=p, module=m, tensors=t, count=c, keep_fp32=f)
            for (p, m, t, f), c in self.rows.items()
        )


# ------------------------------------------------------------------------------- blocks --


def _resnet(m: _Modules, p: str, cin: int, cout: int, temb: int | None, count: int = 1) -> None:
    """``ResnetBlock2D``: norm1, conv1, time_emb_proj (UNet only), norm2, conv2, and a 1x1
    conv_shortcut when the channels change."""
    m.norm(f"{p}.norm1", cin, count=count)
    m.conv(f"{p}.conv1", cin, cout, count=count)
    if temb is not None:
        m.linear(f"{p}.time_emb_proj", temb, cout, count=count)
    m.norm(f"{p}.norm2", cout, count=count)
    m.conv(f"{p}.conv2", cout, cout, count=count)
    if cin != cout:
        m.conv(f"{p}.conv_shortcut", cin, cout, k=1, count=count)


def _transformer_2d(m: _Modules, p: str, ch: int, depth: int, cross: int, linear: bool) -> None:
    """``Transformer2DModel`` (inner dim = channels): GroupNorm, proj_in / proj_out (Linear
    or 1x1 Conv2d), ``depth`` x ``BasicTransformerBlock``: LayerNorms, self-attention (q, k, v
    without bias, out with bias), cross-attention (k, v from ``cross``), GEGLU feed-forward
    (ch -> 2 x 4ch, 4ch -> ch)."""
    m.norm(f"{p}.norm", ch)
    if linear:
        m.linear(f"{p}.proj_in", ch, ch)
        m.linear(f"{p}.proj_out", ch, ch)
    else:
        m.conv(f"{p}.proj_in", ch, ch, k=1)
        m.conv(f"{p}.proj_out", ch, ch, k=1)
    b = f"{p}.transformer_blocks.{{}}"
    for n in ("norm1", "norm2", "norm3"):
        m.norm(f"{b}.{n}", ch, "LayerNorm", count=depth)
    m.linear(f"{b}.attn1.to_q|to_k|to_v", ch, ch, bias=False, count=3 * depth)
    m.linear(f"{b}.attn1.to_out.0", ch, ch, count=depth)
    m.linear(f"{b}.attn2.to_q", ch, ch, bias=False, count=depth)
    m.linear(f"{b}.attn2.to_k|to_v", cross, ch, bias=False, count=2 * depth)
    m.linear(f"{b}.attn2.to_out.0", ch, ch, count=depth)
    m.linear(f"{b}.ff.net.0.proj", ch, 8 * ch, count=depth)
    m.linear(f"{b}.ff.net.2", 4 * ch, ch, count=depth)


def _timestep_embedding(m: _Modules, p: str, cin: int, dim: int) -> None:
    """``TimestepEmbedding``: linear_1 (cin -> dim), linear_2 (dim -> dim)."""
    m.linear(f"{p}.linear_1", cin, dim)
    m.linear(f"{p}.linear_2", dim, dim)


# --------------------------------------------------------------------------------- UNet --


def unet_inventory(c: UNetConfig, role: str = "unet") -> ComponentInventory:
    m = _Modules()
    ch = c.block_out_channels
    n = len(ch)
    temb = 4 * ch[0]
    heads = c.heads
    layers = c.per_block(c.layers_per_block, "layers_per_block")
    depth = c.per_block(c.transformer_layers_per_block, "transformer_layers_per_block")
    cross = c.per_block(c.cross_attention_dim, "cross_attention_dim")
    del heads  # heads do not change parameter counts (inner dim = channels)
    m.conv("conv_in", c.in_channels, ch[0], k=c.conv_in_kernel)
    _timestep_embedding(m, "time_embedding", ch[0], temb)
    if c.addition_embed_type == "text_time":
        assert c.projection_class_embeddings_input_dim is not None
        _timestep_embedding(m, "add_embedding", c.projection_class_embeddings_input_dim, temb)
    out = ch[0]
    for i, kind in enumerate(c.down_block_types):
        cin, out = out, ch[i]
        p = f"down_blocks.{i}"
        for j in range(layers[i]):
            _resnet(m, f"{p}.resnets.{j}", cin if j == 0 else out, out, temb)
            if kind == "CrossAttnDownBlock2D":
                _transformer_2d(
                    m, f"{p}.attentions.{j}", out, depth[i], cross[i], c.use_linear_projection
                )
        if i < n - 1:
            m.conv(f"{p}.downsamplers.0.conv", out, out)
    mid = ch[-1]
    _resnet(m, "mid_block.resnets.0", mid, mid, temb)
    _transformer_2d(m, "mid_block.attentions.0", mid, depth[-1], cross[-1], c.use_linear_projection)
    _resnet(m, "mid_block.resnets.1", mid, mid, temb)
    rch = list(reversed(ch))
    rlayers = list(reversed(layers))
    rdepth = list(reversed(depth))
    rcross = list(reversed(cross))
    out = rch[0]
    for i, kind in enumerate(c.up_block_types):
        prev, out = out, rch[i]
        cin = rch[min(i + 1, n - 1)]
        p = f"up_blocks.{i}"
        num = rlayers[i] + 1
        for j in range(num):
            skip = cin if j == num - 1 else out
            res_in = prev if j == 0 else out
            _resnet(m, f"{p}.resnets.{j}", res_in + skip, out, temb)
            if kind == "CrossAttnUpBlock2D":
                _transformer_2d(
                    m, f"{p}.attentions.{j}", out, rdepth[i], rcross[i], c.use_linear_projection
                )
        if i < n - 1:
            m.conv(f"{p}.upsamplers.0.conv", out, out)
    m.norm("conv_norm_out", ch[0])
    m.conv("conv_out", ch[0], c.out_channels, k=c.conv_out_kernel)
    return ComponentInventory(role=role, class_name="UNet2DConditionModel", groups=m.groups())


# ---------------------------------------------------------------------------------- VAE --


def _vae_mid(m: _Modules, p: str, ch: int, attention: bool) -> None:
    """``UNetMidBlock2D`` without time embedding: two resnets and (``mid_block_add_attention``)
    one ``Attention`` of a single head over ``ch`` channels: group_norm, q, k, v, out with
    bias."""
    _resnet(m, f"{p}.resnets.{{}}", ch, ch, None, count=2)
    if attention:
        m.norm(f"{p}.attentions.0.group_norm", ch)
        m.linear(f"{p}.attentions.0.to_q|to_k|to_v|to_out.0", ch, ch, count=4)


def vae_inventory(c: VAEConfig, role: str = "vae") -> ComponentInventory:
    m = _Modules()
    ch = c.block_out_channels
    n = len(ch)
    lat = c.latent_channels
    # Encoder (double_z: 2 x latent channels out).
    m.conv("encoder.conv_in", c.in_channels, ch[0])
    out = ch[0]
    for i in range(n):
        cin, out = out, ch[i]
        for j in range(c.layers_per_block):
            _resnet(m, f"encoder.down_blocks.{i}.resnets.{j}", cin if j == 0 else out, out, None)
        if i < n - 1:
            m.conv(f"encoder.down_blocks.{i}.downsamplers.0.conv", out, out)
    _vae_mid(m, "encoder.mid_block", ch[-1], c.mid_block_add_attention)
    m.norm("encoder.conv_norm_out", ch[-1])
    m.conv("encoder.conv_out", ch[-1], 2 * lat)
    # Decoder: layers_per_block + 1 resnets per level.
    rch = list(reversed(ch))
    m.conv("decoder.conv_in", lat, rch[0])
    _vae_mid(m, "decoder.mid_block", rch[0], c.mid_block_add_attention)
    out = rch[0]
    for i in range(n):
        prev, out = out, rch[i]
        for j in range(c.layers_per_block + 1):
            _resnet(m, f"decoder.up_blocks.{i}.resnets.{j}", prev if j == 0 else out, out, None)
        if i < n - 1:
            m.conv(f"decoder.up_blocks.{i}.upsamplers.0.conv", out, out)
    m.norm("decoder.conv_norm_out", ch[0])
    m.conv("decoder.conv_out", ch[0], c.out_channels)
    if c.use_quant_conv:
        m.conv("quant_conv", 2 * lat, 2 * lat, k=1)
    if c.use_post_quant_conv:
        m.conv("post_quant_conv", lat, lat, k=1)
    return ComponentInventory(role=role, class_name="AutoencoderKL", groups=m.groups())


def decoder_params(inv: ComponentInventory) -> int:
    """Parameters of the VAE's decoding path (``decoder.*`` and ``post_quant_conv``)."""
    return sum(
        g.params * g.count
        for g in inv.groups
        if g.pattern.startswith(("decoder.", "post_quant_conv"))
    )


# ----------------------------------------------------------------------- DiT / MMDiT --


def _qk_norm(m: _Modules, p: str, kind: str | None, head_dim: int, count: int) -> None:
    if kind == "rms_norm":
        m.add(p, "RMSNorm", (head_dim,), count)
    elif kind == "layer_norm":
        m.add(p, "LayerNorm", (head_dim, head_dim), count)


def _ff(m: _Modules, p: str, dim: int, count: int) -> None:
    """``FeedForward(dim, activation_fn="gelu-approximate")``: dim -> 4 dim -> dim."""
    m.linear(f"{p}.net.0.proj", dim, 4 * dim, count=count)
    m.linear(f"{p}.net.2", 4 * dim, dim, count=count)


def sd3_inventory(c: SD3Config, role: str = "transformer") -> ComponentInventory:
    m = _Modules()
    d = c.inner
    hd = c.attention_head_dim
    L = c.num_layers
    out = c.out_channels if c.out_channels is not None else c.in_channels
    m.add("pos_embed.proj", "Conv2d", (d * c.in_channels * c.patch_size**2, d))
    _timestep_embedding(m, "time_text_embed.timestep_embedder", 256, d)
    m.linear("time_text_embed.text_embedder.linear_1", c.pooled_projection_dim, d)
    m.linear("time_text_embed.text_embedder.linear_2", d, d)
    m.linear("context_embedder", c.joint_attention_dim, c.caption_projection_dim)
    dual = sum(1 for i in set(c.dual_attention_layers) if 0 <= i < L)
    b = "transformer_blocks.{}"
    m.linear(f"{b}.norm1.linear", d, 6 * d, count=L - dual)
    m.linear(f"{b}.norm1.linear", d, 9 * d, count=dual)
    m.linear(f"{b}.norm1_context.linear", d, 6 * d, count=L - 1)
    m.linear(f"{b}.norm1_context.linear", d, 2 * d, count=1)  # the last: context_pre_only
    m.linear(f"{b}.attn.to_q|to_k|to_v|add_q|add_k|add_v", d, d, count=6 * L)
    m.linear(f"{b}.attn.to_out.0", d, d, count=L)
    m.linear(f"{b}.attn.to_add_out", d, d, count=L - 1)
    _qk_norm(m, f"{b}.attn.norm_q|norm_k|norm_added_q|norm_added_k", c.qk_norm, hd, 4 * L)
    m.linear(f"{b}.attn2.to_q|to_k|to_v|to_out.0", d, d, count=4 * dual)
    _qk_norm(m, f"{b}.attn2.norm_q|norm_k", c.qk_norm, hd, 2 * dual)
    _ff(m, f"{b}.ff", d, L)
    _ff(m, f"{b}.ff_context", d, L - 1)
    m.linear("norm_out.linear", d, 2 * d)
    m.linear("proj_out", d, c.patch_size**2 * out)
    assert c.pos_embed_max_size is not None
    buffers = (
        BufferGroup(
            name="pos_embed.pos_embed",
            numel=c.pos_embed_max_size**2 * d,
            dtype="float",
            persistent=True,
        ),
    )
    return ComponentInventory(
        role=role, class_name="SD3Transformer2DModel", groups=m.groups(), buffers=buffers
    )


def flux_inventory(c: FluxConfig, role: str = "transformer") -> ComponentInventory:
    m = _Modules()
    d = c.inner
    hd = c.attention_head_dim
    L, S = c.num_layers, c.num_single_layers
    out = c.out_channels if c.out_channels is not None else c.in_channels
    _timestep_embedding(m, "time_text_embed.timestep_embedder", 256, d)
    if c.guidance_embeds:
        _timestep_embedding(m, "time_text_embed.guidance_embedder", 256, d)
    m.linear("time_text_embed.text_embedder.linear_1", c.pooled_projection_dim, d)
    m.linear("time_text_embed.text_embedder.linear_2", d, d)
    m.linear("context_embedder", c.joint_attention_dim, d)
    m.linear("x_embedder", c.in_channels, d)
    b = "transformer_blocks.{}"
    m.linear(f"{b}.norm1|norm1_context.linear", d, 6 * d, count=2 * L)
    m.linear(f"{b}.attn.to_q|to_k|to_v|add_q|add_k|add_v|to_out.0|to_add_out", d, d, count=8 * L)
    m.add(f"{b}.attn.norm_q|norm_k|norm_added_q|norm_added_k", "RMSNorm", (hd,), 4 * L)
    _ff(m, f"{b}.ff", d, L)
    _ff(m, f"{b}.ff_context", d, L)
    s = "single_transformer_blocks.{}"
    m.linear(f"{s}.norm.linear", d, 3 * d, count=S)
    m.linear(f"{s}.proj_mlp", d, 4 * d, count=S)
    m.linear(f"{s}.proj_out", 5 * d, d, count=S)
    m.linear(f"{s}.attn.to_q|to_k|to_v", d, d, count=3 * S)
    m.add(f"{s}.attn.norm_q|norm_k", "RMSNorm", (hd,), 2 * S)
    m.linear("norm_out.linear", d, 2 * d)
    m.linear("proj_out", d, c.patch_size**2 * out)
    return ComponentInventory(role=role, class_name="FluxTransformer2DModel", groups=m.groups())


# ------------------------------------------------------------------------ text encoders --


def clip_inventory(c: CLIPTextConfig, role: str, projection: bool) -> ComponentInventory:
    """``CLIPTextModel`` (``WithProjection``: + ``text_projection``, no bias); the
    ``position_ids`` buffer (int64, not persistent)."""
    m = _Modules()
    h, f, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    p = "text_model"
    m.add(f"{p}.embeddings.token_embedding", "Embedding", (c.vocab_size * h,))
    m.add(f"{p}.embeddings.position_embedding", "Embedding", (c.max_position_embeddings * h,))
    e = f"{p}.encoder.layers.{{}}"
    m.linear(f"{e}.self_attn.q_proj|k_proj|v_proj|out_proj", h, h, count=4 * L)
    m.norm(f"{e}.layer_norm1|layer_norm2", h, "LayerNorm", count=2 * L)
    m.linear(f"{e}.mlp.fc1", h, f, count=L)
    m.linear(f"{e}.mlp.fc2", f, h, count=L)
    m.norm(f"{p}.final_layer_norm", h, "LayerNorm")
    if projection:
        m.linear("text_projection", h, c.projection_dim, bias=False)
    buffers = (
        BufferGroup(
            name=f"{p}.embeddings.position_ids",
            numel=c.max_position_embeddings,
            dtype="int64",
            persistent=False,
        ),
    )
    name = "CLIPTextModelWithProjection" if projection else "CLIPTextModel"
    return ComponentInventory(role=role, class_name=name, groups=m.groups(), buffers=buffers)


def t5_inventory(c: T5Config, role: str) -> ComponentInventory:
    """``T5EncoderModel``: the shared embedding (tied to ``encoder.embed_tokens``, counted
    once), per block q, k, v, o (no bias), the relative position bias of block 0, the feed
    forward (``wi`` or gated ``wi_0``/``wi_1``, and ``wo``, which transformers keeps in fp32 at
    fp16: ``_keep_in_fp32_modules = ["wo"]``), T5LayerNorms (weight only)."""
    m = _Modules()
    d, L, inner = c.d_model, c.num_layers, c.num_heads * c.d_kv
    m.add("shared", "Embedding", (c.vocab_size * d,))
    b = "encoder.block.{}"
    m.linear(f"{b}.layer.0.SelfAttention.q|k|v", d, inner, bias=False, count=3 * L)
    m.linear(f"{b}.layer.0.SelfAttention.o", inner, d, bias=False, count=L)
    m.add(
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias",
        "Embedding",
        (c.relative_attention_num_buckets * c.num_heads,),
    )
    m.add(f"{b}.layer.0|1.layer_norm", "T5LayerNorm", (d,), 2 * L)
    m.linear(
        f"{b}.layer.1.DenseReluDense.wi", d, c.d_ff, bias=False, count=(2 if c.gated else 1) * L
    )
    m.add(f"{b}.layer.1.DenseReluDense.wo", "Linear", (c.d_ff * d,), L, fp32=True)
    m.add("encoder.final_layer_norm", "T5LayerNorm", (d,))
    return ComponentInventory(role=role, class_name="T5EncoderModel", groups=m.groups())


def component_inventory(class_name: str, config: Any, role: str) -> ComponentInventory:
    """The inventory of ``class_name`` built from its typed config (:mod:`.configs`)."""
    match class_name:
        case "UNet2DConditionModel":
            return unet_inventory(config, role)
        case "AutoencoderKL":
            return vae_inventory(config, role)
        case "SD3Transformer2DModel":
            return sd3_inventory(config, role)
        case "FluxTransformer2DModel":
            return flux_inventory(config, role)
        case "CLIPTextModel" | "CLIPTextModelWithProjection":
            return clip_inventory(config, role, class_name == "CLIPTextModelWithProjection")
        case "T5EncoderModel":
            return t5_inventory(config, role)
    raise ValueError(class_name)
