"""The image-generation workload: a ``diffusers`` pipeline (a UNet or a DiT/MMDiT denoiser, a
VAE and text encoders) asked for images at a resolution, batch and precision, with the
memory options of the library (attention slicing, VAE tiling and slicing, CPU offload)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from ..diffusion.presets import PIPELINE_IDS
from ..hf_config import config_key
from .limits import Name, Wire

__all__ = [
    "ComponentsPipeline",
    "DiffusionDType",
    "ImageGenerationWorkload",
    "PipelineClass",
    "PipelineId",
    "PipelineSource",
    "PresetPipeline",
]

PipelineId: Any = Literal[PIPELINE_IDS]  # the ids of data/pipelines.json

PipelineClass = Literal[
    "StableDiffusionPipeline",
    "StableDiffusionXLPipeline",
    "StableDiffusion3Pipeline",
    "FluxPipeline",
]
"""The ``diffusers`` pipelines whose ``__call__`` the budget follows."""

DiffusionDType = Literal["fp16", "bf16", "fp32"]

_Config = Annotated[
    dict[str, Any],
    Meta(
        description="A component's `config.json` as published (`unet/config.json`, "
        "`vae/config.json`, `text_encoder/config.json` ...).",
    ),
]


class PresetPipeline(Wire, tag="preset", tag_field="source", frozen=True, kw_only=True):
    id: Annotated[
        PipelineId, Meta(description="A pipeline preset (`vrambudget/core/data/pipelines.json`).")
    ]


class ComponentsPipeline(Wire, tag="components", tag_field="source", frozen=True, kw_only=True):
    """A pipeline given by its class and the published `config.json` of each component, keyed by
    the pipeline's component names (`model_index.json`)."""

    class_name: Annotated[
        PipelineClass, Meta(description="The pipeline class (`model_index.json` `_class_name`).")
    ]
    components: Annotated[
        dict[
            Annotated[
                Literal[
                    "unet",
                    "transformer",
                    "vae",
                    "text_encoder",
                    "text_encoder_2",
                    "text_encoder_3",
                ],
                Meta(description="Component name."),
            ],
            _Config,
        ],
        Meta(
            min_length=1,
            max_length=6,
            description="`config.json` of each component: `unet` or `transformer`, `vae` and the "
            "pipeline's text encoders.",
        ),
    ]
    name: Annotated[Name | None, Meta(description="Label in the answer.")] = None

    def __hash__(self) -> int:
        # encoded once per components object (config_key keeps the object with its encoding)
        return hash((self.class_name, config_key(self.components)))


PipelineSource = PresetPipeline | ComponentsPipeline


class ImageGenerationWorkload(
    Wire, tag="image_generation", tag_field="kind", frozen=True, kw_only=True
):
    """One call of a ``diffusers`` text-to-image pipeline: prompt encoding, the denoising steps
    and the VAE decode of ``batch_size`` images of ``height`` x ``width`` pixels."""

    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the pipeline's name.")
    ] = None
    pipeline: Annotated[
        PipelineSource,
        Meta(description="The pipeline: a preset, or a class with its components' configs."),
    ]
    height: Annotated[
        int,
        Meta(
            ge=64,
            le=8192,
            multiple_of=8,
            description="Image height in pixels (64 .. 8192, a multiple of 8; FLUX and SD3 "
            "need a multiple of 16: the latents are patched 2 x 2).",
        ),
    ] = 1024
    width: Annotated[
        int,
        Meta(
            ge=64,
            le=8192,
            multiple_of=8,
            description="Image width in pixels (64 .. 8192, a multiple of 8).",
        ),
    ] = 1024
    batch_size: Annotated[
        int,
        Meta(
            ge=1,
            le=256,
            description="Images per call (`num_images_per_prompt` x prompts), 1 .. 256.",
        ),
    ] = 1
    num_frames: Annotated[
        int,
        Meta(
            ge=1,
            le=1024,
            description="Frames of a video pipeline; image pipelines take 1 (the default).",
        ),
    ] = 1
    guidance: Annotated[
        bool | None,
        Meta(
            description="Classifier-free guidance: the UNet/SD3 pipelines run the denoiser on "
            "the negative and the positive prompt in one batch of 2 x batch_size; FLUX "
            "(guidance-distilled) runs it twice in sequence (`true_cfg_scale` > 1 with a "
            "negative prompt). Default (null): the pipeline's own default -- on for SD 1.5, "
            "SDXL and SD3 (guidance_scale > 1), off for FLUX."
        ),
    ] = None
    max_sequence_length: Annotated[
        Annotated[int, Meta(ge=1, le=4096)] | None,
        Meta(
            description="T5 prompt tokens (SD3, FLUX); default (null): the pipeline's "
            "`max_sequence_length` default (SD3 256, FLUX 512).",
        ),
    ] = None
    precision: Annotated[
        DiffusionDType | None,
        Meta(
            description="Dtype of the weights and the computation (`torch_dtype`); default "
            "(null): the pipeline's usual one (fp16 for SD 1.5, SDXL and SD3, bf16 for FLUX)."
        ),
    ] = None
    attention_slicing: Annotated[
        Literal["none", "auto", "max"],
        Meta(
            description="`pipe.enable_attention_slicing(...)`: `auto` computes attention on "
            "half the heads at a time, `max` one head at a time (UNet pipelines; the score "
            "matrices are materialized per slice instead of the SDPA kernel's O(s) state)."
        ),
    ] = "none"
    vae_tiling: Annotated[
        bool,
        Meta(
            description="`pipe.vae.enable_tiling()`: decode latents larger than the VAE's "
            "`sample_size` in overlapping tiles."
        ),
    ] = False
    vae_slicing: Annotated[
        bool, Meta(description="`pipe.vae.enable_slicing()`: decode one image at a time.")
    ] = False
    cpu_offload: Annotated[
        Literal["none", "model", "sequential"],
        Meta(
            description="`none`: every component on the GPU (`pipe.to('cuda')`). `model`: "
            "`enable_model_cpu_offload()`, one component on the GPU at a time. "
            "`sequential`: `enable_sequential_cpu_offload()`, one submodule's weights at a "
            "time."
        ),
    ] = "none"
    instances: Annotated[
        int,
        Meta(
            ge=1,
            le=256,
            description="Identical co-located pipelines (each its own process and CUDA context).",
        ),
    ] = 1
