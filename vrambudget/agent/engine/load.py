"""The load an engine probe drives through the engine's OpenAI-compatible API: streamed
``/v1/completions`` whose ``prompt`` is a list of token ids (exact lengths, no tokenizer),
``max_tokens`` generated with end-of-sequence ignored, ``concurrency`` clients sending one
request after another until ``requests`` are sent; warm-up requests first, one at a time.

Every prompt starts with its own tokens (the request's number and a per-probe salt), so the
engine's prefix cache cannot serve one request's KV blocks to another: each request costs its
full prompt, as distinct users' requests do.

Latencies: TTFT from sending to the first chunk carrying text; inter-token latency the gaps
between later text chunks (every gap of every request, pooled); end-to-end from sending to the
stream's end. Errors: an HTTP status other than 200, a transport error or timeout
(``request_timeout_s``), a stream that ends without ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from vrambudget.core.probe_engine import EngineLoad, Latency

__all__ = ["Bodies", "LoadResult", "drive", "latency", "preemptions", "prompt_ids"]

PREEMPTION_METRICS = {
    "vllm": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "sglang": ("sglang:num_retracted_reqs_total", "sglang:num_retracted_reqs"),
}
"""The engine's Prometheus counter of preempted (vLLM) / retracted (SGLang) requests."""


def latency(values: list[float]) -> Latency:
    """Nearest-rank percentiles (the smallest value with at least q of the values at or below
    it), so p50 <= p95 <= p99 always."""
    if not values:
        return Latency(p50_s=None, p95_s=None, p99_s=None, count=0)
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

    return Latency(p50_s=q(0.50), p95_s=q(0.95), p99_s=q(0.99), count=len(ordered))


_HEAD = 5
"""Ids of the request's number and the probe's salt that start every prompt."""


def _span(vocab_size: int) -> tuple[int, int]:
    lo, hi = 10, max(11, min(vocab_size, 32_000))
    return lo, hi - lo


