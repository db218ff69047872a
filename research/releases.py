"""Release dates of the frameworks and libraries the corpus's measurements ran on, from PyPI's
JSON API (https://pypi.org/pypi/<name>/json, the first file's upload time of each release):
a measurement that does not state a version ran on the last release before its publication.

Run from the repository root (needs the package index):
    python -m research.releases    # rewrite research/data/releases.json
"""

from __future__ import annotations

import json
import re
import urllib.request
from datetime import date
from functools import cache
from pathlib import Path

from vrambudget.core.stack import version_tuple

OUT = Path(__file__).parent / "data" / "releases.json"
PACKAGES = (
    "transformers",
    "peft",
    "trl",
    "accelerate",
    "bitsandbytes",
    "torchtune",
    "litgpt",
    "deepspeed",
    "vllm",
    "torch",
    "unsloth",
)
_FINAL = re.compile(r"^[0-9]+(\.[0-9]+)*$")


def fetch(name: str) -> list[tuple[str, str]]:
    """(upload date, version) of every final release, oldest first."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=30) as r:
        data = json.load(r)
    out = [
        (files[0]["upload_time"][:10], v)
        for v, files in data["releases"].items()
        if files and _FINAL.match(v)
    ]
    return sorted(out)


@cache
def releases() -> dict[str, list[tuple[str, str]]]:
    data = json.loads(OUT.read_text())
    return {k: [tuple(x) for x in v] for k, v in data["packages"].items()}  # type: ignore[misc]


def version_at(name: str, when: str) -> str | None:
    """The last release of ``name`` uploaded on or before ``when`` (YYYY-MM-DD)."""
    found = [version for day, version in releases().get(name, []) if day <= when]
    return max(found, key=version_tuple, default=None)


def first_release(name: str) -> str | None:
    """The first release of ``name`` on PyPI: the nearest release to code that ran before it
    (lit-gpt's 2023 commits, published before litgpt 0.2.0)."""
    days = releases().get(name, [])
    return min(days)[1] if days else None


def main() -> int:
    packages = {name: fetch(name) for name in PACKAGES}
    OUT.write_text(
        json.dumps(
            {
                "schema": "vrambudget.releases/1",
                "source": "https://pypi.org/pypi/<name>/json (upload_time of each release's "
                "first file), fetched " + date.today().isoformat(),
                "packages": packages,
            },
            indent=1,
        )
        + "\n"
    )
    print({k: len(v) for k, v in packages.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
