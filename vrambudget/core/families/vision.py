"""Gemma 3's vision tower and multimodal projector, loaded by
``Gemma3ForConditionalGeneration`` next to the language model."""

from __future__ import annotations

from msgspec import UnsetType

from ..arch import Role, Split, TensorGroup
from ..errors import InvalidWorkload
from ..hf_config import HFVisionConfig
from ..hf_defaults import GEMMA3_VISION_DEFAULTS
from .config import _Cfg
from .tensors import T, linear, norm


def _vision_tensors(
    vision: HFVisionConfig | UnsetType | None, text_hidden: int
) -> list[TensorGroup]:
    """Gemma 3's SigLIP tower (``modeling_siglip.py``) and ``Gemma3MultiModalProjector``."""
    vc = _Cfg(vision, GEMMA3_VISION_DEFAULTS)
    hv, fv = vc.get("hidden_size"), vc.get("intermediate_size")
    patch, channels = vc.get("patch_size"), vc.get("num_channels")
    num_patches = (vc.get("image_size") // patch) ** 2
    layers = vc.get("num_hidden_layers")
    per_layer = [
        *norm("layer_norm1", hv, layernorm=True),
        *(
            g
            for n in ("q_proj", "k_proj", "v_proj", "out_proj")
            for g in linear(n, hv, hv, Split.REPLICATED, role=Role.VISION, bias=True)
        ),
        *norm("layer_norm2", hv, layernorm=True),
        *linear("fc1", fv, hv, Split.REPLICATED, role=Role.VISION, bias=True),
        *linear("fc2", hv, fv, Split.REPLICATED, role=Role.VISION, bias=True),
    ]
    groups = [
        T("vision.patch_embedding", hv, channels * patch * patch, Role.VISION, Split.REPLICATED),
        T("vision.patch_embedding.bias", hv, 1, Role.VISION, Split.REPLICATED),
        T("vision.position_embedding", num_patches, hv, Role.VISION, Split.REPLICATED),
        *(
            T(
                f"vision.layers.{g.name}",
                g.rows,
                g.cols,
                Role.VISION,
                Split.REPLICATED,
                g.count * layers,
            )
            for g in per_layer
        ),
        *(
            T(f"vision.{g.name}", g.rows, g.cols, Role.VISION, Split.REPLICATED)
            for g in norm("post_layernorm", hv, layernorm=True)
        ),
        T(
            "multi_modal_projector.mm_input_projection_weight",
            hv,
            text_hidden,
            Role.VISION,
            Split.REPLICATED,
        ),
        T("multi_modal_projector.mm_soft_emb_norm", hv, 1, Role.VISION, Split.REPLICATED),
    ]
    if vc.get("vision_use_head"):
        raise InvalidWorkload("config.vision_config.vision_use_head", "true is not supported")
    return groups
