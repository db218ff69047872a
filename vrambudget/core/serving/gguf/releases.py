"""The rules of each modelled llama.cpp build and Ollama release that change memory: their
defaults (context, slots, flash attention, micro-batch), whether ``--fit`` adjusts unset
settings to the free memory, and how layers are placed. A build between two modelled ones
follows the earlier (``releases.engine_release``). Sources: research/llamacpp_accounting.md and
research/ollama_accounting.md (file and line of each rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["LLAMA_CPP_RELEASES", "OLLAMA_RELEASES", "GGUFRelease", "gguf_release"]


@dataclass(frozen=True, slots=True)
class GGUFRelease:
    version: str
    n_ctx_default: Literal["model", "vram"] | int
    """``model``: the model's trained context (llama-server ``-c 0``); ``vram``: Ollama's
    default by total VRAM; else tokens."""
    n_parallel_default: int
    """Slots; -1: llama-server's auto (4 slots sharing a unified KV cache)."""
    flash_attn_default: Literal["auto", "off"]
    fit: Literal["none", "llama_fit", "ollama_estimate", "ollama_backend"]
    """Who decides unset GPU layers (and context): nobody (all layers, as given), llama.cpp's
    ``--fit`` (reduce context to >= 4096, then layers, leaving 1 GiB per GPU), Ollama's own
    estimate (v0.6.7 - v0.12.10), or Ollama's scheduler on the backend's sizes."""
    n_ubatch_default: int
    pad: int
    """n_ctx padding (256; 32 in builds without flash attention before the padding change)."""
    output_first: bool
    """``-ngl N`` offloads the output layer first, then the last N - 1 repeating layers
    (ggml-org/llama.cpp#18148); before it the last N repeating layers went first and the output
    layer only with N > n_layer (``i_gpu_start = n_layer - N``). Ollama's own runners (before
    v0.30) keep the output layer on the host under partial offload as well."""
    f16_mask: bool
    """With flash attention the KQ mask is an f16 graph input (ggml-org/llama.cpp#23764, b9410);
    before it an f32 input that each GPU copies and casts to f16 in its compute buffer."""
    server_outputs: bool
    """llama-server reserves the logits of ``n_parallel`` outputs, not of every token of the
    micro-batch (ggml-org/llama.cpp#23861, b9460; ``n_outputs_max``)."""
    summary: str
    source: str


_LLAMA = "research/llamacpp_accounting.md"
_OLLAMA = "research/ollama_accounting.md"

LLAMA_CPP_RELEASES: tuple[GGUFRelease, ...] = (
    GGUFRelease(
        version="b4000",
        n_ctx_default=4096,
        n_parallel_default=1,
        flash_attn_default="off",
        fit="none",
        n_ubatch_default=512,
        pad=32,
        output_first=False,
        f16_mask=False,
        server_outputs=False,
        summary="-c 4096 by default, one slot, flash attention off, every layer as -ngl says",
        source="ggml-org/llama.cpp#10136 (2024-11-02: the examples' default context becomes "
        "4096); n_ctx padded to 32 without flash attention (llama_kv_cache_get_padding); " + _LLAMA,
    ),
    GGUFRelease(
        version="b6327",
        n_ctx_default=4096,
        n_parallel_default=1,
        flash_attn_default="auto",
        fit="none",
        n_ubatch_default=512,
        pad=32,
        output_first=False,
        f16_mask=False,
        server_outputs=False,
        summary="flash attention 'auto' by default (on where the backend supports it)",
        source="flash_attn_type auto|on|off introduced (mybigday/llama.node#102 syncs b6327, "
        "2025-08-31); " + _LLAMA,
    ),
    GGUFRelease(
        version="b7079",
        n_ctx_default=4096,
        n_parallel_default=-1,
        flash_attn_default="auto",
        fit="none",
        n_ubatch_default=512,
        pad=256,
        output_first=False,
        f16_mask=False,
        server_outputs=False,
        summary="llama-server: 4 slots sharing one unified KV cache unless -np is given; "
        "n_ctx padded to 256",
        source="ggml-org/llama.cpp#16736 (-np auto: 4 slots, kv_unified; in b7079 per "
        "ggml-org/llama.cpp#17300); src/llama-context.cpp:290 GGML_PAD(n_ctx, 256); " + _LLAMA,
    ),
    GGUFRelease(
        version="b7815",
        n_ctx_default="model",
        n_parallel_default=-1,
        flash_attn_default="auto",
        fit="llama_fit",
        n_ubatch_default=512,
        pad=256,
        output_first=True,
        f16_mask=False,
        server_outputs=False,
        summary="--fit on by default: unset context (default: the model's trained context) "
        "and GPU layers are reduced until 1 GiB stays free per GPU (context not below 4096)",
        source="ggml-org/llama.cpp#16653 (llama_params_fit, merged Dec 2025; 'default option "
        "of fit=on' in ggml-org/llama.cpp#18175, 2025-12-18; b7815 is the first build modelled "
        "with it, and with the output layer offloaded first, ggml-org/llama.cpp#18148, "
        "2025-12-18); common/common.h:452,475-483; common/fit.cpp:182-452 (commit 0c1e570); "
        + _LLAMA,
    ),
    GGUFRelease(
        version="b9410",
        n_ctx_default="model",
        n_parallel_default=-1,
        flash_attn_default="auto",
        fit="llama_fit",
        n_ubatch_default=512,
        pad=256,
        output_first=True,
        f16_mask=True,
        server_outputs=False,
        summary="with flash attention the KQ mask is built in f16: no f32 copy of it in each "
        "GPU's compute buffer",
        source="ggml-org/llama.cpp#23764 'llama: use f16 mask for FA to save VRAM' (merged "
        "2026-05-27, release b9410); src/llama-graph.cpp:38-39 (commit 0c1e570); measured with "
        "and without it in bench/llamacpp_rpc.py; " + _LLAMA,
    ),
    GGUFRelease(
        version="b9460",
        n_ctx_default="model",
        n_parallel_default=-1,
        flash_attn_default="auto",
        fit="llama_fit",
        n_ubatch_default=512,
        pad=256,
        output_first=True,
        f16_mask=True,
        server_outputs=True,
        summary="llama-server reserves the logits of its slots' outputs (n_parallel), not of "
        "every token of the micro-batch: the output layer's compute buffer shrinks by about 4 "
        "x n_vocab x n_ubatch bytes",
        source="ggml-org/llama.cpp#23861 (release b9460: 'limit max outputs per context'); "
        "tools/server/server-context.cpp:41-53,995-997, common/speculative.cpp:2586-2595, "
        "src/llama-context.cpp:250,670 (commit 0c1e570); measured in bench/llamacpp_rpc.py; "
        + _LLAMA,
    ),
)

