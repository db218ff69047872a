"""A digest of many analytic budgets, to show a refactor changes no byte of any answer.

    .venv/bin/python bench/budget_digest.py [TREE]      (TREE: a checkout, default this one)

Run it on two trees (e.g. a ``git worktree`` of the commit before a change, and this one):
equal digests mean equal answers on 672 inference budgets (7 models x batch x TP x chunked
prefill x logits x 3 devices x instances), a ZeRO-3 training budget and a co-located one.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from service.budget.estimate import estimate  # noqa: E402
from service.budget.spec import CatalogDevice, Headroom, Workload  # noqa: E402

MODELS = ["llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b", "deepseek-v2-lite", "gemma-3-4b",
          "bert-base-uncased", "gpt2"]


def main() -> None:
    h = hashlib.sha256()
    n = 0
    for m, b, tp, chunk, logits, dev, k in itertools.product(
            MODELS, [1, 7], [1, 2], [None, 512], ["last", "all"],
            [None, "h100-sxm5-80gb", "l4-24gb"], [1, 2]):
        w = {"kind": "inference", "model": {"source": "preset", "id": m}, "batch_size": b,
             "prompt_tokens": 1024, "generated_tokens": 16, "parallelism": {"tensor": tp},
             "logits": logits, "instances": k}
        if chunk:
            w["prefill_chunk_tokens"] = chunk
        try:
            out = estimate((msgspec.convert(w, Workload),),
                           CatalogDevice(id=dev) if dev else None,
                           Headroom(fraction=0.1, min_bytes=1 << 30))
            h.update(msgspec.json.encode(out))
            n += 1
        except Exception as exc:  # noqa: BLE001 - a refusal is part of the answer too
            h.update(repr(exc).encode())
    t = msgspec.convert({"kind": "training", "model": {"source": "preset", "id": "llama-3.1-8b"},
                         "micro_batch_size": 2, "parallelism": {"data": 8, "zero_stage": 3}},
                        Workload)
    i = msgspec.convert({"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                         "batch_size": 3, "prompt_tokens": 100, "generated_tokens": 5}, Workload)
    h.update(msgspec.json.encode(estimate((t,), CatalogDevice(id="h100-sxm5-80gb"))))
    h.update(msgspec.json.encode(estimate((i, i), CatalogDevice(id="h100-sxm5-80gb"))))
    print(f"{n} inference budgets + 2; sha256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
