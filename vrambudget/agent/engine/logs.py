"""The startup figures a serving engine prints about its memory, read from its log
(``EngineStartup``). The line formats are the engines' own, as published logs show them
(``research/data/engine_logs.json``; the tests parse those lines and compare every value).

- vLLM: ``Model loading took X GiB``, ``Available KV cache memory: X GiB``,
  ``GPU KV cache size: N tokens``, ``Maximum concurrency for L tokens per request: C x``,
  ``Graph capturing finished in S secs, took X GiB``.
- SGLang (its "GB" are GiB: ``get_available_gpu_memory`` divides by ``1 << 30``):
  ``Load weight end. ... mem usage=X GB``, ``KV Cache is allocated. ... #tokens: N, K size: a GB,
  V size: b GB`` (the pools before the first ``Memory pool end``: the target model's),
  ``max_total_num_tokens=N ... max_running_requests=R``, ``Capture ... graph end ... mem
  usage=X GB`` (every graph of the rank, summed).
- llama.cpp (MiB): the device model buffers (``load_tensors: CUDA0 model buffer size = X MiB``),
  the device KV buffers (``llama_kv_cache: CUDA0 KV buffer size = X MiB``), ``n_ctx = N``,
  ``n_seq_max = S`` (else ``n_parallel = S``). Host buffers (``CPU``, ``CPU_Mapped``,
  ``*_Host``) are not device memory and are left out.

The installed engine's version (``engine_version``), from the lines published logs carry
(``research/data/engine_logs.json``, field ``version_evidence``): vLLM's ``vLLM API server
version 0.11.0``, ``Initializing a V1 LLM engine (v0.11.0+torch271) with config`` or its banner's
``version 0.17.0``; llama.cpp's ``build: 4518 (aea8ddd51)`` (release ``b4518``). SGLang prints no
version line in any log read here, so its version is unknown (null).

Tensor- and data-parallel engines print a line per rank; only rank 0's lines count (lines of
``TP1``..., ``DP1``... are skipped), so the figures are one GPU's, like the estimate's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vrambudget.core.probe_engine import EngineStartup
from vrambudget.core.serving.gguf.llamacpp import device_buffer

__all__ = ["engine_version", "parse_startup", "rank_zero", "version_warning"]

GiB = 1 << 30
MiB = 1 << 20

_RANK = re.compile(r"\b(?:Worker_)?(?:TP|DP|EP|PP)(\d+)\b|\bEngineCore_(?:DP)?(\d+)\b")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def rank_zero(line: str) -> bool:
    """Whether a line is rank 0's (or names no rank). Only the line's prefix is read: the
    bracketed ``[time TP0]`` of SGLang, vLLM's ``(Worker_TP0 pid=...)``."""
    head = line[:80]
    return all(int(m.group(1) or m.group(2) or 0) == 0 for m in _RANK.finditer(head))


def _bytes(value: str, unit_bytes: int) -> int:
    return round(_num(value) * unit_bytes)


# ---------------------------------------------------------------------------------- vLLM --

_V_WEIGHTS = re.compile(r"Model loading took " + _NUM + r" GiB")
_V_KV = re.compile(r"Available KV cache memory: " + _NUM + r" GiB")
_V_TOKENS = re.compile(r"GPU KV cache size: " + _NUM + r" tokens")
_V_CONC = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + "x")
# vLLM measures the graphs as a free-memory difference, printed as is: negative when memory
# outside the process was released meanwhile ("took -0.41 GiB")
_V_GRAPH = re.compile(
    r"Graph capturing finished in " + _NUM + r" secs?, took (-?[0-9][0-9,]*(?:\.[0-9]+)?) GiB"
)


def _vllm(lines: list[str]) -> EngineStartup:
    found: dict[str, int | float] = {}
    used: list[str] = []

    def first(key: str, line: str, value: int | float) -> None:
        if key not in found:
            found[key] = value
            if line not in used:
                used.append(line)

    for line in lines:
        if not rank_zero(line):
            continue
        if m := _V_WEIGHTS.search(line):
            first("weights_bytes", line, _bytes(m.group(1), GiB))
        if m := _V_KV.search(line):
            first("kv_cache_bytes", line, _bytes(m.group(1), GiB))
        if m := _V_TOKENS.search(line):
            first("kv_cache_tokens", line, int(_num(m.group(1))))
        if m := _V_CONC.search(line):
            first("max_concurrency", line, _num(m.group(2)))
        if m := _V_GRAPH.search(line):
            first("cuda_graph_bytes", line, _bytes(m.group(2), GiB))
    return EngineStartup(lines=tuple(used), **found)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------- SGLang --

_S_WEIGHTS = re.compile(r"Load weight end\..*?mem usage=" + _NUM + " GB")
_S_KV = re.compile(  # "#tokens: N, " since 0.4.3; earlier releases print the sizes only
    r"KV Cache is allocated\.(?:.*?#tokens: "
    + _NUM
    + r",)? K size: "
    + _NUM
    + r" GB, V size: "
    + _NUM
    + " GB"
)
_S_POOL_END = re.compile(r"Memory pool end\.")
_S_TOTAL = re.compile(r"max_total_num_tokens=" + _NUM)
_S_RUNNING = re.compile(r"max_running_requests=" + _NUM)
_S_GRAPH = re.compile(r"Capture .*?graph end\..*?mem usage=" + _NUM + " GB")


