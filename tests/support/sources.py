"""What the catalogs' source tests share: a source a reader can open, and prose free of private
ids and first-person wording (GPU, model and pipeline presets alike)."""

from __future__ import annotations

import re
from typing import Any

from vrambudget.core.catalog import Source

_HEX40 = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# Wording that points at something a reader cannot open, or at the author rather than the fact.
DENYLIST = ("index file id", "find_string", "task brief", " I ", "I did", "my ")
_PRIVATE_ID = re.compile(r"\bids? \d{5,}")


def openable(s: Source) -> bool:
    """An https URL, or a GitHub repository + path + 40-hex commit."""
    if s.url is not None:
        return s.url.startswith("https://") and s.repo is None and s.commit is None
    return (
        s.repo is not None
        and _REPO.fullmatch(s.repo) is not None
        and bool(s.path)
        and s.commit is not None
        and _HEX40.fullmatch(s.commit) is not None
    )


def _strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(node, str):
        return [(path, node)]
    if isinstance(node, dict):
        return [x for k, v in node.items() for x in _strings(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [x for i, v in enumerate(node) for x in _strings(v, f"{path}[{i}]")]
    return []


def wording_hits(entry: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(path, offending words) for every string of a catalog entry outside its `config` (the
    config is model data: vendor-chosen strings, not prose about sources)."""
    prose = {k: v for k, v in entry.items() if k != "config"}
    out = []
    for path, text in _strings(prose):
        hits = [w for w in DENYLIST if w in f" {text} "] + _PRIVATE_ID.findall(text)
        if hits:
            out.append((path, hits))
    return out
