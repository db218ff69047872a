"""The GPU catalog and the model presets: data files under ``data/`` with a source per entry.

The files are decoded into typed structs once, at import; a malformed entry fails loudly (and a
test decodes both files), so the service never starts with a catalog it cannot trust.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Annotated, Any, Literal

import msgspec

from .arch import Arch
from .data import data_file
from .dtypes import NativeDType
from .errors import UnknownGPU, UnknownModel
from .hf_config import HFConfig, typed_config

__all__ = [
    "GPU",
    "GPU_IDS",
    "MIG_COMPUTE_SLICES",
    "MODEL_IDS",
    "CheckpointFacts",
    "GPUFacts",
    "Interconnect",
    "InterconnectFacts",
    "MIGProfile",
    "MIGProfileFacts",
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
    link that is a search for the quote because the file's location was not recorded).

    ``note`` and ``unverified`` are the research record, read by reviewers in the data file;
    the service serves each source as a short :class:`vrambudget.core.catalog_view.Citation`
    (title, https address, quote, whether the quote was confirmed there)."""

    url: str | None = None
    repo: str | None = None
    path: str | None = None
    commit: str | None = None
    quote: str | None = None
    note: str | None = None
    unverified: str | None = None


MIG_COMPUTE_SLICES = 7
"""Compute slices of every MIG-capable GPU in the catalog (A100, H100, H20, H200, B200, GB200):
a profile ``Ng.*`` has N of 7 (the MIG User Guide's "Fraction of SMs" column, N/7)."""


class MIGProfileFacts(msgspec.Struct, frozen=True, kw_only=True):
    """One MIG GPU instance profile (a GPU instance with its one default compute instance), as
    ``nvidia-smi mig -lgip`` and the MIG User Guide's *Supported MIG Profiles* tables name it.
    Media-extension variants (``+me``, ``+gfx``, ``-me``) are not listed: they have the same
    memory and SMs as their base profile and at most one instance, so they never change a fit.

    ``memory_gib_2dp`` is the instance's memory as ``nvidia-smi mig -lgip`` prints it (GiB,
    two decimals) in the cited listing; when no listing was found it is None and only the
    marketing size (the name's ``gb`` number) is known: :mod:`vrambudget.core.mig` turns
    either into the capacity a fit uses."""

    name: str
    compute_slices: Annotated[int, msgspec.Meta(ge=1, le=MIG_COMPUTE_SLICES)]
    memory_fraction: str
    """The MIG User Guide's "Fraction of Memory" (``1/8``, ``2/8``, ``4/8``, ``Full``)."""
    max_instances: Annotated[int, msgspec.Meta(ge=1, le=7)]
    memory_marketing: str
    memory_gib_2dp: str | None = None


class MIGProfile(MIGProfileFacts, frozen=True, kw_only=True):
    """A MIG profile as the data file records it: its facts and their sources."""

    memory_source: Source | None = None
    """The ``nvidia-smi mig -lgip`` listing ``memory_gib_2dp`` is read from."""
    source: Source
    """Where the profile's name and instance count are published."""


class InterconnectFacts(msgspec.Struct, frozen=True, kw_only=True):
    """How GPUs of this type talk to each other in the usual server: the fast link (NVLink
    through NVSwitch, NVLink bridges, AMD xGMI / Infinity Fabric) and the PCIe generation every
    card also has. ``domain_max_gpus`` is the most GPUs one tensor-parallel group can span on
    the fast link (1: PCIe only)."""

    kind: Literal["nvswitch", "nvlink", "nvlink_bridge", "xgmi", "pcie"]
    """``nvswitch``: NVLink through NVSwitch (every GPU of the domain at full bandwidth);
    ``nvlink``: direct NVLink between the GPUs of a baseboard; ``nvlink_bridge``: NVLink bridges
    join a pair of cards; ``xgmi``: AMD Infinity Fabric links; ``pcie``: no GPU-to-GPU link."""
    link_bytes_per_s: int | None = None
    """The fast link's bandwidth per GPU (both directions together, as the vendors state it);
    None for ``pcie`` (see ``pcie_generation``) or where no source gave it."""
    domain_max_gpus: Annotated[int, msgspec.Meta(ge=1, le=576)]
    pcie_generation: Annotated[int, msgspec.Meta(ge=3, le=6)] | None = None
    pcie_lanes: Annotated[int, msgspec.Meta(ge=1, le=16)] = 16
    summary: str


