"""The pipeline presets: ``data/pipelines.json``, each component's ``config.json`` as published
with its source and the published parameter count (the catalog's ``Source`` and
``CheckpointFacts``, as ``models.json`` cites its models)."""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

import msgspec

from ..catalog import CheckpointFacts, Source
from ..data import data_file

__all__ = ["PIPELINE_IDS", "ComponentPreset", "PipelinePreset", "pipeline_preset", "presets"]


class ComponentPreset(msgspec.Struct, frozen=True, kw_only=True):
    config: dict[str, Any]
    """The component's ``config.json`` as published."""
    config_source: Source
    checkpoint: CheckpointFacts


class PipelinePreset(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    display_name: str
    hf_repo: str
    class_name: str
    default_dtype: Literal["fp16", "bf16", "fp32"]
    components: dict[str, ComponentPreset]
    notes: str | None = None


class _File(msgspec.Struct):
    schema: Literal["vrambudget.pipelines/1"]
    presets: tuple[PipelinePreset, ...]


@cache
def presets() -> dict[str, PipelinePreset]:
    return {p.id: p for p in data_file("pipelines.json", _File).presets}


def pipeline_preset(preset_id: str) -> PipelinePreset:
    return presets()[preset_id]


PIPELINE_IDS: tuple[str, ...] = tuple(presets())
