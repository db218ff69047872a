"""What the catalog routes serve (``core/catalog_view.py``): every fact of the data file, each
source as a short citation (title, https address, verbatim quote, whether the quote was
confirmed there), and none of the research notes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.catalog import (
    GPUFacts,
    InterconnectFacts,
    MIGProfileFacts,
    Source,
    gpus,
    presets,
)
from vrambudget.core.catalog_view import (
    QUOTE_MAX_CHARS,
    Citation,
    citation,
    citation_title,
    gpu_entry,
    model_entry,
)

COMMIT = "bd7160f43f16462eeb21e1eda5e67b5b6b03fd7d"

TITLES = [
    (
        Source(
            repo="NVIDIA/mig-parted", path="deployments/systemd/config-default.yaml", commit=COMMIT
        ),
        "NVIDIA/mig-parted: deployments/systemd/config-default.yaml",
    ),
    (Source(url="https://github.com/NVIDIA/mig-parted/issues/120"), "NVIDIA/mig-parted issue #120"),
    (
        Source(url="https://github.com/scaleway/docs-content/pull/5834.patch"),
        "scaleway/docs-content pull request #5834",
    ),
    (
        Source(url="https://github.com/search?type=code&q=%22total_memory%3D81008MB%22"),
        'GitHub code search: "total_memory=81008MB"',
    ),
    (
        Source(
            url="https://huggingface.co/api/models/meta-llama/Llama-3.1-8B?expand[]=safetensors"
        ),
        "Hugging Face API: meta-llama/Llama-3.1-8B",
    ),
    (
        Source(url="https://huggingface.co/Qwen/Qwen2.5-72B/blob/main/config.json"),
        "Hugging Face: Qwen/Qwen2.5-72B config.json",
    ),
    (
        Source(url="https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html"),
        "docs.nvidia.com: datacenter/tesla/mig-user-guide/supported-gpus.html",
    ),
    (Source(url="https://www.wheelersnetwork.com/2024/01/"), "www.wheelersnetwork.com: 2024/01"),
]


@pytest.mark.parametrize(("source", "title"), TITLES, ids=[t for _, t in TITLES])
def test_title_is_read_from_the_address(source: Source, title: str) -> None:
    assert citation_title(source) == title


def test_a_repository_source_is_linked_at_its_commit() -> None:
    s = Source(
        repo="NVIDIA/mig-parted",
        path="deployments/systemd/config-default.yaml",
        commit=COMMIT,
        quote='"1g.18gb": 7',
        note="research words, not served",
    )
    assert citation(s) == Citation(
        title="NVIDIA/mig-parted: deployments/systemd/config-default.yaml",
        url=f"https://github.com/NVIDIA/mig-parted/blob/{COMMIT}/deployments/systemd/"
        "config-default.yaml",
        quote='"1g.18gb": 7',
        confirmed=True,
    )
    unconfirmed = Source(url="https://example.org/a", unverified="read in a copy")
    assert citation(unconfirmed).confirmed is False
    # The served JSON leaves out what is at its default (confirmed, no quote).
    assert msgspec.json.decode(msgspec.json.encode(citation(Source(url="https://x.org/")))) == {
        "title": "x.org",
        "url": "https://x.org/",
    }


def _pairs() -> list[tuple[str, Source, Citation]]:
    """(where, data source, served citation) for every source of both catalogs."""
    out: list[tuple[str, Source, Citation]] = []
    for g in gpus().values():
        e = gpu_entry(g)
        out.append((f"{g.id}.memory_total_source", g.memory_total_source, e.memory_total_source))
        if g.nvidia_smi_total_source is not None:
            assert e.nvidia_smi_total_source is not None
            out.append(
                (
                    f"{g.id}.nvidia_smi_total_source",
                    g.nvidia_smi_total_source,
                    e.nvidia_smi_total_source,
                )
            )
        out += [
            (f"{g.id}.spec_sources[{i}]", s, c)
            for i, (s, c) in enumerate(zip(g.spec_sources, e.spec_sources, strict=True))
        ]
        for m, cm in zip(g.mig_profiles, e.mig_profiles, strict=True):
            out.append((f"{g.id}.mig.{m.name}.source", m.source, cm.source))
            if m.memory_source is not None:
                assert cm.memory_source is not None
                out.append(
                    (f"{g.id}.mig.{m.name}.memory_source", m.memory_source, cm.memory_source)
                )
        if g.interconnect is not None:
            assert e.interconnect is not None
            out += [
                (f"{g.id}.interconnect.sources[{i}]", s, c)
                for i, (s, c) in enumerate(
                    zip(g.interconnect.sources, e.interconnect.sources, strict=True)
                )
            ]
    for p in presets().values():
        served = model_entry(p)
        out.append((f"{p.id}.config_source", p.config_source, citation(p.config_source)))
        if p.checkpoint.source is not None:
            assert served.checkpoint.source is not None
            out.append((f"{p.id}.checkpoint.source", p.checkpoint.source, served.checkpoint.source))
    return out


PAIRS = _pairs()


@pytest.mark.parametrize(("where", "source", "cited"), PAIRS, ids=[w for w, _, _ in PAIRS])
def test_every_citation_is_short_openable_and_verbatim(
    where: str, source: Source, cited: Citation
) -> None:
    assert cited.url.startswith("https://") and " " not in cited.url, where
    if source.url is None:  # a GitHub file at the commit it was read at
        assert cited.url == (
            f"https://github.com/{source.repo}/blob/{source.commit}/{source.path}"
        ), where
    else:
        assert cited.url == source.url
    assert 0 < len(cited.title) <= 160, where
    assert cited.quote == source.quote  # verbatim, never shortened
    assert cited.quote is None or len(cited.quote) <= QUOTE_MAX_CHARS, where
    assert cited.confirmed == (source.unverified is None), where


def test_the_catalogs_have_sources_of_every_kind() -> None:
    """The cases above are not vacuous: both address kinds and unconfirmed quotes occur."""
    assert len(PAIRS) >= 200
    assert any(s.url is None for _, s, _ in PAIRS)
    assert any("github.com/search?" in c.url for _, _, c in PAIRS)
    assert sum(not c.confirmed for _, _, c in PAIRS) >= 20


def _facts(obj: msgspec.Struct, cls: type[msgspec.Struct]) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in cls.__struct_fields__}


@pytest.mark.parametrize("gpu_id", sorted(gpus()))
def test_a_served_gpu_keeps_every_fact_and_no_notes(gpu_id: str) -> None:
    g = gpus()[gpu_id]
    e = gpu_entry(g)
    assert _facts(e, GPUFacts) == _facts(g, GPUFacts)
    assert [_facts(m, MIGProfileFacts) for m in e.mig_profiles] == [
        _facts(m, MIGProfileFacts) for m in g.mig_profiles
    ]
    if g.interconnect is None:
        assert e.interconnect is None
    else:
        assert e.interconnect is not None
        assert _facts(e.interconnect, InterconnectFacts) == _facts(
            g.interconnect, InterconnectFacts
        )
        assert e.interconnect.confirmed == (g.interconnect.unverified is None)
    served = msgspec.json.encode(e).decode()
    for key in ('"note"', '"notes"', '"unverified"'):
        assert key not in served
    if g.notes:
        assert g.notes not in served


@pytest.mark.parametrize("model_id", sorted(presets()))
def test_a_served_preset_keeps_its_config_and_checkpoint_facts(model_id: str) -> None:
    p = presets()[model_id]
    e = model_entry(p)
    assert (e.id, e.display_name, e.hf_repo, e.config) == (
        p.id,
        p.display_name,
        p.hf_repo,
        p.config,
    )
    c = p.checkpoint
    assert (
        e.checkpoint.num_params,
        e.checkpoint.counts,
        e.checkpoint.stored_dtype,
        e.checkpoint.total_size_bytes,
    ) == (c.num_params, c.counts, c.stored_dtype, c.total_size_bytes)
    served = msgspec.json.encode(e).decode()
    for key in ('"how"', '"rounded_cross_check"', '"notes"', '"note"', '"unverified"'):
        assert key not in served
