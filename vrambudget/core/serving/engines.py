"""The modelled releases of each serving engine (one place: the engines' own tables)."""

from __future__ import annotations

from functools import cache

__all__ = ["ENGINES", "NEWEST_READ", "modelled_releases"]

ENGINES: tuple[str, ...] = ("vllm", "sglang", "llama_cpp", "ollama")

NEWEST_READ: dict[str, str | None] = {
    "vllm": None,  # every minor release is modelled: patches of the newest minor are accepted
    "sglang": "0.5.23",  # research/sglang_accounting.md: every 0.5.N release read up to it
    "ollama": "0.32.15",  # research/ollama_accounting.md: tags read up to it
    "llama_cpp": None,  # daily builds: a newer build keeps the newest modelled rules
}
"""The newest release whose source was read for each engine: newer ones are refused."""


@cache
def modelled_releases(engine: str) -> tuple[str, ...]:
    if engine == "vllm":
        from .calibration import vllm_releases

        return tuple(r.version for r in vllm_releases())
    if engine == "sglang":
        from .sglang import SGLANG_RELEASES

        return tuple(r.version for r in SGLANG_RELEASES)
    from .gguf.releases import LLAMA_CPP_RELEASES, OLLAMA_RELEASES

    table = LLAMA_CPP_RELEASES if engine == "llama_cpp" else OLLAMA_RELEASES
    return tuple(r.version for r in table)