class Interconnect(InterconnectFacts, frozen=True, kw_only=True):
    """The links as the data file records them: their facts and sources; ``unverified`` says
    what about them no source confirmed."""

    sources: tuple[Source, ...] = ()
    unverified: str | None = None


class GPUFacts(msgspec.Struct, frozen=True, kw_only=True):
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
    nvidia_smi_total_mib: int | None = None
    memory_bandwidth_bytes_per_s: int | None = None
    native_dtypes: tuple[DTypeName, ...]
    tdp_watts: int | None = None
    sm_count: int | None = None
    """Streaming multiprocessors (NVIDIA; torch's ``multi_processor_count``): the bare CUDA
    context at a process's start grows with them
    (:func:`vrambudget.core.formulas.cuda_context.start_context`)."""


class GPU(GPUFacts, frozen=True, kw_only=True):
    """A catalog GPU as the data file records it: its facts, their sources, and ``notes`` (the
    research behind the entry: corroborating figures, what was not found). The service serves
    :class:`vrambudget.core.catalog_view.CatalogGPU`, without the notes."""

    memory_total_source: Source
    nvidia_smi_total_source: Source | None = None
    """Where ``nvidia_smi_total_mib`` was read: an ``nvidia-smi`` printout naming the GPU."""
    sm_count_source: Source | None = None
    """Where ``sm_count`` was read: a device-properties printout or a data sheet naming it."""
    mig_profiles: tuple[MIGProfile, ...] = ()
    interconnect: Interconnect | None = None
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


@cache
def gpus() -> dict[str, GPU]:
    entries = data_file("gpus.json", _GPUFile).gpus
    return {g.id: g for g in entries}


@cache
def presets() -> dict[str, ModelPreset]:
    entries = data_file("models.json", _ModelFile).presets
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
    words = name.lower().replace("-", " ").replace("/", " ").split()
    return {t.strip("(),") for t in words} - {"nvidia", "amd", ""}


_NOT_MODEL = re.compile(r"\d+gb|sxm\d*|hbm\d\w*|gddr\d\w*")
"""Tokens with digits that name a size, a form factor or a memory type, not the model."""
_MODIFIERS = frozenset({"ti", "super", "xt", "xtx"})
"""Words that make another card of the same model number (an RTX 4070 Ti is not an RTX 4070)."""


def _same_model(device: set[str], catalog: set[str]) -> bool:
    """Whether a device name's tokens name the catalog entry's model: every model number of the
    entry (``h100``, ``4070``, ``a6000``, ``mi250x``) is among them, and the same modifiers."""
    numbers = {t for t in catalog if any(c.isdigit() for c in t) and not _NOT_MODEL.fullmatch(t)}
    return numbers <= device and (device & _MODIFIERS) == (catalog & _MODIFIERS)


@cache
def runtime_gaps() -> tuple[int, int]:
    """(smallest, largest) bytes by which nvidia-smi's total exceeds the CUDA runtime's over
    the catalog GPUs whose entries give both, the runtime's exactly (the driver's reservation:
    239.9 MiB on a V100 SXM2 16GB .. 882.3 MiB on an A100 PCIe 80GB)."""
    gaps = [
        (g.nvidia_smi_total_mib << 20) - g.memory_total_bytes
        for g in gpus().values()
        if g.memory_total_basis == "runtime"
        and g.memory_total_precision_bytes == 0
        and g.nvidia_smi_total_mib is not None
    ]
    return min(gaps), max(gaps)


def match_gpu(
    name: str, memory_total_bytes: int | None, compute_capability: str | None
) -> GPU | None:
    """The catalog GPU a CUDA device name (``torch.cuda.get_device_name``) and its reported
    total memory are: same compute capability, total within 1%, the entry's model number and
    modifiers in the name (an RTX 3080 Ti is not the RTX 3080 10GB, nor an RTX 4070 SUPER the
    RTX 4070), then the most name tokens in common (``"NVIDIA H100 80GB HBM3"`` vs ``"...
    PCIe"``). None when nothing is close."""
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
            # an entry that holds nvidia-smi's total: a runtime reports up to the largest
            # reservation less
            below = runtime_gaps()[1] if g.memory_total_basis == "nvidia_smi" else 0
            if gap > 0.01 and not (
                0
                <= g.memory_total_bytes - memory_total_bytes
                <= below + g.memory_total_bytes // 100
            ):
                continue
        else:
            gap = 0.0
        theirs = _tokens(g.name)
        common = len(words & theirs)
        if common == 0 or not _same_model(words, theirs):
            continue
        key = (common, -gap, g.id)
        if best is None or key > best:
            best, found = key, g
    return found