def _head(index: int, salt: int, vocab_size: int) -> list[int]:
    lo, span = _span(vocab_size)
    head = [lo + (salt // span**k) % span for k in range(2)]
    return head + [lo + (index // span**k) % span for k in range(3)]


def _tail(length: int, vocab_size: int) -> list[int]:
    lo, span = _span(vocab_size)
    rng = random.Random(1234)
    return [lo + rng.randrange(span) for _ in range(max(0, length - _HEAD))]


def prompt_ids(index: int, salt: int, length: int, vocab_size: int) -> list[int]:
    """``length`` token ids: the request's number and the probe's salt first (distinct prompts:
    no shared prefix), then a fixed pseudo-random body. Ids stay in ``[10, min(vocab, 32000))``:
    ordinary tokens of every tokenizer here, away from the special ones at either end."""
    return (_head(index, salt, vocab_size) + _tail(length, vocab_size))[:length]


class Bodies:
    """The requests' JSON bodies, built once per probe: the fixed body of the prompt is drawn
    and encoded here, and each request only joins its own five head ids to it (a copy of the
    bytes), so no request spends event-loop time regenerating or encoding a long prompt while
    the other streams' chunks wait to be timestamped. ``body(i)`` decodes to
    ``_body(engine, model, prompt_ids(i, salt, length, vocab_size), load)``."""

    def __init__(
        self, engine: str, model: str, load: EngineLoad, length: int, vocab_size: int, salt: int
    ) -> None:
        self.salt, self.length, self.vocab_size = salt, length, vocab_size
        marker = "\u0000prompt\u0000"
        text = json.dumps(_body(engine, model, [], load) | {"prompt": marker})
        before, after = text.split(json.dumps(marker), 1)
        tail = _tail(length, vocab_size)
        self._before = f"{before}[".encode()
        self._tail = ("".join(f",{t}" for t in tail) + "]" + after).encode()

    def body(self, index: int) -> bytes:
        head = _head(index, self.salt, self.vocab_size)[: self.length]
        ids = ",".join(str(t) for t in head).encode()
        tail = self._tail if len(head) == _HEAD else self._tail[self._tail.index(b"]") :]
        return self._before + ids + tail


@dataclass
class LoadResult:
    requests: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)
    inter_token: list[float] = field(default_factory=list)
    end_to_end: list[float] = field(default_factory=list)
    output_tokens: int = 0
    wall_s: float = 0.0
    first_error: str | None = None


async def _one(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    timeout_s: float,
    into: LoadResult | None,
) -> None:
    start = time.perf_counter()
    chunks: list[float] = []
    tokens = 0
    done = False
    error: str | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, content=body, headers=_JSON) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    error = f"HTTP {r.status_code}: {text[:300]}"
                else:
                    async for line in r.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True
                            break
                        chunk = json.loads(data)
                        if any(c.get("text") for c in chunk.get("choices") or ()):
                            chunks.append(time.perf_counter())
                        usage = chunk.get("usage")
                        if usage and usage.get("completion_tokens") is not None:
                            tokens = int(usage["completion_tokens"])
                    if not done:
                        error = "the stream ended without [DONE]"
    except TimeoutError:
        error = f"no complete answer within {timeout_s:g} s"
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    if into is None:
        return
    into.requests += 1
    if error is not None:
        into.errors += 1
        into.first_error = into.first_error or error
        return
    if chunks:
        into.ttft.append(chunks[0] - start)
        into.inter_token.extend(b - a for a, b in itertools.pairwise(chunks))
    into.end_to_end.append(end - start)
    into.output_tokens += tokens or len(chunks)


_JSON = {"content-type": "application/json"}


def _body(engine: str, model: str, prompt: list[int], load: EngineLoad) -> dict[str, object]:
    body: dict[str, object] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": load.output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if engine == "vllm":
        body["min_tokens"] = load.output_tokens  # every request generates exactly as asked
    return body


STOP_POLL_S = 0.1
"""How often the load looks at its ``stopped`` predicate."""


async def drive(
    base_url: str,
    engine: str,
    model: str,
    load: EngineLoad,
    prompt_tokens: int,
    vocab_size: int,
    salt: int,
    before_measuring: Callable[[], None] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> LoadResult:
    """Warm up, then the measured requests; ``before_measuring()`` (if given) runs between the
    two (the parent's NVML sampling starts there). Once ``stopped()`` (if given) is true, the
    requests in flight are cancelled and what was measured so far is returned (within
    ``STOP_POLL_S``)."""
    result = LoadResult()
    url = f"{base_url}/v1/completions"
    bodies = Bodies(engine, model, load, prompt_tokens, vocab_size, salt)

    async def requests() -> None:
        limits = httpx.Limits(
            max_connections=load.concurrency + 1, max_keepalive_connections=load.concurrency + 1
        )
        timeout = httpx.Timeout(load.request_timeout_s, connect=10.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
            for i in range(load.warmup_requests):
                await _one(client, url, bodies.body(i), load.request_timeout_s, None)
            if before_measuring is not None:
                before_measuring()
            counter = iter(range(load.requests))

            async def client_loop() -> None:
                for n in counter:
                    body = bodies.body(load.warmup_requests + n)
                    await _one(client, url, body, load.request_timeout_s, result)

            start = time.perf_counter()
            try:
                await asyncio.gather(
                    *(client_loop() for _ in range(min(load.concurrency, load.requests)))
                )
            finally:  # also when stopped: the wall time of what was measured
                result.wall_s = time.perf_counter() - start

    if stopped is None:
        await requests()
        return result
    work = asyncio.ensure_future(requests())
    while not work.done() and not stopped():
        await asyncio.wait({work}, timeout=STOP_POLL_S)
    if not work.done():
        work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return result


def preemptions(engine: str, metrics_text: str | None) -> float | None:
    """The engine's preemption counter in a ``/metrics`` text (summed over its label sets);
    None for an engine without one or a text without it."""
    names = PREEMPTION_METRICS.get(engine)
    if names is None or metrics_text is None:
        return None
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return total if seen else None
