"""What the catalog routes serve: each GPU's and model preset's facts with short citations.

A served :class:`Citation` is what a catalog page can show beside a fact: a ``title`` for the
link, an https ``url`` a reader can open (a GitHub file at its commit for a ``repo`` + ``path``
+ ``commit`` source), the verbatim ``quote`` the fact follows, and whether that quote was
confirmed at that address. The research detail behind each entry (a source's ``note`` and
``unverified`` words, an entry's ``notes``, a checkpoint count's ``how``) stays in the data files
(``data/gpus.json``, ``data/models.json``), where a reviewer checks it; it is not served.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec

from .catalog import (
    GPU,
    CheckpointFacts,
    GPUFacts,
    Interconnect,
    InterconnectFacts,
    MIGProfile,
    MIGProfileFacts,
    ModelPreset,
    Source,
    gpus,
)

__all__ = [
    "QUOTE_MAX_CHARS",
    "CatalogCheckpoint",
    "CatalogGPU",
    "CatalogInterconnect",
    "CatalogMIGProfile",
    "CatalogModel",
    "Citation",
    "citation",
    "citation_title",
    "gpu_entries",
    "gpu_entry",
    "model_entry",
]

QUOTE_MAX_CHARS = 300
"""The longest served quote (the catalog's longest is a 254-character ``torch`` printout; a
test keeps every quote in the data files within this)."""


class Citation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a catalog fact can be checked."""

    title: Annotated[
        str,
        msgspec.Meta(
            description="A label for the link: the site and the document, read from the "
            "address (`NVIDIA/mig-parted: deployments/systemd/config-default.yaml`, "
            "`Hugging Face: Qwen/Qwen2.5-7B config.json`)."
        ),
    ]
    url: Annotated[
        str,
        msgspec.Meta(
            pattern=r"^https://",
            description="The address (https); a GitHub file is linked at the commit it was "
            "read at.",
        ),
    ]
    quote: Annotated[
        str | None,
        msgspec.Meta(
            description="The source's words the fact follows, verbatim (at most "
            f"{QUOTE_MAX_CHARS} characters; the lines of a multi-line printout joined by ` / `); "
            "null where the source backs the entry as a whole."
        ),
    ] = None
    confirmed: Annotated[
        bool,
        msgspec.Meta(
            description="false where the quote was not confirmed at this address: it was read "
            "in a copy of the document, the link is a search for the quoted text, or the value "
            "follows from the source's other entries rather than a line of its own."
        ),
    ] = True


class CatalogMIGProfile(MIGProfileFacts, frozen=True, kw_only=True):
    """A MIG GPU instance profile with its citations."""

    memory_source: Annotated[
        Citation | None,
        msgspec.Meta(
            description="The `nvidia-smi mig -lgip` listing `memory_gib_2dp` is read from; "
            "null where no listing was found (only the name's marketing size is known)."
        ),
    ] = None
    source: Annotated[
        Citation,
        msgspec.Meta(description="Where the profile's name and instance count are published."),
    ]


class CatalogInterconnect(InterconnectFacts, frozen=True, kw_only=True):
    """The GPU type's links with their citations."""

    sources: Annotated[
        tuple[Citation, ...], msgspec.Meta(description="Where the links' figures are published.")
    ] = ()
    confirmed: Annotated[
        bool,
        msgspec.Meta(
            description="false where part of these figures (the link bandwidth, the domain "
            "size, the PCIe generation) is not confirmed by the cited sources: it follows the "
            "platform or a product brief not cited here."
        ),
    ] = True


class CatalogGPU(GPUFacts, frozen=True, kw_only=True):
    """A catalog GPU as served: its facts, each sourced fact with its citation."""

    memory_total_source: Annotated[
        Citation,
        msgspec.Meta(
            description="Where `memory_total_bytes` is read (`memory_total_basis` says what "
            "kind of figure it is)."
        ),
    ]
    nvidia_smi_total_source: Annotated[
        Citation | None,
        msgspec.Meta(
            description="Where `nvidia_smi_total_mib` is read: an nvidia-smi printout naming "
            "the GPU (null where the value has no citation here)."
        ),
    ] = None
    sm_count_source: Annotated[
        Citation | None,
        msgspec.Meta(
            description="Where `sm_count` is read: a device-properties printout or a data "
            "sheet naming the GPU (null where the catalog has no SM count)."
        ),
    ] = None
    mig_profiles: tuple[CatalogMIGProfile, ...] = ()
    interconnect: CatalogInterconnect | None = None
    spec_sources: Annotated[
        tuple[Citation, ...],
        msgspec.Meta(
            description="Data sheets and listings for the rest of the entry (architecture, "
            "compute capability, bandwidth, power)."
        ),
    ] = ()


class CatalogCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """The published checkpoint's size: what the disk and the stored-dtype defaults read."""

    num_params: int | None
    """The published parameter count."""
    counts: Literal["loaded", "checkpoint"]
    """``loaded``: parameters as transformers loads them; ``checkpoint``: as stored."""
    stored_dtype: str | None = None
    total_size_bytes: int | None = None
    """The safetensors index's ``total_size``, when published."""
    source: Annotated[
        Citation | None,
        msgspec.Meta(
            description="Where the count and size are published; null where the count was "
            "put together from several sources (the data file records how)."
        ),
    ] = None


