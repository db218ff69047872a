"""Bytes of every catalog answer of the calculation service (docs/CATALOG.md).

    .venv/bin/python bench/catalog_sizes.py [TREE]      (TREE: a checkout, default this one)

Asks the app in-process (Litestar's test client, no socket), as ``bench/budget_digest.py``
does, so two trees (a ``git worktree`` of an earlier commit, and this one) can be compared:
``GET /v1/gpus`` and ``/v1/models`` whole and gzipped (level 6, what a reverse proxy commonly
uses), and the smallest, largest and summed bytes of ``/v1/gpus/{id}`` and ``/v1/models/{id}``.
"""

from __future__ import annotations

import gzip
import logging
import sys
from pathlib import Path
from typing import Any

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from litestar.testing import TestClient  # noqa: E402

from vrambudget.service.app import create_app  # noqa: E402


def main() -> None:
    logging.disable(logging.INFO)
    with TestClient(create_app()) as client:

        def get(path: str) -> bytes:
            r = client.get(path)
            r.raise_for_status()
            return r.content

        lists: dict[str, Any] = {}
        for path in ("/v1/gpus", "/v1/models"):
            body = get(path)
            lists[path] = client.get(path).json()
            print(f"{path:28s} {len(body):>8,d} B   gzip {len(gzip.compress(body, 6)):>7,d} B")
        for path, key in (("/v1/gpus", "id"), ("/v1/models", "id")):
            sizes = sorted((len(get(f"{path}/{e[key]}")), e[key]) for e in lists[path])
            print(
                f"{path + '/{id}':28s} {len(sizes)} entries: smallest {sizes[0][0]:,d} B "
                f"({sizes[0][1]}), largest {sizes[-1][0]:,d} B ({sizes[-1][1]}), "
                f"sum {sum(s for s, _ in sizes):,d} B"
            )


if __name__ == "__main__":
    main()
