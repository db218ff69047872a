"""The GPU catalog and the model presets: data files under ``data/`` with a source per entry.

The files are decoded into typed structs once, at import; a malformed entry fails loudly (and a
test decodes both files), so the service never starts with a catalog it cannot trust.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal

import msgspec

from .arch import Arch
from .dtypes import NativeDType
from .errors import UnknownGPU, UnknownModel
from .hf_config import HFConfig, typed_config

__all__ = [
    "GPU",
    "GPU_IDS",
    "MODEL_IDS",
    "CheckpointFacts",
    "MIGProfile",
    "ModelPreset",
    "Source",
    "gpu",
    "gpus",
    "match_gpu",
    "preset",
    "preset_arch",
    "preset_config",
    "presets",
]

DTypeName = NativeDType


class Source(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a catalog fact can be checked: a ``url`` (https), or a GitHub ``repo`` + ``path`` +
    ``commit`` (40 hex digits), with a verbatim ``quote`` of the text the fact follows.
    ``unverified`` says, when it is set, what about this source is not confirmed (for example a
    link that is a search for the quote because the file's location was not recorded)."""

    url: str | None = None
    repo: str | None = None
    path: str | None = None
    commit: str | None = None
    quote: str | None = None
    note: str | None = None
    unverified: str | None = None


class MIGProfile(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    memory_marketing: str | None = None
    max_instances: int | None = None


class GPU(msgspec.Struct, frozen=True, kw_only=True):
    """A catalog device. ``memory_total_bytes`` is what the CUDA/HIP runtime reports as total
    (``cudaMemGetInfo``), not the marketing capacity; ``memory_total_basis`` says how it is
    known and ``memory_total_precision_bytes`` how exactly."""

    id: str
    name: str
    vendor: Literal["nvidia", "amd"]
    architecture: str
    compute_capability: str | None = None
    gfx_target: str | None = None
    segment: Literal["datacenter", "workstation", "consumer"]
    marketing_memory: str
    memory_total_bytes: int
    memory_total_basis: Literal["runtime", "runtime_gib_2dp", "nvidia_smi", "marketing"]
    memory_total_precision_bytes: int = 0
    memory_total_source: Source
    nvidia_smi_total_mib: int | None = None
    memory_bandwidth_bytes_per_s: int | None = None
    native_dtypes: tuple[DTypeName, ...]
    mig_profiles: tuple[MIGProfile, ...] = ()
    tdp_watts: int | None = None
    interconnect: str | None = None
    spec_sources: tuple[Source, ...] = ()
    notes: str | None = None


class CheckpointFacts(msgspec.Struct, frozen=True, kw_only=True):
    num_params: int | None
    counts: Literal["loaded", "checkpoint"] = "loaded"
    stored_dtype: str | None = None
    total_size_bytes: int | None = None
    how: str
    source: Source | None = None
    rounded_cross_check: str | None = None


class ModelPreset(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    display_name: str
    hf_repo: str
    config: Annotated[
        dict[str, Any] | None,
        msgspec.Meta(extra_json_schema={"$ref": "#/components/schemas/HFConfig"}),
    ]
    """The ``config.json`` as published (every key); None only while an entry is incomplete;
    such entries are not served."""
    config_source: Source
    checkpoint: CheckpointFacts
    notes: str | None = None


class _GPUFile(msgspec.Struct):
    schema: Literal["vrambudget.gpus/1"]
    gpus: tuple[GPU, ...]


class _ModelFile(msgspec.Struct):
    schema: Literal["vrambudget.models/1"]
    presets: tuple[ModelPreset, ...]


def _read(name: str) -> bytes:
    return resources.files("vrambudget.core.data").joinpath(name).read_bytes()


@cache
def gpus() -> dict[str, GPU]:
    entries = msgspec.json.decode(_read("gpus.json"), type=_GPUFile).gpus
    return {g.id: g for g in entries}


@cache
def presets() -> dict[str, ModelPreset]:
    entries = msgspec.json.decode(_read("models.json"), type=_ModelFile).presets
    return {p.id: p for p in entries if p.config is not None}


def gpu(gpu_id: str) -> GPU:
    try:
        return gpus()[gpu_id]
    except KeyError:
        raise UnknownGPU(gpu_id) from None


def preset(model_id: str) -> ModelPreset:
    try:
        return presets()[model_id]
    except KeyError:
        raise UnknownModel(model_id) from None


def preset_config(model_id: str) -> HFConfig:
    """The typed view of a preset's ``config.json``."""
    config = preset(model_id).config
    assert config is not None  # presets() serves complete entries only
    return typed_config(config)


@cache
def preset_arch(model_id: str) -> Arch:
    from .families import arch_from_hf_config

    return arch_from_hf_config(preset_config(model_id))


def _literal(values: tuple[str, ...]) -> Any:
    return Literal[values] if values else str


GPU_IDS: tuple[str, ...] = tuple(gpus())
MODEL_IDS: tuple[str, ...] = tuple(presets())
GPUId: Any = _literal(GPU_IDS)
ModelId: Any = _literal(MODEL_IDS)


def _tokens(name: str) -> set[str]:
    return {t for t in name.lower().replace("-", " ").split() if t not in ("nvidia", "amd")}


def match_gpu(
    name: str, memory_total_bytes: int | None, compute_capability: str | None
) -> GPU | None:
    """The catalog GPU a CUDA device name (``torch.cuda.get_device_name``) and its reported
    total memory are: same compute capability, total within 1%, then the most name tokens in
    common (``"NVIDIA H100 80GB HBM3"`` vs ``"... PCIe"``). None when nothing is close."""
    best: tuple[int, float, str] | None = None
    found: GPU | None = None
    words = _tokens(name)
    for g in gpus().values():
        if (
            compute_capability
            and g.compute_capability
            and (g.compute_capability != compute_capability)
        ):
            continue
        if memory_total_bytes is not None:
            gap = abs(g.memory_total_bytes - memory_total_bytes) / g.memory_total_bytes
            if gap > 0.01:
                continue
        else:
            gap = 0.0
        common = len(words & _tokens(g.name))
        if common == 0:
            continue
        key = (common, -gap, g.id)
        if best is None or key > best:
            best, found = key, g
    return found
