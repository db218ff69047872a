"""What compression and entity tags cost per answer (docs/PERFORMANCE.md, docs/HTTP.md).

Part 1, the codings alone, on the service's own answers (the whole-catalog fit of Llama 3.1 8B
at 1/2/4/8 devices, the GPU and model catalogs, a budget, the OpenAPI document): size and the
median time of gzip at levels 1/6/9 and brotli at qualities 1/4/5, and of the SHA-256 tag. The
chosen levels (gzip 6, br 4) are what the event loop spends on an answer below 64 KiB; a larger
one is compressed in a worker thread.

Part 2, the middleware's own cost per answer (``Representation`` driven directly as an ASGI app
around a handler that answers the same bytes object, as the answer cache does for a repeated
request; medians of rounds): the handler alone, then with the middleware answering as it is
(repeated: the digest is known; first time: hashed), in gzip and br (repeated: the kept form),
in br the first time (hashed and compressed), and a matching ``If-None-Match`` (412).

Times are CPU seconds of this process (``time.process_time``), so that other processes on a busy
machine skew them less than wall time.

    .venv/bin/python -m bench.http_representation
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import logging
import statistics
import time
import zlib
from collections.abc import Callable
from typing import Any

import brotli
from litestar.testing import TestClient

from vrambudget.http.cache import AnswerCache
from vrambudget.http.encoding import BROTLI_QUALITY, GZIP_LEVEL
from vrambudget.http.representation import Freshness, Representation, cacheable
from vrambudget.http.validators import DigestMemo
from vrambudget.service.app import create_app
from vrambudget.service.settings import Settings

WORKLOAD = {
    "kind": "inference",
    "model": {"source": "preset", "id": "llama-3.1-8b"},
    "batch_size": 1,
    "prompt_tokens": 4096,
    "generated_tokens": 512,
}
FIT = {"workloads": [WORKLOAD], "device_counts": [1, 2, 4, 8]}
BUDGET = {"workloads": [WORKLOAD], "device": {"source": "catalog", "id": "h100-sxm5-80gb"}}
IDENTITY = {"accept-encoding": "identity"}


def _median_us(fn: Callable[[], Any], n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e6


def _gzip(level: int) -> Callable[[bytes], bytes]:
    def run(body: bytes) -> bytes:
        packer = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return packer.compress(body) + packer.flush()

    return run


def _br(quality: int) -> Callable[[bytes], bytes]:
    def run(body: bytes) -> bytes:
        out: bytes = brotli.compress(body, quality=quality, mode=brotli.MODE_TEXT)
        return out

    return run


CODINGS: list[tuple[str, Callable[[bytes], bytes]]] = [
    ("gzip 1", _gzip(1)),
    (f"gzip {GZIP_LEVEL}", _gzip(GZIP_LEVEL)),
    ("gzip 9", _gzip(9)),
    ("br 1", _br(1)),
    (f"br {BROTLI_QUALITY}", _br(BROTLI_QUALITY)),
    ("br 5", _br(5)),
]


def _answers(client: TestClient[Any]) -> dict[str, bytes]:
    return {
        "POST /v1/fits (catalog x 1/2/4/8)": client.post(
            "/v1/fits", json=FIT, headers=IDENTITY
        ).content,
        "GET /v1/gpus": client.get("/v1/gpus", headers=IDENTITY).content,
        "GET /v1/models": client.get("/v1/models", headers=IDENTITY).content,
        "POST /v1/budgets": client.post("/v1/budgets", json=BUDGET, headers=IDENTITY).content,
        "GET /schema/openapi.json": client.get("/schema/openapi.json", headers=IDENTITY).content,
    }


def codings(answers: dict[str, bytes], n: int) -> None:
    print("| answer | identity | " + " | ".join(name for name, _ in CODINGS) + " | SHA-256 tag |")
    print("| --- | --- | " + " | ".join("---" for _ in CODINGS) + " | --- |")
    for label, body in answers.items():
        cells = [f"{len(body):,} B"]
        for _, fn in CODINGS:
            size = len(fn(body))
            cost = _median_us(lambda fn=fn, body=body: fn(body), n)
            cells.append(f"{100 * size / len(body):.1f} % in {cost:,.0f} µs")
        tag = _median_us(lambda body=body: hashlib.sha256(body).digest(), n)
        cells.append(f"{tag:,.0f} µs")
        print(f"| {label} | " + " | ".join(cells) + " |")
        assert gzip.decompress(_gzip(GZIP_LEVEL)(body)) == body


class _Handler:
    """What the middleware reads of a route handler: its ``opt``."""

    def __init__(self, opt: dict[str, Any]) -> None:
        self.opt = opt


def _inner(body: bytes) -> Any:
    """An ASGI app answering ``body`` as JSON, as a handler of the service does."""
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
    }

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(dict(start))
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


def _scope(method: str, headers: dict[str, str], opt: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": "/v1/fits",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "route_handler": _Handler(opt),
    }


async def _sink(message: Any) -> None:
    return None


async def _receive() -> Any:
    return {"type": "http.request", "body": b"", "more_body": False}


def _row(body: bytes, rounds: int, per_round: int) -> dict[str, float]:
    """Median CPU µs per answer of ``body`` for each variant (see the module docstring)."""
    opt = cacheable(Freshness.REQUEST)
    inner = _inner(body)
    kept = Representation(3600)(inner)
    fresh = Representation(3600)
    fresh_app = fresh(inner)

    async def anew(scope: Any, receive: Any, send: Any) -> None:
        fresh.packed = AnswerCache(1, 0)  # keeps nothing: every answer is compressed
        fresh.digests = DigestMemo()  # and hashed, as the first time
        await fresh_app(scope, receive, send)

    async def tag_of() -> str:
        got: list[Any] = []

        async def keep(message: Any) -> None:
            got.append(message)

        await kept(_scope("POST", {"accept-encoding": "br"}, opt), _receive, keep)
        return str(dict(got[0]["headers"])[b"etag"].decode())

    tag = asyncio.run(tag_of())
    variants: dict[str, tuple[Any, dict[str, str]]] = {
        "alone": (inner, {}),
        "identity": (kept, IDENTITY),
        "first": (anew, IDENTITY),
        "gzip": (kept, {"accept-encoding": "gzip"}),
        "br": (kept, {"accept-encoding": "br"}),
        "anew": (anew, {"accept-encoding": "br"}),
        "412": (kept, {"accept-encoding": "br", "if-none-match": tag}),
    }

    async def run(app: Any, headers: dict[str, str]) -> float:
        scope = _scope("POST", headers, opt)
        await app(dict(scope), _receive, _sink)
        t0 = time.process_time()
        for _ in range(per_round):
            await app(dict(scope), _receive, _sink)
        return (time.process_time() - t0) / per_round * 1e6

    per: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, (app, headers) in variants.items():
            per[name].append(asyncio.run(run(app, headers)))
    return {k: statistics.median(v) for k, v in per.items()}


def middleware(answers: dict[str, bytes], rounds: int, per_round: int) -> None:
    """The middleware's own CPU time per answer, against the handler alone."""
    print(
        "| answer | handler alone | as it is, repeated | as it is, first time | gzip, repeated "
        "| br, repeated | br, first time | If-None-Match: 412 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label in ("POST /v1/fits (catalog x 1/2/4/8)", "POST /v1/budgets"):
        body = answers[label]
        median = _row(body, rounds, per_round)
        base = median["alone"]
        cells = [f"{base:,.1f} µs"] + [
            f"{median[k]:,.1f} µs (+{median[k] - base:,.1f})"
            for k in ("identity", "first", "gzip", "br", "anew", "412")
        ]
        print(f"| {label} ({len(body):,} B) | " + " | ".join(cells) + " |")


def main() -> None:
    logging.getLogger("vrambudget").setLevel(logging.WARNING)  # no access line per request
    with TestClient(create_app(Settings(compute_workers=1))) as client:
        answers = _answers(client)
    codings(answers, n=50)
    print()
    middleware(answers, rounds=9, per_round=300)


if __name__ == "__main__":
    main()
