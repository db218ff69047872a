"""Every GPU and model-preset entry cites a source a reader can open (an https URL, or a GitHub
repository + path + 40-hex commit) with a verbatim quote, and no entry carries private ids or
first-person notes."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from tests.support.sources import openable, wording_hits
from vrambudget.core.catalog import Source, gpus, presets


def _sources() -> list[tuple[str, str, Source, bool]]:
    """(entry, field, source, quote required) for every source in both catalogs."""
    out: list[tuple[str, str, Source, bool]] = []
    for g in gpus().values():
        out.append((g.id, "memory_total_source", g.memory_total_source, True))
        if g.nvidia_smi_total_source is not None:
            out.append((g.id, "nvidia_smi_total_source", g.nvidia_smi_total_source, True))
        if g.sm_count_source is not None:
            out.append((g.id, "sm_count_source", g.sm_count_source, True))
        out += [(g.id, f"spec_sources[{i}]", s, False) for i, s in enumerate(g.spec_sources)]
    for p in presets().values():
        out.append((p.id, "config_source", p.config_source, True))
        if p.checkpoint.source is not None:
            out.append((p.id, "checkpoint.source", p.checkpoint.source, True))
    return out


SOURCES = _sources()


@pytest.mark.parametrize(
    ("entry", "field", "source", "needs_quote"), SOURCES, ids=[f"{e}:{f}" for e, f, _, _ in SOURCES]
)
def test_source_is_openable_and_quoted(
    entry: str, field: str, source: Source, needs_quote: bool
) -> None:
    assert openable(source), (entry, field, source)
    if needs_quote:
        assert source.quote and source.quote.strip(), (entry, field)
    assert source.quote is None or source.quote.strip(), (entry, field)


def test_every_entry_has_a_quoted_primary_source() -> None:
    assert {e for e, f, _, _ in SOURCES if f == "memory_total_source"} == set(gpus())
    cited = {e for e, f, _, _ in SOURCES if f == "nvidia_smi_total_source"}
    assert cited <= {g.id for g in gpus().values() if g.nvidia_smi_total_mib is not None}
    assert {e for e, f, _, _ in SOURCES if f == "config_source"} == set(presets())


def test_every_nvidia_gpu_has_a_quoted_sm_count() -> None:
    """The CUDA context line reads each NVIDIA GPU's SM count: every one has it, quoted where
    the number can be read (the quote names the count)."""
    for g in gpus().values():
        if g.vendor != "nvidia":
            assert g.sm_count is None and g.sm_count_source is None, g.id
            continue
        assert g.sm_count and g.sm_count_source is not None, g.id
        assert g.sm_count_source.quote and str(g.sm_count) in g.sm_count_source.quote, g.id


@pytest.mark.parametrize("name", ["gpus.json", "models.json"])
def test_no_private_ids_or_first_person_wording(name: str) -> None:
    raw = json.loads(resources.files("vrambudget.core.data").joinpath(name).read_text())
    entries = raw["gpus"] if "gpus" in raw else raw["presets"]
    bad = [(e["id"], path, hits) for e in entries for path, hits in wording_hits(e)]
    assert not bad, bad