def _sglang(lines: list[str]) -> EngineStartup:
    weights = kv_tokens = total_tokens = running = None
    kv_gib = 0.0
    graph_gib = 0.0
    kv_seen = graphs_seen = pool_done = False
    used: list[str] = []
    for line in lines:
        if not rank_zero(line):
            continue
        hit = False
        if weights is None and (m := _S_WEIGHTS.search(line)):
            weights, hit = _bytes(m.group(1), GiB), True
        if not pool_done and (m := _S_KV.search(line)):
            if kv_tokens is None and m.group(1) is not None:
                kv_tokens = int(_num(m.group(1)))
            kv_gib += _num(m.group(2)) + _num(m.group(3))
            kv_seen = hit = True
        if kv_seen and _S_POOL_END.search(line):
            pool_done = True
        if m := _S_GRAPH.search(line):
            graph_gib += _num(m.group(1))
            graphs_seen = hit = True
        if total_tokens is None and (m := _S_TOTAL.search(line)):
            total_tokens, hit = int(_num(m.group(1))), True
            if r := _S_RUNNING.search(line):
                running = _num(r.group(1))
        if hit:
            used.append(line)
    return EngineStartup(
        weights_bytes=weights,
        kv_cache_bytes=round(kv_gib * GiB) if kv_seen else None,
        kv_cache_tokens=total_tokens if total_tokens is not None else kv_tokens,
        max_concurrency=running,
        cuda_graph_bytes=round(graph_gib * GiB) if graphs_seen else None,
        lines=tuple(used),
    )


# ----------------------------------------------------------------------------- llama.cpp --

_L_MODEL = re.compile(r"load_tensors:\s+(\S+) (?:model )?buffer size =\s+" + _NUM + " MiB")
_L_KV = re.compile(
    r"llama_kv_cache(?:_init|_unified)?:\s+(\S+) KV buffer size =\s+" + _NUM + " MiB"
)
_L_CTX = re.compile(r"\bn_ctx\s+=\s+(\d+)")
_L_SEQ = re.compile(r"\bn_seq_max\s+=\s+(\d+)")
_L_PARALLEL = re.compile(r"using n_parallel = (\d+)")


def _llama_cpp(lines: list[str]) -> EngineStartup:
    model_mib = kv_mib = 0.0
    model_seen = kv_seen = False
    n_ctx = slots = parallel = None
    used: list[str] = []
    for line in lines:
        hit = False
        # a host buffer alone says the device holds none (-ngl 0): 0, not unknown
        if m := _L_MODEL.search(line):
            model_seen = True
            if device_buffer(m.group(1)):
                model_mib += _num(m.group(2))
                hit = True
        elif m := _L_KV.search(line):
            kv_seen = True
            if device_buffer(m.group(1)):
                kv_mib += _num(m.group(2))
                hit = True
        elif n_ctx is None and (m := _L_CTX.search(line)):
            n_ctx, hit = int(m.group(1)), True
        elif slots is None and (m := _L_SEQ.search(line)):
            slots, hit = int(m.group(1)), True
        elif parallel is None and (m := _L_PARALLEL.search(line)):
            parallel, hit = int(m.group(1)), True
        if hit:
            used.append(line)
    held = slots if slots is not None else parallel
    return EngineStartup(
        weights_bytes=round(model_mib * MiB) if model_seen else None,
        kv_cache_bytes=round(kv_mib * MiB) if kv_seen else None,
        kv_cache_tokens=n_ctx,
        max_concurrency=float(held) if held is not None else None,
        lines=tuple(used),
    )


_PARSERS = {"vllm": _vllm, "sglang": _sglang, "llama_cpp": _llama_cpp}


def parse_startup(engine: str, lines: Iterable[str]) -> EngineStartup:
    """The figures ``engine`` (``vllm``, ``sglang``, ``llama_cpp``) printed in ``lines`` (its
    log, ANSI colour codes allowed); a figure it did not print is null."""
    clean = [_ANSI.sub("", line.rstrip("\r\n")) for line in lines]
    return _PARSERS[engine](clean)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


_VERSIONS = {
    "vllm": (
        re.compile(r"vLLM API server version (\S+)"),
        re.compile(r"Initializing a V1 LLM engine \(v([^)\s]+)\)"),
        re.compile(r"\u2588\s+version (\S+)"),
    ),
    "llama_cpp": (re.compile(r"\bbuild: (\d+) \("),),
}


def engine_version(engine: str, lines: Iterable[str]) -> str | None:
    """The installed engine's version as its startup log states it (llama.cpp: ``b<build>``);
    None when the log states none (always for SGLang)."""
    patterns = _VERSIONS.get(engine, ())
    for line in lines:
        clean = _ANSI.sub("", line)
        for pattern in patterns:
            if m := pattern.search(clean):
                return f"b{m.group(1)}" if engine == "llama_cpp" else m.group(1)
    return None


def version_warning(engine: str, installed: str | None, modelled: str | None) -> str | None:
    """Why the recipe may not suit the installed engine: its version maps to other modelled
    rules than the recipe's (or to none); None when they agree or either is unknown."""
    from vrambudget.core.errors import InvalidWorkload
    from vrambudget.core.serving.releases import engine_release

    if installed is None or modelled is None:
        return None
    public = installed.split("+", 1)[0]  # vLLM's local suffix: 0.11.0+torch271
    try:
        rules = engine_release(engine, public).modelled
    except InvalidWorkload as exc:
        return (
            f"the installed {engine} is {installed}, which no modelled release covers "
            f"({exc.message}); the command and the estimate follow {modelled}"
        )
    if rules == modelled:
        return None
    return (
        f"the installed {engine} is {installed} ({rules}'s rules) but the command and the "
        f"estimate follow {modelled}: name engine_version {public!r} to probe with its recipe"
    )
