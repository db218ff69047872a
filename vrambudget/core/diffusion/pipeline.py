"""An image-generation workload resolved: its components (class, typed config, inventory) in
the pipeline's offload order, the dtype, and what the pipeline's ``__call__`` does by default.

Per pipeline class (diffusers 0.42.1, ``pipelines/``):

* ``StableDiffusionPipeline`` (``stable_diffusion/pipeline_stable_diffusion.py``):
  ``model_cpu_offload_seq = "text_encoder->image_encoder->unet->vae"`` (line 195);
  guidance_scale 7.5 > 1: CFG on, the negative prompt ``""`` encoded by the text encoder and
  the UNet run on ``torch.cat([latents] * 2)``.
* ``StableDiffusionXLPipeline`` (``stable_diffusion_xl/pipeline_stable_diffusion_xl.py``):
  offload sequence line 223; guidance_scale 5.0; with no negative prompt and
  ``force_zeros_for_empty_prompt`` (True) the negative embeddings are zeros (lines 424-428),
  no second encode; the VAE is upcast to fp32 to decode when it is fp16 and
  ``force_upcast`` (lines 1264-1267).
* ``StableDiffusion3Pipeline`` (``stable_diffusion_3/pipeline_stable_diffusion_3.py``):
  offload sequence line 186; guidance_scale 7.0; the negative prompt ``""`` encoded by all
  three encoders (line 467); ``max_sequence_length`` 256 T5 tokens.
* ``FluxPipeline`` (``flux/pipeline_flux.py``): offload sequence line 179; no CFG batch:
  ``do_true_cfg = true_cfg_scale > 1 and has_neg_prompt`` (line 771) runs the transformer a
  second time on the negative prompt; ``max_sequence_length`` 512.

CLIP encoders take 77 tokens (their tokenizer's ``model_max_length``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidWorkload
from ..hf_config import config_key
from ..memo import BoundedCache
from ..spec.diffusion import ComponentsPipeline, ImageGenerationWorkload, PresetPipeline
from .configs import read_config
from .counts import component_inventory
from .inventory import ComponentInventory
from .presets import PipelinePreset, pipeline_preset

__all__ = ["CLASSES", "Component", "Pipeline", "resolve_pipeline"]

CLASSES: dict[str, tuple[tuple[str, str], ...]] = {
    "StableDiffusionPipeline": (
        ("text_encoder", "CLIPTextModel"),
        ("unet", "UNet2DConditionModel"),
        ("vae", "AutoencoderKL"),
    ),
    "StableDiffusionXLPipeline": (
        ("text_encoder", "CLIPTextModel"),
        ("text_encoder_2", "CLIPTextModelWithProjection"),
        ("unet", "UNet2DConditionModel"),
        ("vae", "AutoencoderKL"),
    ),
    "StableDiffusion3Pipeline": (
        ("text_encoder", "CLIPTextModelWithProjection"),
        ("text_encoder_2", "CLIPTextModelWithProjection"),
        ("text_encoder_3", "T5EncoderModel"),
        ("transformer", "SD3Transformer2DModel"),
        ("vae", "AutoencoderKL"),
    ),
    "FluxPipeline": (
        ("text_encoder", "CLIPTextModel"),
        ("text_encoder_2", "T5EncoderModel"),
        ("transformer", "FluxTransformer2DModel"),
        ("vae", "AutoencoderKL"),
    ),
}
"""(role, class) of each component, in ``model_cpu_offload_seq`` order."""

_DEFAULT_DTYPE = {
    "StableDiffusionPipeline": "fp16",
    "StableDiffusionXLPipeline": "fp16",
    "StableDiffusion3Pipeline": "fp16",
    "FluxPipeline": "bf16",
}
_T5_TOKENS = {"StableDiffusion3Pipeline": 256, "FluxPipeline": 512}
CLIP_TOKENS = 77


@dataclass(frozen=True, slots=True)
class Component:
    role: str
    class_name: str
    config: Any
    """The typed view (:mod:`.configs`)."""
    published: dict[str, Any]
    """The ``config.json`` as given (the trace builds the module from it)."""
    inventory: ComponentInventory

    @property
    def is_text_encoder(self) -> bool:
        return self.role.startswith("text_encoder")


@dataclass(frozen=True, slots=True)
class Pipeline:
    name: str
    class_name: str
    dtype: str
    components: tuple[Component, ...]
    guidance: bool
    t5_tokens: int
    preset: PipelinePreset | None

    def component(self, role: str) -> Component:
        return next(c for c in self.components if c.role == role)

    @property
    def denoiser(self) -> Component:
        return next(c for c in self.components if c.role in ("unet", "transformer"))

    @property
    def vae(self) -> Component:
        return self.component("vae")

    @property
    def text_encoders(self) -> tuple[Component, ...]:
        return tuple(c for c in self.components if c.is_text_encoder)

    @property
    def cfg_batch(self) -> int:
        """Denoiser batch multiplier: 2 with classifier-free guidance in the UNet and SD3
        pipelines (``torch.cat([latents] * 2)``), 1 otherwise (FLUX's true CFG runs twice)."""
        return 2 if self.guidance and self.class_name != "FluxPipeline" else 1

    @property
    def denoiser_passes(self) -> int:
        """Denoiser calls per step: FLUX's true CFG calls the transformer a second time."""
        return 2 if self.guidance and self.class_name == "FluxPipeline" else 1

    @property
    def encodes_negative(self) -> bool:
        """The negative prompt is run through the text encoders (SDXL zeroes it instead)."""
        return self.guidance and self.class_name != "StableDiffusionXLPipeline"

    def tokens(self, c: Component) -> int:
        """The prompt tokens text encoder ``c`` runs on: the T5 length, or CLIP's 77."""
        return self.t5_tokens if c.class_name == "T5EncoderModel" else CLIP_TOKENS

    @property
    def text_tokens(self) -> int:
        """The text tokens the denoiser attends to: CLIP's 77 (the UNet's cross-attention),
        77 CLIP + the T5 length joined (SD3), the T5 length (FLUX)."""
        if self.class_name == "StableDiffusion3Pipeline":
            return CLIP_TOKENS + self.t5_tokens
        if self.class_name == "FluxPipeline":
            return self.t5_tokens
        return CLIP_TOKENS

    @property
    def patch(self) -> int:
        """Latent pixels per denoiser token along a side: SD3's ``patch_size`` (2 in the
        published configs), 2 for FLUX (``_pack_latents`` packs 2 x 2 latents into one token
        whatever the transformer's ``patch_size``), 1 for the UNet (no tokens)."""
        if self.class_name == "StableDiffusion3Pipeline":
            return int(self.denoiser.config.patch_size)
        return 2 if self.class_name == "FluxPipeline" else 1

    def latent_dims(self, height: int, width: int) -> tuple[int, int, int]:
        """(channels, height, width) of the latents of an image: the VAE's latent channels
        and the image sides divided by its scale (8 for the SD VAEs)."""
        c = self.vae.config
        return c.latent_channels, height // c.scale, width // c.scale

    def denoiser_tokens(self, height: int, width: int) -> int | None:
        """The DiT's sequence for an image: ``(H / 8 / p) x (W / 8 / p)`` latent patches plus
        :attr:`text_tokens` (None for a UNet). Worked number: SD3 at 1024 x 1024, 64 x 64 +
        77 + 256 = 4,429."""
        if self.denoiser.class_name == "UNet2DConditionModel":
            return None
        _, lh, lw = self.latent_dims(height, width)
        return (lh // self.patch) * (lw // self.patch) + self.text_tokens

    @property
    def vae_decode_dtype(self) -> str:
        """SDXL decodes with the VAE upcast to fp32 when it is fp16 and ``force_upcast``."""
        if (
            self.class_name == "StableDiffusionXLPipeline"
            and self.dtype == "fp16"
            and self.vae.config.force_upcast
        ):
            return "fp32"
        return self.dtype


_INVENTORIES: BoundedCache[tuple[str, str, bytes], ComponentInventory] = BoundedCache(256)


def _component(class_name: str, role: str, config: dict[str, Any], field: str) -> Component:
    declared = config.get("_class_name")
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        declared = archs[0]
    if isinstance(declared, str) and declared != class_name:
        raise InvalidWorkload(
            field, f"is a {declared} config; the pipeline's {role} is a {class_name}"
        )
    typed = read_config(class_name, config, field)
    key = (class_name, role, config_key(config))
    inv = _INVENTORIES.get_or(key, lambda: component_inventory(class_name, typed, role))
    return Component(role, class_name, typed, config, inv)


def _build(w: ImageGenerationWorkload, field: str) -> Pipeline:
    """The pipeline of ``w``'s source, precision, guidance and T5 length, labelled with its
    own name (the workload's ``name`` and the per-request checks are applied by
    :func:`resolve_pipeline`)."""
    src = w.pipeline
    preset: PipelinePreset | None = None
    if isinstance(src, PresetPipeline):
        preset = pipeline_preset(src.id)
        class_name = preset.class_name
        configs = {role: c.config for role, c in preset.components.items()}
        name = preset.display_name
        where = f"{field}.pipeline.id"
    else:
        assert isinstance(src, ComponentsPipeline)
        class_name = src.class_name
        configs = {str(role): config for role, config in src.components.items()}
        name = src.name or class_name
        where = f"{field}.pipeline.components"
    roles = CLASSES[class_name]
    missing = [r for r, _ in roles if r not in configs]
    extra = sorted(set(configs) - {r for r, _ in roles})
    if missing or extra:
        raise InvalidWorkload(
            where,
            f"{class_name} has the components {', '.join(r for r, _ in roles)}"
            + (f" (missing: {', '.join(missing)})" if missing else "")
            + (f" (not part of it: {', '.join(extra)})" if extra else ""),
        )
    components = tuple(
        _component(cls, role, configs[role], f"{where}.{role}") for role, cls in roles
    )
    guidance = w.guidance if w.guidance is not None else class_name != "FluxPipeline"
    return Pipeline(
        name=name,
        class_name=class_name,
        dtype=w.precision or (preset.default_dtype if preset else _DEFAULT_DTYPE[class_name]),
        components=components,
        guidance=guidance,
        t5_tokens=w.max_sequence_length or _T5_TOKENS.get(class_name, 0),
        preset=preset,
    )


def _check(w: ImageGenerationWorkload, p: Pipeline, field: str) -> None:
    scale = p.vae.config.scale
    patch = p.patch
    step = scale * patch
    for name, v in (("height", w.height), ("width", w.width)):
        if v % step:
            raise InvalidWorkload(
                f"{field}.{name}",
                f"must be a multiple of {step} for {p.class_name} (VAE factor {scale}"
                + (f" x patch {patch})" if patch > 1 else ")"),
            )
    if w.num_frames != 1:
        raise InvalidWorkload(
            f"{field}.num_frames", f"{p.class_name} generates images: num_frames must be 1"
        )
    if p.class_name == "StableDiffusion3Pipeline":
        cfg = p.denoiser.config
        limit = cfg.pos_embed_max_size * cfg.patch_size * scale
        for name, v in (("height", w.height), ("width", w.width)):
            if v > limit:
                raise InvalidWorkload(
                    f"{field}.{name}",
                    f"at most {limit} px: SD3 crops a {cfg.pos_embed_max_size} x "
                    f"{cfg.pos_embed_max_size} position embedding (pos_embed_max_size)",
                )
    if w.max_sequence_length is not None and not any(
        c.class_name == "T5EncoderModel" for c in p.components
    ):
        raise InvalidWorkload(
            f"{field}.max_sequence_length", f"{p.class_name} has no T5 encoder: leave it null"
        )


_PIPELINES: BoundedCache[tuple[object, ...], Pipeline] = BoundedCache(256)


def resolve_pipeline(w: ImageGenerationWorkload, field: str = "workloads[0]") -> Pipeline:
    """``w``'s pipeline, resolved (cached by what it depends on: the source, precision,
    guidance and T5 length) and checked against ``w``'s resolution and frames; labelled with
    ``w.name`` when it has one. Errors name ``field``."""
    key = (w.pipeline, w.precision, w.guidance, w.max_sequence_length)
    hit = _PIPELINES.get(key)
    if hit is None:
        hit = _PIPELINES.put(key, _build(w, field))
    _check(w, hit, field)
    return dataclasses.replace(hit, name=w.name) if w.name else hit