OLLAMA_RELEASES: tuple[GGUFRelease, ...] = (
    GGUFRelease(
        version="0.6.7",
        n_ctx_default=4096,
        n_parallel_default=2,
        flash_attn_default="off",
        fit="ollama_estimate",
        n_ubatch_default=512,
        pad=32,
        output_first=False,
        f16_mask=False,
        server_outputs=False,
        summary="num_ctx 4096, 2 slots (1 when the model does not fit with 2), flash attention "
        "off, layers offloaded as Ollama's own estimate decides",
        source="api/types.go DefaultOptions, server/sched.go, llm/memory.go (v0.6.7); " + _OLLAMA,
    ),
    GGUFRelease(
        version="0.10.0",
        n_ctx_default=4096,
        n_parallel_default=1,
        flash_attn_default="off",
        fit="ollama_estimate",
        n_ubatch_default=512,
        pad=32,
        output_first=False,
        f16_mask=False,
        server_outputs=False,
        summary="one slot by default (OLLAMA_NUM_PARALLEL 1)",
        source="envconfig/config.go NumParallel default 1 (v0.10.0); " + _OLLAMA,
    ),
    GGUFRelease(
        version="0.12.11",
        n_ctx_default=4096,
        n_parallel_default=1,
        flash_attn_default="off",
        fit="ollama_backend",
        n_ubatch_default=512,
        pad=256,
        output_first=False,
        f16_mask=False,
        server_outputs=False,
        summary="llm/memory.go removed: layers placed from the backend's own allocation sizes",
        source="commit f560bd077 'llm: Use Ollama engine memory layouts for both old and new "
        "engines' (first in v0.12.11); " + _OLLAMA,
    ),
    GGUFRelease(
        version="0.15.5",
        n_ctx_default="vram",
        n_parallel_default=1,
        flash_attn_default="off",
        fit="ollama_backend",
        n_ubatch_default=512,
        pad=256,
        output_first=False,
        f16_mask=False,
        server_outputs=False,
        summary="num_ctx by total VRAM: 4096 below 23 GiB, 32768 below 47 GiB, else 262144 "
        "(capped at the model's trained context)",
        source="server/routes.go / envconfig default context length by VRAM (v0.15.5); " + _OLLAMA,
    ),
    GGUFRelease(
        version="0.30.0",
        n_ctx_default="vram",
        n_parallel_default=1,
        flash_attn_default="auto",
        fit="llama_fit",
        n_ubatch_default=512,
        pad=256,
        output_first=True,
        f16_mask=True,
        server_outputs=False,
        summary="runs upstream llama-server: -c num_ctx x num_parallel -np num_parallel -b/-ub "
        "num_batch --flash-attn auto, no -ngl (llama-server's --fit places the layers)",
        source="commit 9db4bdbad 'runner: ... use llama-server exclusively for GGML models' "
        "(v0.30.0); llm/llama_server.go:375-410,590-622 (v0.32.15); the bundled llama.cpp is b9452 "
        "(LLAMA_CPP_VERSION at v0.30.0, fetched by llama/server/CMakeLists.txt:115-116,180-184): "
        "the f16 mask, every token's logits; " + _OLLAMA,
    ),
    GGUFRelease(
        version="0.30.1",
        n_ctx_default="vram",
        n_parallel_default=1,
        flash_attn_default="auto",
        fit="llama_fit",
        n_ubatch_default=512,
        pad=256,
        output_first=True,
        f16_mask=True,
        server_outputs=True,
        summary="the bundled llama-server (b9479 on) reserves the logits of its slots' outputs",
        source="LLAMA_CPP_VERSION b9479 at v0.30.1 (commit c34a79a37 'llama.cpp version update', "
        "2026-06-02), b9672 at v0.30.10, b10488 at v0.32.15; ggml-org/llama.cpp#23861 (b9460); "
        + _OLLAMA,
    ),
)


def gguf_release(engine: str, version: str) -> GGUFRelease:
    table = LLAMA_CPP_RELEASES if engine == "llama_cpp" else OLLAMA_RELEASES
    for r in table:
        if r.version == version:
            return r
    raise KeyError((engine, version))
