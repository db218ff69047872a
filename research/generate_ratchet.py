"""The generate replay (:mod:`vrambudget.core.allocator.generate`) against a GPU run of
``bench/gpu/generate_ratchet.py``: per series (batch, prompt, new tokens), the first call's
measured ``max_memory_allocated`` and ``max_memory_reserved`` beyond the weights against the
replay's allocated and reserved bytes (which leave the weights out), and the reserved growth
over the later calls, which a one-call replay does not model.

    PYTHONPATH=$PWD .venv/bin/python -m research.generate_ratchet \
        research/data/gpu/generate_ratchet_*.json

The run builds Qwen2.5-0.5B's config with random bf16 weights (SDPA, greedy, fixed new tokens):
the request below is that workload under the run's transformers and torch versions.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from vrambudget.core.allocator.generate import replay_generate
from vrambudget.core.budget.generate_cache import generate_shape
from vrambudget.core.deployed import deploy_all
from vrambudget.core.overheads import DEFAULT_OVERHEADS, with_software
from vrambudget.core.spec import BudgetRequest

__all__ = ["Compared", "compare", "main"]


@dataclass(frozen=True, slots=True)
class Compared:
    batch: int
    prompt: int
    new: int
    measured_allocated: int
    """First call's max_memory_allocated less the weights."""
    measured_reserved: int
    """First call's max_memory_reserved less the weights."""
    replay_allocated: int
    replay_reserved: int
    reserved_last_call: int
    """The last call's max_memory_reserved less the weights (the cache kept between calls)."""

    @property
    def reserved_error(self) -> float:
        return (self.replay_reserved - self.measured_reserved) / self.measured_reserved


def _request(doc: dict[str, Any], batch: int, prompt: int, new: int) -> BudgetRequest:
    return msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "inference",
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                    "batch_size": batch,
                    "prompt_tokens": prompt,
                    "generated_tokens": new,
                    "precision": {"weights": "bf16", "compute": "bf16"},
                }
            ],
            "software": {
                "framework": "transformers",
                "framework_version": doc["transformers"],
                "torch_version": doc["torch"],
            },
        },
        BudgetRequest,
    )


def compare(doc: dict[str, Any]) -> list[Compared]:
    """One row per measured series of a ``vrambudget.generate_ratchet/1`` document."""
    if doc.get("schema") != "vrambudget.generate_ratchet/1":
        raise ValueError(f"not a generate_ratchet document: schema {doc.get('schema')!r}")
    if doc.get("dry_run"):
        raise ValueError("a dry run has no allocator counters")
    weights = int(doc["weights_bytes"])
    rows = []
    for s in doc["series"]:
        req = _request(doc, s["batch_size"], s["prompt_tokens"], s["new_tokens"])
        (w,), _ = deploy_all(req.workloads)
        shape = generate_shape(w, with_software(DEFAULT_OVERHEADS, req.software))
        if shape is None:
            raise ValueError(f"the replay does not apply to series {s}")
        replay = replay_generate(shape)
        first, last = s["calls"][0], s["calls"][-1]
        rows.append(
            Compared(
                batch=s["batch_size"],
                prompt=s["prompt_tokens"],
                new=s["new_tokens"],
                measured_allocated=first["max_allocated"] - weights,
                measured_reserved=first["max_reserved"] - weights,
                replay_allocated=replay.allocated_bytes,
                replay_reserved=replay.reserved_bytes,
                reserved_last_call=last["max_reserved"] - weights,
            )
        )
    return rows


def main(argv: list[str]) -> int:
    for path in argv:
        doc = json.loads(Path(path).read_text())
        print(f"{path}: {doc['gpu']}, torch {doc['torch']}, transformers {doc['transformers']}")
        print("| batch | prompt + new | allocated (measured / replay) | reserved (measured / "
              "replay) | error | reserved, last call |")  # fmt: skip
        print("|---:|---|---|---|---:|---:|")
        for r in compare(doc):
            print(
                f"| {r.batch} | {r.prompt} + {r.new} | {r.measured_allocated / 1e6:,.1f} / "
                f"{r.replay_allocated / 1e6:,.1f} MB | {r.measured_reserved / 1e6:,.1f} / "
                f"{r.replay_reserved / 1e6:,.1f} MB | {r.reserved_error:+.1%} | "
                f"{r.reserved_last_call / 1e6:,.1f} MB |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
