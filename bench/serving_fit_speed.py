"""Whole-catalog ``/v1/fits`` for ``llm_serving`` workloads, in-process, side by side.

    .venv/bin/python bench/serving_fit_speed.py [TREE] [ENGINE]
        (TREE: a checkout, default this one; ENGINE: vllm (default), sglang, llama_cpp, ollama)

One round = a default serving fit (device counts 1, 2, 4, 8; context, concurrency and device
count solved) of every decoder preset against the whole catalog; prints each round and the
median of 5. The first round fills the per-layout caches; run two trees alternately (e.g. a
``git worktree`` of an older commit, then this one) and compare medians.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = (
    Path(sys.argv[1]).resolve()
    if len(sys.argv) > 1 and sys.argv[1] != "."
    else Path(__file__).resolve().parents[1]
)
ENGINE = sys.argv[2] if len(sys.argv) > 2 else "vllm"
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from vrambudget.core.errors import InvalidWorkload  # noqa: E402
from vrambudget.core.fit import FitRequest, fit  # noqa: E402

ROUNDS = 5


def main() -> None:
    presets = json.loads((ROOT / "vrambudget" / "core" / "data" / "models.json").read_text())
    ids = [p["id"] for p in presets["presets"] if not p["id"].startswith(("bert", "gpt2"))]
    requests = [
        msgspec.convert(
            {
                "workloads": [
                    {"kind": "llm_serving", "model": {"source": "preset", "id": m}}
                    | ({"engine": ENGINE} if ENGINE != "vllm" else {})
                ],
                "device_counts": [1, 2, 4, 8],
                "solve": ["context", "concurrency", "device_count"],
            },
            FitRequest,
        )
        for m in ids
    ]
    times = []
    for r in range(ROUNDS):
        t0 = time.perf_counter()
        for req in requests:
            try:
                fit(req)
            except InvalidWorkload:
                pass
        times.append(time.perf_counter() - t0)
        print(f"round {r}: {times[-1]:.2f} s for {len(ids)} whole-catalog {ENGINE} fits")
    print(f"median of {ROUNDS}: {statistics.median(times):.2f} s ({ROOT}, {ENGINE})")


if __name__ == "__main__":
    main()
