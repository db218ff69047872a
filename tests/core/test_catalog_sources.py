"""Every GPU and model-preset entry cites a source a reader can open (an https URL, or a GitHub
repository + path + 40-hex commit) with a verbatim quote, and no entry carries private ids or
first-person notes."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest

from vrambudget.core.catalog import Source, gpus, presets

_HEX40 = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# Wording that points at something a reader cannot open, or at the author rather than the fact.
DENYLIST = ("index file id", "find_string", "task brief", " I ", "I did", "my ")
_PRIVATE_ID = re.compile(r"\bids? \d{5,}")


def _openable(s: Source) -> bool:
    if s.url is not None:
        return s.url.startswith("https://") and s.repo is None and s.commit is None
    return (
        s.repo is not None
        and _REPO.fullmatch(s.repo) is not None
        and bool(s.path)
        and s.commit is not None
        and _HEX40.fullmatch(s.commit) is not None
    )


def _sources() -> list[tuple[str, str, Source, bool]]:
    """(entry, field, source, quote required) for every source in both catalogs."""
    out: list[tuple[str, str, Source, bool]] = []
    for g in gpus().values():
        out.append((g.id, "memory_total_source", g.memory_total_source, True))
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
    assert _openable(source), (entry, field, source)
    if needs_quote:
        assert source.quote and source.quote.strip(), (entry, field)
    assert source.quote is None or source.quote.strip(), (entry, field)


def test_every_entry_has_a_quoted_primary_source() -> None:
    assert {e for e, f, _, _ in SOURCES if f == "memory_total_source"} == set(gpus())
    assert {e for e, f, _, _ in SOURCES if f == "config_source"} == set(presets())


def _strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(node, str):
        return [(path, node)]
    if isinstance(node, dict):
        return [x for k, v in node.items() for x in _strings(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [x for i, v in enumerate(node) for x in _strings(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("name", ["gpus.json", "models.json"])
def test_no_private_ids_or_first_person_wording(name: str) -> None:
    raw = json.loads(resources.files("vrambudget.core.data").joinpath(name).read_text())
    entries = raw["gpus"] if "gpus" in raw else raw["presets"]
    bad = []
    for e in entries:
        # the config itself is model data (vendor-chosen strings), not prose about sources
        prose = {k: v for k, v in e.items() if k != "config"}
        for path, text in _strings(prose):
            padded = f" {text} "
            hits = [w for w in DENYLIST if w in padded] + _PRIVATE_ID.findall(text)
            if hits:
                bad.append((e["id"], path, hits))
    assert not bad, bad