class CatalogModel(msgspec.Struct, frozen=True, kw_only=True):
    """A model preset as served: the ``config.json`` it is computed from and the published
    checkpoint's size (the citation of the ``config.json`` is the summary's ``config_source``,
    served beside it)."""

    id: str
    display_name: str
    hf_repo: str
    config: Annotated[
        dict[str, Any],
        msgspec.Meta(extra_json_schema={"$ref": "#/components/schemas/HFConfig"}),
    ]
    """The ``config.json`` as published (every key)."""
    checkpoint: CatalogCheckpoint


# ------------------------------------------------------------------------------ citations --


def _github_title(parts: list[str], query: str) -> str:
    if parts == ["search"]:
        q = parse_qs(query).get("q", [""])[0]
        return f"GitHub code search: {q}"
    if len(parts) >= 4 and parts[2] in ("issues", "pull", "discussions"):
        kind = {"issues": "issue", "pull": "pull request", "discussions": "discussion"}[parts[2]]
        number = parts[3].removesuffix(".patch").removesuffix(".diff")
        return f"{parts[0]}/{parts[1]} {kind} #{number}"
    if len(parts) >= 5 and parts[2] == "blob":
        return f"{parts[0]}/{parts[1]}: {'/'.join(parts[4:])}"
    return "GitHub: " + "/".join(parts)


def _huggingface_title(parts: list[str]) -> str:
    if parts[:2] == ["api", "models"]:
        return f"Hugging Face API: {'/'.join(parts[2:4])}"
    if len(parts) >= 5 and parts[2] in ("blob", "resolve"):
        return f"Hugging Face: {parts[0]}/{parts[1]} {'/'.join(parts[4:])}"
    return "Hugging Face: " + "/".join(parts)


def citation_title(s: Source) -> str:
    """A short label for a source's link, read from its address alone (never invented)."""
    if s.url is None:
        return f"{s.repo}: {s.path}"
    u = urlsplit(s.url)
    parts = [unquote(p) for p in u.path.split("/") if p]
    if u.netloc == "github.com":
        return _github_title(parts, u.query)
    if u.netloc == "huggingface.co":
        return _huggingface_title(parts)
    return f"{u.netloc}: {'/'.join(parts)}" if parts else u.netloc


def citation(s: Source) -> Citation:
    """The served form of a catalog source."""
    url = s.url if s.url is not None else f"https://github.com/{s.repo}/blob/{s.commit}/{s.path}"
    return Citation(title=citation_title(s), url=url, quote=s.quote, confirmed=s.unverified is None)


# -------------------------------------------------------------------------------- entries --


def _facts(obj: msgspec.Struct, cls: type[msgspec.Struct]) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in cls.__struct_fields__}


def _mig(m: MIGProfile) -> CatalogMIGProfile:
    return CatalogMIGProfile(
        **_facts(m, MIGProfileFacts),
        memory_source=citation(m.memory_source) if m.memory_source is not None else None,
        source=citation(m.source),
    )


def _interconnect(i: Interconnect) -> CatalogInterconnect:
    return CatalogInterconnect(
        **_facts(i, InterconnectFacts),
        sources=tuple(citation(s) for s in i.sources),
        confirmed=i.unverified is None,
    )


def gpu_entry(g: GPU) -> CatalogGPU:
    """A GPU's served entry: its facts, sources as citations, no research notes."""
    return CatalogGPU(
        **_facts(g, GPUFacts),
        memory_total_source=citation(g.memory_total_source),
        nvidia_smi_total_source=(
            citation(g.nvidia_smi_total_source) if g.nvidia_smi_total_source is not None else None
        ),
        sm_count_source=citation(g.sm_count_source) if g.sm_count_source is not None else None,
        mig_profiles=tuple(_mig(m) for m in g.mig_profiles),
        interconnect=_interconnect(g.interconnect) if g.interconnect is not None else None,
        spec_sources=tuple(citation(s) for s in g.spec_sources),
    )


@cache
def gpu_entries() -> dict[str, CatalogGPU]:
    """Every catalog GPU's served entry by id, built once (the catalog is fixed)."""
    return {i: gpu_entry(g) for i, g in gpus().items()}


def _checkpoint(c: CheckpointFacts) -> CatalogCheckpoint:
    return CatalogCheckpoint(
        num_params=c.num_params,
        counts=c.counts,
        stored_dtype=c.stored_dtype,
        total_size_bytes=c.total_size_bytes,
        source=citation(c.source) if c.source is not None else None,
    )


def model_entry(p: ModelPreset) -> CatalogModel:
    """A model preset's served entry (complete presets only: ``presets()`` serves no other)."""
    assert p.config is not None  # presets() holds complete entries only
    return CatalogModel(
        id=p.id,
        display_name=p.display_name,
        hf_repo=p.hf_repo,
        config=p.config,
        checkpoint=_checkpoint(p.checkpoint),
    )
