"""Ollama's own memory estimate (``llm/memory.go`` ``estimateGPULayers`` and ``fs/ggml/ggml.go``
``GraphSize``, ollama/ollama tag v0.12.10, the last release that has it; the file was deleted in
v0.12.11). It decided how many layers Ollama offloaded in v0.6.7 - v0.12.10 and is what Ollama
logged as ``msg=offload ... memory.required.full=...``; vrambudget reports it beside its own
account as a peer (research/ollama_accounting.md has every line).

Integer arithmetic follows Go's uint64: division truncates, left to right.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...arch import Arch

__all__ = ["OllamaEstimate", "ollama_estimate"]

MiB = 1 << 20
_MINIMUM_MEMORY = 457 * MiB  # ml/device.go L320-325 (CUDA / ROCm; Metal 512 MiB)
_BYTES_PER_ELEMENT = {"q8_0": 1.0, "q4_0": 0.5, "f32": 4.0}  # ggml.go L904-915, else 2 (f16)


@dataclass(frozen=True, slots=True)
class OllamaEstimate:
    layers: int
    """layers.offload: layers on the GPUs (n_layer + 1 = all, the output layer counted)."""
    required_full: int
    """memory.required.full: every allocation, GPU and CPU."""
    required_partial: int
    """memory.required.partial: the GPUs' part (VRAMSize)."""
    kv: int
    graph_full: int
    graph_partial: int
    gpu_sizes: tuple[int, ...]


def _graph(
    arch: Arch, model_type: str, context: int, batch: int, bpe: float
) -> tuple[list[int], int, int]:
    """GraphSize (ggml.go L550-798): per-layer KV bytes, (partial, full) graph bytes, for
    the families Ollama names (llama, qwen2, gemma*); others get 0 and the caller's fallback."""
    n_layer = arch.num_layers
    e = arch.hidden_size
    heads, heads_kv = arch.num_heads, arch.num_kv_heads
    hk = hv = arch.head_dim
    eh = e // heads if heads else 0
    vocab = arch.vocab_size
    kv = [int(float(context * (hk + hv) * heads_kv) * bpe)] * n_layer  # L586-589
    full = partial = 0
    if model_type in ("llama", "mistral"):  # L614-625
        full = max(4 * batch * (1 + 4 * e + context * (1 + heads)), 4 * batch * (e + vocab))
        partial = 4 * batch * e + max(
            4 * batch * (1 + e + max(context, e))
            + e * e * 9 // 16
            + 4 * context * (batch * heads + eh * heads_kv),
            4 * batch * (e + vocab) + e * vocab * 105 // 128,
        )
    elif model_type in ("gemma", "gemma2", "gemma3", "gemma3_text"):  # L676-706
        full = max(
            4 * batch * (e + vocab),
            4 * batch * (2 + context + context * heads + 2 * e + 2 * hk * heads),
        )
        partial = max(
            4 * e * batch + e * vocab * 105 // 128 + 4 * vocab * batch,
            4 * batch * (2 * e + 1 + 2 * hk * heads + context + context * heads)
            + 4 * hk * context * 8
            + e * hk * heads * 9 // 16,
        )
    elif model_type == "qwen2":  # L717-726
        full = max(4 * batch * (e + vocab), 4 * batch * (1 + 2 * e + context + context * heads))
        partial = max(
            4 * batch * (e + vocab) + e * vocab * 105 // 128,
            4 * (batch * (1 + 2 * e + context * (1 + heads)) + e * (1 + context)),
        )
    return kv, partial, full


def ollama_estimate(
    arch: Arch,
    layer_weights: tuple[int, ...],
    output_bytes: int,
    gpu_free: tuple[int, ...],
    num_ctx: int,
    num_parallel: int,
    num_batch: int,
    cache_type: str,
    flash_attention: bool,
    num_gpu: int = -1,
) -> OllamaEstimate:
    """estimateGPULayers (memory.go L154-437, v0.12.10) for GPUs of one library (CUDA/ROCm)
    with ``gpu_free`` bytes free each. ``layer_weights``: the bytes of each blk.i;
    ``output_bytes``: output norm + head (or token_embd when tied, L258-266)."""
    kvct = cache_type if flash_attention and cache_type in ("f16", "q8_0", "q4_0") else ""
    context = num_ctx * num_parallel  # ggml.go L551 (>= v0.11.5)
    batch = min(num_ctx, num_batch)  # memory.go L227
    kv, g_partial, g_full = _graph(
        arch, arch.model_type, context, batch, _BYTES_PER_ELEMENT.get(kvct, 2.0)
    )
    kv_total = sum(kv)
    if g_partial == 0:  # L238-245
        gqa = arch.num_heads // max(arch.num_kv_heads, 1)
        g_partial = gqa * kv_total // 6
    if g_full == 0:  # L246-248
        g_full = g_partial
    if len(gpu_free) > 1:  # L250-256: several GPUs use the partial graph
        g_full = g_partial
    n_layer = arch.num_layers
    layer_size = layer_weights[0] + kv[0] if layer_weights else 0  # L207-231
    graph_max = max(g_partial, g_full)
    alloc = [0] * len(gpu_free)
    split = [0] * len(gpu_free)
    with_space: list[int] = []
    for i, free in enumerate(gpu_free):  # L270-304
        if free < graph_max + _MINIMUM_MEMORY + 2 * layer_size:
            continue
        with_space.append(i)
        alloc[i] += _MINIMUM_MEMORY + layer_size  # one extra layer as a buffer
    overflow = 0
    layer_count = 0
    for i in range(n_layer - 1, -1, -1):  # L315-346: last layer first
        layer_size = layer_weights[i] + kv[i]
        if 0 <= num_gpu <= layer_count:
            overflow += layer_size
            continue
        j = len(with_space)
        while j > 0:
            gi = with_space[i % j]
            if gpu_free[gi] > alloc[gi] + graph_max + layer_size:
                alloc[gi] += layer_size
                split[gi] += 1
                layer_count += 1
                break
            del with_space[i % j]
            j -= 1
        if not with_space:
            overflow += layer_size
    fully = layer_count >= n_layer
    if output_bytes > 0:  # L353-371
        if num_gpu < 0 or layer_count < num_gpu:
            j = len(with_space)
            while j > 0:
                gi = with_space[layer_count % j]
                if gpu_free[gi] > alloc[gi] + graph_max + output_bytes:
                    alloc[gi] += output_bytes
                    split[gi] += 1
                    layer_count += 1
                    break
                j -= 1
        if layer_count < n_layer + 1:
            fully = False
            overflow += output_bytes
    graph = g_full if fully else g_partial  # L373-388
    for i in range(len(gpu_free)):
        if split[i] > 0:
            alloc[i] += graph
    partial = sum(alloc) if layer_count else 0
    return OllamaEstimate(
        layers=layer_count,
        required_full=sum(alloc) + overflow,
        required_partial=partial,
        kv=kv_total,
        graph_full=g_full,
        graph_partial=g_partial,
        gpu_sizes=tuple(alloc) if layer_count else (),
    )
