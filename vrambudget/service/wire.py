"""The service's own wire types (the core's are the budgets, fits and catalogs)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from vrambudget.core.catalog import preset, preset_arch
from vrambudget.core.catalog_view import CatalogModel, Citation, citation
from vrambudget.core.dtypes import bytes_of
from vrambudget.core.formulas.kv_cache import model_bytes_per_token

__all__ = ["Health", "ModelDetail", "ModelSummary", "Ready", "model_summary"]


class ModelSummary(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    display_name: str
    hf_repo: str
    model_type: str
    num_params: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    kv_cache_bytes_per_token_bf16: int
    """K+V bytes per token over all layers in bf16 (full-attention layers; sliding layers cap at
    their window)."""
    config_source: Annotated[
        Citation,
        msgspec.Meta(
            description="Where the `config.json` these figures are computed from is published."
        ),
    ]


class ModelDetail(msgspec.Struct, frozen=True, kw_only=True):
    summary: ModelSummary
    preset: CatalogModel


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: str


class Ready(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    num_gpus: int
    num_models: int


def model_summary(model_id: str) -> ModelSummary:
    p = preset(model_id)
    a = preset_arch(model_id)
    return ModelSummary(
        id=p.id,
        display_name=p.display_name,
        hf_repo=p.hf_repo,
        model_type=a.model_type,
        num_params=a.num_params,
        num_layers=a.num_layers,
        hidden_size=a.hidden_size,
        num_attention_heads=a.num_heads,
        num_key_value_heads=a.num_kv_heads,
        max_position_embeddings=a.max_positions,
        kv_cache_bytes_per_token_bf16=model_bytes_per_token(a, bytes_of("bf16")),
        config_source=citation(p.config_source),
    )
