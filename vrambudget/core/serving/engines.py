"""The modelled releases of each serving engine (one place: the engines' own tables)."""

from __future__ import annotations

from functools import cache

__all__ = ["ENGINES", "modelled_releases"]

ENGINES: tuple[str, ...] = ("vllm", "sglang", "llama_cpp", "ollama")


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
