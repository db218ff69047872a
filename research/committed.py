"""A fitted file committed under ``vrambudget/core/data``: written by its research script, or
checked against a fresh fit (``--check``, which the tests and CI run)."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(out: Path, text: str, check: bool, command: str) -> int:
    """Write ``text`` to ``out`` (0), or with ``check`` compare: 0 when ``out`` holds it, else
    1 and a line on stderr naming ``command`` to rewrite it."""
    if check:
        if out.exists() and out.read_text() == text:
            return 0
        print(f"{out.name} differs from a fresh fit: run {command}", file=sys.stderr)
        return 1
    out.write_text(text)
    print(text)
    return 0
