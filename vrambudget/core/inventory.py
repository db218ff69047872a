"""What a framework reports about a model it built: every parameter and buffer (shape, dtype,
the module that owns it), the layer stacks, tied weights, and what one sequence keeps between
steps (its KV cache or recurrent state).

The inventory is produced by the ``workloads`` layer, which builds the model with the
framework's own modelling code (``transformers``) on the meta device -- no memory, no values --
and is plain data here: the analytic tier turns it into an :class:`~vrambudget.core.arch.Arch`
(:mod:`vrambudget.core.families.inventory`) without importing the framework. Repeated layers
fold into patterns (``model.layers.{}.mlp.down_proj.weight``), so a 70B model's inventory is a
few dozen rows.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "CacheLayer",
    "CacheProfile",
    "EncoderInfo",
    "InvDims",
    "InvTensor",
    "ModelInventory",
    "StateTensor",
]


class InvTensor(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Tensors that differ only in integer path components (the same tensor of every layer)."""

    pattern: str
    """The name with each integer path component replaced by ``{}``."""
    shape: tuple[int, ...]
    dtype: str
    """The dtype the framework loads it in at a 16-bit load dtype (``bfloat16``, ``float32``,
    ``int64`` ...)."""
    follows: bool
    """Floating-point and cast with the load dtype (``dtype=`` of ``from_pretrained``); false
    for integer buffers and for tensors the model keeps in fp32 (``_keep_in_fp32_modules_strict``
    of transformers, or buffers it creates in fp32 such as rotary ``inv_freq``)."""
    fp32_at_fp16: bool
    """Kept in fp32 when the load dtype is float16 (``_keep_in_fp32_modules``)."""
    kind: Literal["parameter", "buffer"]
    persistent: bool
    """In the state dict (stored in checkpoints); non-persistent buffers are computed at load."""
    module: str
    """Class name of the module that owns it (``Linear``, ``Embedding``, ``LlamaRMSNorm`` ...)."""
    layers: tuple[int, ...]
    """The first integer component of each name (layer indices), sorted; empty when none."""
    count: int


class InvDims(msgspec.Struct, frozen=True, kw_only=True):
    """The text model's dimensions as the framework's config object reports them (its
    ``attribute_map`` applied: ``n_embd`` is ``hidden_size``)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    experts_per_token: int = 0
    """Top-k routing of a mixture-of-experts model (0: none or not stated)."""
    activation: str = ""
    """The MLP's activation as the config names it (``hidden_act``; GPT-2-style
    ``activation_function``); empty: not stated."""


class StateTensor(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A per-sequence tensor the cache keeps whatever the context length (conv / SSM state)."""

    name: str
    numel: int
    """Elements per sequence."""
    dtype: str
    follows: bool
    """In the model's compute dtype (else ``dtype`` stays)."""


class CacheLayer(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """What one layer of the stack caches per sequence."""

    kind: Literal["full", "sliding", "recurrent", "none"]
    kv_elems_per_token: int
    """K + V elements per token (all heads)."""
    window: int | None
    state: tuple[StateTensor, ...]


class CacheProfile(msgspec.Struct, frozen=True, kw_only=True):
    """The framework's cache after a prefill, per layer (measured on meta tensors at two prompt
    lengths: what grows per token is KV, what does not is state)."""

    cache_class: str
    layers: tuple[CacheLayer, ...]
    kv_dtype_follows: bool = True
    """KV tensors are in the compute dtype."""


class EncoderInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The model's encoder (or vision tower) as its config describes it, for workloads whose
    inputs are images, audio or an input sequence."""

    modality: Literal["vision", "audio", "text"]
    dims: InvDims
    """The encoder's own widths and layers (a vision tower's, Whisper's encoder's)."""
    image_size: int = 0
    patch_size: int = 0
    num_channels: int = 3
    extra_tokens: int = 0
    """Tokens besides the patches (a class token: ViT and CLIP 1, SigLIP 0)."""
    num_mel_bins: int = 0
    frames_per_second: int = 0
    """Log-mel frames per second of audio (Whisper: 100, a 10 ms hop)."""
    max_frames: int = 0
    """Frames of one input window (Whisper: 3,000 = 30 s)."""
    stride: int = 1
    """Frames per encoder position (Whisper's second convolution has stride 2)."""
    cross_kv_elems: int = 0
    """K + V elements the decoder's cross-attention caches per encoder position, over all
    decoder layers (2 x heads x head_dim x layers)."""


class ModelInventory(msgspec.Struct, frozen=True, kw_only=True):
    """Every tensor of a model as ``library`` builds it from a ``config.json``."""

    library: str
    """``transformers 5.23.0``."""
    architecture: str
    """The model class built (``Qwen2ForCausalLM``)."""
    model_type: str
    kind: Literal["decoder", "encoder", "encoder_decoder"]
    tensors: tuple[InvTensor, ...]
    stack: str | None
    """Pattern prefix of the main layer stack (``model.layers.{}``), the one pipeline stages
    cut; null when the model has none."""
    tied: tuple[tuple[str, str], ...]
    """(name, the name it shares storage with)."""
    dims: InvDims
    cache: CacheProfile | None
    encoder: EncoderInfo | None = None
    """The encoder or vision tower (encoder-decoders, vision and speech models)."""
    notes: tuple[str, ...] = ()
    """What the framework path could not determine."""
