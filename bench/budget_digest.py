"""Digests of many answers of the calculation service, to show a refactor changes no byte.

    .venv/bin/python bench/budget_digest.py [TREE]      (TREE: a checkout, default this one)

Run it on two trees (e.g. a ``git worktree`` of the commit before a change, and this one): equal
digests mean equal answers. It asks the app itself (Litestar's test client, no socket), so it
covers the wire encoding too and does not depend on the package's internal layout:

- ``budgets``: 672 analytic inference budgets (7 models x batch x TP x chunked prefill x logits x
  3 devices x instances), training budgets (full, LoRA, QLoRA, ZeRO-3, pipeline) and a
  co-located one;
- ``serving``: vLLM ``llm_serving`` budgets (dense, GQA, MoE, MLA, sliding window; TP, PP,
  fp8 KV, utilization, max_model_len) and their refusals;
- ``fits``: ``/v1/fits`` for inference, training and serving workloads over catalog GPUs;
- ``comparisons``: ``/v1/comparisons`` of two stored probe reports (``bench/data``);
- ``errors``: the 4xx answers of a set of bad requests;
- ``catalog``: ``/v1/gpus`` and ``/v1/models`` (these change when a catalog entry's citation is
  edited, so they are reported apart).

``--replace OLD NEW`` (repeatable) replaces a text in every answer before hashing: two trees
whose digests agree with it differ in exactly that stated text (e.g. a cited path that moved).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import sys
from pathlib import Path
from typing import Any

_ARGS = sys.argv[1:]
REPLACE: list[tuple[bytes, bytes]] = []
while "--replace" in _ARGS:
    i = _ARGS.index("--replace")
    REPLACE.append((_ARGS[i + 1].encode(), _ARGS[i + 2].encode()))
    del _ARGS[i : i + 3]
ROOT = Path(_ARGS[0]).resolve() if _ARGS else Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(__file__).resolve().parent / "data"

# The tree's own layout: one package (vrambudget/), or the one before the restructure (an
# installed vrambudget must not answer for an older tree).
if (ROOT / "vrambudget").is_dir():
    from vrambudget.service.app import create_app
else:
    from service.api.app import create_app  # type: ignore[import-not-found,no-redef]

from litestar.testing import TestClient  # noqa: E402

INFERENCE_MODELS = [
    "llama-3.1-8b",
    "qwen2.5-0.5b",
    "mixtral-8x7b",
    "deepseek-v2-lite",
    "gemma-3-4b",
    "bert-base-uncased",
    "gpt2",
]
SERVING_MODELS = [
    "llama-3.1-8b",
    "qwen2.5-0.5b",
    "mixtral-8x7b",
    "deepseek-v2-lite",
    "gemma-3-4b",
    "gemma-2-2b",
    "llama-3.1-70b",
]


def _preset(m: str) -> dict[str, Any]:
    return {"source": "preset", "id": m}


def _dev(d: str | None) -> dict[str, Any] | None:
    return {"source": "catalog", "id": d} if d else None


def budgets() -> list[dict[str, Any]]:
    out = []
    for m, b, tp, chunk, logits, dev, k in itertools.product(
        INFERENCE_MODELS,
        [1, 7],
        [1, 2],
        [None, 512],
        ["last", "all"],
        [None, "h100-sxm5-80gb", "l4-24gb"],
        [1, 2],
    ):
        w: dict[str, Any] = {
            "kind": "inference",
            "model": _preset(m),
            "batch_size": b,
            "prompt_tokens": 1024,
            "generated_tokens": 16,
            "parallelism": {"tensor": tp},
            "logits": logits,
            "instances": k,
        }
        if chunk:
            w["prefill_chunk_tokens"] = chunk
        out.append(
            {
                "workloads": [w],
                "device": _dev(dev),
                "headroom": {"fraction": 0.1, "min_bytes": 1 << 30},
            }
        )
    training = [
        {"micro_batch_size": 2, "parallelism": {"data": 8, "zero_stage": 3}},
        {"micro_batch_size": 1, "sequence_length": 4096, "checkpointing": "full"},
        {"micro_batch_size": 4, "method": {"kind": "lora", "rank": 16}},
        {"micro_batch_size": 4, "method": {"kind": "qlora", "rank": 8}},
        {
            "micro_batch_size": 2,
            "parallelism": {"pipeline": 4, "tensor": 2},
            "gradient_accumulation_steps": 8,
        },
        {"micro_batch_size": 2, "optimizer": {"name": "adamw_8bit"}, "mixed_precision": "pure"},
        {
            "micro_batch_size": 2,
            "parallelism": {"data": 4, "zero_stage": 2, "offload_optimizer": True},
        },
    ]
    for m, t in itertools.product(["llama-3.1-8b", "qwen2.5-0.5b", "mixtral-8x7b"], training):
        out.append(
            {
                "workloads": [{"kind": "training", "model": _preset(m), **t}],
                "device": _dev("h100-sxm5-80gb"),
            }
        )
    i = {
        "kind": "inference",
        "model": _preset("qwen2.5-0.5b"),
        "batch_size": 3,
        "prompt_tokens": 100,
        "generated_tokens": 5,
    }
    out.append({"workloads": [i, i], "device": _dev("h100-sxm5-80gb")})
    out.append(
        {
            "workloads": [i],
            "device": {
                "source": "custom",
                "name": "my card",
                "memory_total_bytes": 12 << 30,
                "architecture": "ampere",
                "native_dtypes": ["fp16", "bf16"],
            },
        }
    )
    return out


def serving() -> list[dict[str, Any]]:
    out = []
    for m, dev, tp, pp, kv, util, mml in itertools.product(
        SERVING_MODELS,
        ["h100-sxm5-80gb", "a100-sxm4-80gb", "l4-24gb"],
        [1, 2, 4],
        [1, 2],
        ["auto", "fp8"],
        [0.9, 0.5],
        [4096, None],
    ):
        w: dict[str, Any] = {
            "kind": "llm_serving",
            "model": _preset(m),
            "parallelism": {"tensor": tp, "pipeline": pp},
            "kv_cache_dtype": kv,
            "gpu_memory_utilization": util,
        }
        if mml:
            w["max_model_len"] = mml
        out.append({"workloads": [w], "device": _dev(dev)})
    return out


def fits() -> list[dict[str, Any]]:
    inf = {
        "kind": "inference",
        "model": _preset("llama-3.1-8b"),
        "batch_size": 8,
        "prompt_tokens": 4096,
        "generated_tokens": 512,
    }
    tr = {"kind": "training", "model": _preset("qwen2.5-0.5b"), "micro_batch_size": 4}
    sv = {"kind": "llm_serving", "model": _preset("llama-3.1-70b"), "max_model_len": 32768}
    return [
        {"workloads": [inf]},
        {
            "workloads": [inf],
            "device_counts": [1, 2, 4, 8],
            "solve": ["batch", "context", "concurrency", "device_count"],
        },
        {"workloads": [tr], "device_counts": [1, 8]},
        {
            "workloads": [sv],
            "devices": [_dev("h100-sxm5-80gb"), _dev("a100-sxm4-80gb")],
            "device_counts": [4, 8],
            "solve": ["device_count", "max_model_len", "concurrency"],
            "target_concurrency": 16,
            "prices": {"h100-sxm5-80gb": 2.5, "a100-sxm4-80gb": 1.6},
        },
        {"workloads": [{**sv, "model": _preset("qwen2.5-0.5b")}], "device_counts": [1, 2]},
    ]


def errors() -> list[tuple[str, Any]]:
    inf = {"kind": "inference", "model": _preset("llama-3.1-8b")}
    return [
        ("/v1/budgets", {"workloads": []}),
        ("/v1/budgets", {"workloads": [{**inf, "batch_size": 0}]}),
        ("/v1/budgets", {"workloads": [{**inf, "model": _preset("nope")}]}),
        ("/v1/budgets", {"workloads": [{**inf, "parallelism": {"tensor": 3}}]}),
        ("/v1/budgets", {"workloads": [{**inf, "batch_szie": 2}]}),
        ("/v1/budgets", {"workloads": [{"kind": "llm_serving", "model": _preset("gpt2")}]}),
        ("/v1/budgets", {"workloads": [inf], "device": _dev("nope")}),
        ("/v1/fits", {"workloads": [inf], "device_counts": []}),
        ("/v1/fits", {"workloads": [inf], "solve": ["everything"]}),
        ("/v1/comparisons", {"id": "x"}),
    ]


def _content(content: bytes) -> bytes:
    for old, new in REPLACE:
        content = content.replace(old, new)
    return content


def _digest(client: TestClient[Any], path: str, bodies: list[Any]) -> tuple[int, str]:
    h = hashlib.sha256()
    for body in bodies:
        r = client.post(
            path, content=json.dumps(body), headers={"content-type": "application/json"}
        )
        h.update(f"{r.status_code}\n".encode())
        h.update(_content(r.content))
    return len(bodies), h.hexdigest()


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    reports = [
        json.loads((DATA / n).read_text())
        for n in sorted(p.name for p in DATA.glob("digest_report*.json"))
    ]
    with TestClient(app=create_app()) as client:
        logging.getLogger("vrambudget").setLevel(logging.WARNING)  # no access line per answer
        rows = [
            ("budgets", *_digest(client, "/v1/budgets", budgets())),
            ("serving", *_digest(client, "/v1/budgets", serving())),
            ("fits", *_digest(client, "/v1/fits", fits())),
            ("comparisons", *_digest(client, "/v1/comparisons", reports)),
        ]
        h = hashlib.sha256()
        errs = errors()
        for path, body in errs:
            r = client.post(
                path, content=json.dumps(body), headers={"content-type": "application/json"}
            )
            h.update(f"{r.status_code}\n".encode())
            h.update(_content(r.content))
        rows.append(("errors", len(errs), h.hexdigest()))
        h = hashlib.sha256()
        for path in ("/v1/gpus", "/v1/models"):
            h.update(client.get(path).content)
        rows.append(("catalog", 2, h.hexdigest()))
    for name, n, digest in rows:
        print(f"{name:12} {n:5} answers  sha256 {digest}")


if __name__ == "__main__":
    main()
