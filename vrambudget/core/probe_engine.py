"""Wire types of an engine probe: the load an ``llm_serving`` probe drives through the engine's
OpenAI-compatible API, and what the agent reports about the engine it started (its own startup
figures, read from its log; latencies; errors; the estimate's figures beside them)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["EngineExpected", "EngineLoad", "EngineReport", "EngineStartup", "Latency"]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class EngineLoad(_Wire, frozen=True, kw_only=True):
    """The load of an engine probe: ``concurrency`` clients, each sending streamed completions
    of ``prompt_tokens`` token ids and ``output_tokens`` generated tokens (end-of-sequence
    ignored), one after another, until ``requests`` have been sent."""

    concurrency: Annotated[
        int, Meta(ge=1, le=4096, description="Requests in flight at once (1 .. 4096).")
    ] = 1
    requests: Annotated[
        int,
        Meta(ge=1, le=100_000, description="Measured requests in all (1 .. 100,000)."),
    ] = 32
    warmup_requests: Annotated[
        int,
        Meta(ge=0, le=1000, description="Requests sent (one at a time) before measuring."),
    ] = 2
    prompt_tokens: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 22)] | None,
        Meta(
            description="Prompt length, tokens (1 .. 4,194,304); default (null): the longest "
            "the workload allows (max_model_len minus output_tokens)."
        ),
    ] = None
    output_tokens: Annotated[
        int, Meta(ge=1, le=1 << 20, description="Generated tokens per request.")
    ] = 128
    ready_timeout_s: Annotated[
        float,
        Meta(
            ge=1.0,
            le=7200.0,
            description="How long the engine may take to start (load weights, profile, "
            "capture graphs) before the probe ends `failed` with its log.",
        ),
    ] = 900.0
    request_timeout_s: Annotated[
        float,
        Meta(ge=1.0, le=3600.0, description="One request's limit; beyond, it counts as an error."),
    ] = 300.0


class Latency(_Wire, frozen=True, kw_only=True):
    """Percentiles of one latency, seconds (null with no observation)."""

    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    count: int


class EngineStartup(_Wire, frozen=True, kw_only=True):
    """What the engine said about its memory at start (parsed from its log; null where the log
    did not say it)."""

    weights_bytes: int | None = None
    """vLLM "Model loading took X GiB"; SGLang "Load weight end ... mem usage=X GB";
    llama.cpp the sum of its model buffers."""
    kv_cache_bytes: int | None = None
    """vLLM "Available KV cache memory"; SGLang "KV Cache is allocated ... K size + V size";
    llama.cpp the sum of its KV buffers."""
    kv_cache_tokens: int | None = None
    """vLLM "GPU KV cache size: N tokens"; SGLang "max_total_num_tokens"; llama.cpp n_ctx."""
    max_concurrency: float | None = None
    """vLLM "Maximum concurrency for L tokens per request: C x"; SGLang
    "max_running_requests"; llama.cpp the slots."""
    cuda_graph_bytes: int | None = None
    """vLLM "Graph capturing finished in S secs, took X GiB" (a free-memory difference, as
    printed: negative when memory outside the process was released meanwhile); SGLang "Capture
    cuda graph end ... mem usage=X GB"."""
    lines: tuple[str, ...] = ()
    """The log lines these figures were read from, verbatim."""


class EngineExpected(_Wire, frozen=True, kw_only=True):
    """The estimate's figures for the command that was run (the service's serving summary),
    beside what the engine logged."""

    weights_bytes: int
    kv_cache_tokens: int
    max_concurrency: float
    would_start: bool
    kv_cache_tokens_error: float | None
    """(logged - estimated) / logged; null when the engine did not log its tokens."""


class EngineReport(_Wire, frozen=True, kw_only=True):
    engine: str
    """vllm | sglang | llama_cpp"""
    command: tuple[str, ...]
    """The argv the agent started (the launcher the host configured, then the recipe's
    arguments, then the address it chose)."""
    started: bool
    """Whether the engine answered ready within ``ready_timeout_s``."""
    startup_s: float | None
    exit_code: int | None
    """The engine's exit status when it ended before it was stopped (null: stopped by the
    agent, as it always is after the load)."""
    startup: EngineStartup
    expected: EngineExpected | None
    requests: int
    """Measured requests sent."""
    errors: int
    preemptions: int | None
    """From the engine's Prometheus counter (vLLM ``vllm:num_preemptions_total``, SGLang
    ``sglang:num_retracted_reqs``); null where the engine exposes none."""
    ttft: Latency
    inter_token: Latency
    end_to_end: Latency
    output_tokens_per_s: float
    requests_per_s: float
    prompt_tokens: int
    output_tokens: int
    log_tail: tuple[str, ...] = ()
    """The engine log's last lines (at most 40) when it did not start or a request failed."""
    version: str | None = None
    """The installed engine's version, as its startup log states it (vLLM ``0.11.0``,
    llama.cpp ``b4518``); null when it states none (SGLang prints no version line)."""
    modelled_version: str | None = None
    """The release whose recipe was started (the estimate's ``serving.modelled_version``)."""
    version_warning: str | None = None
    """Set when ``version`` falls under other modelled rules than ``modelled_version`` (or
    none): the flags and the expected figures may not be the installed engine's."""
