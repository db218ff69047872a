"""SGLang's startup memory accounting (``python -m sglang.launch_server``), per release.

``python/sglang/srt/model_executor/model_runner.py`` ``profile_max_num_token`` (all releases)::

    pre  = free GPU memory after distributed init, before the weights (min over TP ranks)
    post = free GPU memory after the weights
    rest = post - pre x (1 - mem_fraction_static)            (GiB, as SGLang computes it)
    max_total_num_tokens = floor(rest x 2^30 // cell_size / page_size) x page_size
    cell_size = layers x kv_heads per rank x (head_dim + v_head_dim) x dtype bytes
                (MLA: layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes)

so the pool is ``mem_fraction_static`` of the free memory at start less the weights. CUDA graphs
are captured after the pool, out of the ``1 - mem_fraction_static`` left over, as are the
activations of a prefill chunk. The automatic ``mem_fraction_static`` reserves memory for those
(``server_args.py`` / ``arg_groups/memory_hook.py``): a table by TP size (0.4.0), 13 GiB on
cards over 80 GiB (0.4.6), 48 GiB of the rest on cards over 96 GiB (0.4.7), a reserve per
GPU-size band (0.4.8), then a reserve computed from the chunked-prefill size and the CUDA-graph
batch (0.5.3 on). research/sglang_accounting.md and
research/data/sglang_versions.json cite each release's lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from ..arch import Arch
from ..units import GiB, MiB

__all__ = ["SGLANG_RELEASES", "SGLangAccount", "SGLangRelease", "sglang_account", "sglang_release"]


@dataclass(frozen=True, slots=True)
class SGLangRelease:
    version: str
    fraction: Literal["tp_table", "tp_table_13g", "tp_table_48g", "bands", "reserved"]
    chunked: Literal["0.4.0", "0.4.7", "0.4.10", "0.5.3", "0.5.20"]
    graph_bs: Literal["0.4.0", "0.4.6", "0.5.3", "0.5.5", "0.5.20"]
    page_floor: bool
    """The token count is floored to a multiple of page_size (0.4.6 on)."""
    prefill_graphs: bool
    """Prefill CUDA graphs are on by default and reserved for (0.5.10 on)."""
    summary: str
    running: Literal["0.4.0", "0.4.10", "0.5.10", "0.5.16"] = "0.5.16"
    """How ``max_running_requests`` follows from the pool (:func:`max_running_requests`)."""


SGLANG_RELEASES: tuple[SGLangRelease, ...] = (
    SGLangRelease(
        "0.4.0",
        "tp_table",
        "0.4.0",
        "0.4.0",
        False,
        False,
        "mem_fraction_static by TP size (0.88 / 0.87 / 0.85 / 0.81 / 0.79)",
        running="0.4.0",
    ),
    SGLangRelease(
        "0.4.6",
        "tp_table_13g",
        "0.4.0",
        "0.4.6",
        True,
        False,
        "cards over 80 GiB keep 13 GiB outside mem_fraction_static; pool floored to pages",
        running="0.4.0",
    ),
    SGLangRelease(
        "0.4.7",
        "tp_table_48g",
        "0.4.7",
        "0.4.6",
        True,
        False,
        "cards over 96 GiB: min(fraction + 48 GiB x (1 - fraction) / total, (total - 18 GiB) / "
        "total), 0.79 over 180 GB; chunked_prefill_size 16384 over 180 GB; the request pool "
        "without its extra slot",
        running="0.4.10",
    ),
    SGLangRelease(
        "0.4.8",
        "bands",
        "0.4.10",
        "0.4.6",
        True,
        False,
        "a reserve per GPU-size band (2.8 / 9.5 / 12 GiB + TP x PP / 10 or / 2, "
        "32 GiB above 160 GiB)",
        running="0.4.10",
    ),
    SGLangRelease(
        "0.5.3",
        "reserved",
        "0.5.3",
        "0.5.3",
        True,
        False,
        "reserve = 512 MiB + 1.5 MiB per chunked-prefill token + 2 MiB per CUDA-graph "
        "batch + TP x PP / 8 GiB, at least 10 GiB on cards over 60 GiB",
        running="0.4.10",
    ),
    SGLangRelease(
        "0.5.5",
        "reserved",
        "0.5.3",
        "0.5.5",
        True,
        False,
        "cuda_graph_max_bs 24 (TP < 4) on 20-35 GiB cards",
        running="0.4.10",
    ),
    SGLangRelease(
        "0.5.7",
        "reserved",
        "0.5.3",
        "0.5.5",
        True,
        False,
        "KV cell counted as head_dim + v_head_dim (2 x head_dim for every model here)",
        running="0.4.10",
    ),
    SGLangRelease(
        "0.5.10",
        "reserved",
        "0.5.3",
        "0.5.5",
        True,
        True,
        "prefill CUDA graphs on by default: 8 MiB per captured size reserved (1.5 GiB with MLA)",
        running="0.5.10",
    ),
    SGLangRelease(
        "0.5.16",
        "reserved",
        "0.5.3",
        "0.5.5",
        True,
        True,
        "a max_running_requests given is capped at half the pool, no longer at the estimate",
        running="0.5.16",
    ),
    SGLangRelease(
        "0.5.20",
        "reserved",
        "0.5.20",
        "0.5.20",
        True,
        True,
        "20-35 GiB cards: chunked_prefill_size 4096, cuda_graph_max_bs 48 (TP < 4) / 160",
    ),
)


def sglang_release(version: str) -> SGLangRelease:
    for r in SGLANG_RELEASES:
        if r.version == version:
            return r
    raise KeyError(version)


def _mib(total: int) -> int:
    """The GPU size the defaults read: nvidia-smi's total in MiB
    (``get_device_memory_capacity``)."""
    return total // MiB


def chunked_prefill_default(r: SGLangRelease, gpu_mib: int) -> int:
    if r.chunked == "0.4.0":
        return 2048 if gpu_mib < 25000 else 8192
    if r.chunked == "0.4.7":
        return 16384 if gpu_mib > 180_000 else 2048 if gpu_mib < 25000 else 8192
    if r.chunked == "0.4.10":
        return 2048 if gpu_mib < 35 * 1024 else 8192 if gpu_mib < 160 * 1024 else 16384
    small = 2048 if r.chunked == "0.5.3" else 4096
    if gpu_mib < 20 * 1024:
        return 2048
    if gpu_mib < 35 * 1024:
        return small
    if gpu_mib < 60 * 1024:
        return 4096
    return 8192 if gpu_mib < 160 * 1024 else 16384


def cuda_graph_max_bs_default(r: SGLangRelease, gpu_mib: int, tp: int) -> int:
    if r.graph_bs == "0.4.0":
        return 8 if gpu_mib < 25000 else 160
    if r.graph_bs == "0.4.6":
        if gpu_mib < (25000 if r.chunked in ("0.4.0", "0.4.7") else 35 * 1024):
            return 8 if tp < 4 else 80
        # no cap: the runner's capture list ends there. cuda_graph_runner.py: 0.4.6.post5:145
        # adds 160-256 over 96 GiB; 0.4.7:150-153 also 256-512 over 180 GB; 0.4.8:160-163 over
        # 90 GiB and 160 GB
        if r.chunked == "0.4.10":
            return 512 if gpu_mib > 160_000 else 256 if gpu_mib > 90 * 1024 else 160
        if r.chunked == "0.4.7":
            return 512 if gpu_mib > 180_000 else 256 if gpu_mib > 96 * 1024 else 160
        return 256 if gpu_mib > 96 * 1024 else 160
    if gpu_mib < 20 * 1024:
        return 8
    if gpu_mib < 35 * 1024:
        small = {"0.5.3": 16, "0.5.5": 24, "0.5.20": 48}[r.graph_bs]
        return small if tp < 4 else (160 if r.graph_bs == "0.5.20" else 80)
    if gpu_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def _prefill_graph_sizes(max_bs: int = 2048) -> int:
    """``generate_prefill_cuda_graph_batch_sizes`` (arg_groups/cuda_graph_hook.py:480, 0.5.23)
    at the documented default of 2048 tokens."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return len([s for s in sizes if s <= max_bs])


def reserved_mib(
    r: SGLangRelease, gpu_mib: int, tp: int, chunked: int, graph_bs: int, mla: bool, graphs: bool
) -> float:
    """The memory the automatic mem_fraction_static keeps out (0.5.3 on: memory_hook.py)."""
    res = 512.0 + max(chunked if chunked > 0 else 16384, 2048) * 1.5
    if graphs:
        res += graph_bs * 2
    res += tp / 8 * 1024
    if r.prefill_graphs and graphs:
        res += 1.5 * 1024 if mla else _prefill_graph_sizes() * 8
    if gpu_mib > 60 * 1024:
        res = max(res, 10 * 1024)
    return res


def mem_fraction_default(
    r: SGLangRelease,
    gpu_mib: int,
    tp: int,
    chunked: int,
    graph_bs: int,
    mla: bool,
    graphs: bool,
    cuda: bool = True,
) -> float:
    if r.fraction in ("tp_table", "tp_table_13g", "tp_table_48g"):
        if r.fraction == "tp_table_13g" and gpu_mib > 81920:
            return (gpu_mib - 1024 * 13) / gpu_mib
        table = (
            0.79
            if tp >= 16
            else 0.81
            if tp >= 8
            else 0.85
            if tp >= 4
            else 0.87
            if tp >= 2
            else 0.88
        )
        if r.fraction == "tp_table_48g":
            # 0.4.7 server_args.py:254-281 (the table up to 80 GiB, 0.88 above; then)
            frac = table if gpu_mib <= 81920 else 0.88
            if gpu_mib > 180 * 1000 and cuda:  # `and is_cuda()`: ROCm takes the 96 GiB rule
                return 0.79
            if gpu_mib > 96 * 1024:
                return min(frac + 48 * 1024 * (1 - frac) / gpu_mib, (gpu_mib - 1024 * 18) / gpu_mib)
            return frac
        return table
    if r.fraction == "bands":
        if gpu_mib < 35 * 1024:
            base = (2.8 + tp / 10) * 1024
        elif gpu_mib < 90 * 1024:
            base = (9.5 + tp / 2) * 1024
        elif gpu_mib < 160 * 1024:
            base = (12 + tp / 2) * 1024
        else:
            base = 32 * 1024
        return round((gpu_mib - base) / gpu_mib, 3)
    res = reserved_mib(r, gpu_mib, tp, chunked, graph_bs, mla, graphs)
    return round((gpu_mib - res) / gpu_mib, 3)


def max_running_requests(r: SGLangRelease, tokens: int, context_len: int, given: int | None) -> int:
    """The scheduler's ``max_running_requests`` for a pool of ``tokens``, with
    ``estimated = min(max(int(tokens / context_len x 512), 2048), 4096)``:

    - 0.4.0 - 0.4.6 (``tp_worker.py``, ``model_runner.py`` ``ReqToTokenPool(size=max_num_reqs
      + 1)``, 0.4.6.post5 line 904): min(tokens // 2, estimated + 1); a value given stands (the
      request pool has one slot more);
    - 0.4.7 - 0.5.9 (the pool's size is ``max_num_reqs``, 0.4.7 line 926): min(tokens // 2,
      estimated); a value given stands;
    - 0.5.10 - 0.5.15 (``model_runner_kv_cache_mixin.py`` ``_resolve_max_num_reqs``): a value
      given is capped at ``estimated``;
    - 0.5.16 on: a value given is capped at tokens // 2 (at least 1)."""
    estimated = min(max(int(tokens / max(context_len, 1) * 512), 2048), 4096)
    if given is None:
        return min(tokens // 2, estimated + 1 if r.running == "0.4.0" else estimated)
    if r.running == "0.5.10":
        return min(given, estimated)
    if r.running == "0.5.16":
        return min(max(1, given), tokens // 2)
    return given


@dataclass(frozen=True, slots=True)
class SGLangAccount:
    release: SGLangRelease
    mem_fraction_static: float
    fraction_source: str
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    page_size: int
    free_before: int
    """Free memory when SGLang measures (after the CUDA context and NCCL)."""
    weights_bytes: int
    rest_bytes: int
    cell_bytes: int
    max_total_num_tokens: int
    pool_bytes: int
    max_running_requests: int
    context_len: int
    graph_bytes: int
    """CUDA graphs and a prefill chunk's working set, outside the pool (``runtime_bytes``)."""
    would_start: bool
    reason: str | None


def runtime_bytes(
    arch: Arch, r: SGLangRelease, tp: int, chunk: int, graph_bs: int, disable_graphs: bool
) -> int:
    """What SGLang allocates outside the pool once it serves: decode CUDA graphs (2 MiB x
    ``cuda_graph_max_bs``, the term of SGLang's own reserve; the one launch that prints its
    capture, four sizes up to 8 on an RTX 4090, took 0.11 GB, so this errs low), prefill CUDA
    graphs (8 MiB per captured size, 1.5 GiB with MLA, 0.5.10 on) and one prefill chunk's
    working set (the MLP's gate and up projections and four hidden-size activations per token,
    bf16, this rank's share). SGLang's automatic mem_fraction_static reserves more (1.5 MiB per
    chunk token): that reserve sets the default fraction, this is the estimate of what is
    used."""
    tokens = chunk if chunk > 0 else 16384
    ff = (
        arch.moe.expert_intermediate_size * arch.moe.experts_per_token
        if arch.moe
        else (arch.intermediate_size)
    )
    work = tokens * (2 * ff // tp + 4 * arch.hidden_size) * 2
    if disable_graphs:
        return work
    graphs = graph_bs * 2 * MiB
    if r.prefill_graphs:
        graphs += int(1.5 * GiB) if arch.mla is not None else _prefill_graph_sizes() * 8 * MiB
    return work + graphs


def cell_bytes(arch: Arch, tp: int, kv_bytes: int) -> int:
    """K+V bytes of one token on one rank. SGLang 0.5.7 on counts head_dim + v_head_dim,
    before 2 x head_dim: the same for every model here (one head_dim for K and V)."""
    if arch.mla is not None:
        return arch.num_layers * (arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim) * kv_bytes
    heads = max(arch.num_kv_heads // tp, 1)
    return arch.num_layers * heads * 2 * arch.head_dim * kv_bytes


@lru_cache(maxsize=1024)
def sglang_account(
    arch: Arch,
    r: SGLangRelease,
    total: int,
    baseline: int,
    weights: int,
    tp: int,
    kv_bytes: int,
    context_len: int,
    fraction: float | None,
    chunked: int | None,
    graph_bs: int | None,
    disable_graphs: bool,
    max_running: int | None,
    max_total_tokens: int | None,
    page_size: int,
    smi_mib: int | None = None,
    cuda: bool = True,
) -> SGLangAccount:
    """One GPU of the deployment. ``baseline``: memory taken before SGLang measures (CUDA
    context, NCCL); ``weights``: this rank's weights; ``smi_mib``: nvidia-smi's total, which the
    automatic defaults read (``get_nvgpu_memory_capacity`` runs ``nvidia-smi --query-gpu=
    memory.total``; larger than the runtime's total by the driver's reservation), the runtime
    total in MiB where the catalog has none."""
    # (at least 1 MiB: a custom device below it divides the fraction rules by zero)
    gpu_mib = max(smi_mib if smi_mib is not None else _mib(total), 1)
    chunk = chunked if chunked is not None else chunked_prefill_default(r, gpu_mib)
    gbs = graph_bs if graph_bs is not None else cuda_graph_max_bs_default(r, gpu_mib, tp)
    mla = arch.mla is not None
    if fraction is None:
        frac = mem_fraction_default(r, gpu_mib, tp, chunk, gbs, mla, not disable_graphs, cuda)
        source = f"automatic ({r.version} rule for a {gpu_mib} MiB GPU at TP {tp})"
    else:
        frac, source = fraction, "request"
    free_before = total - baseline
    pre_gib = free_before / GiB
    post_gib = (free_before - weights) / GiB
    rest_gib = post_gib - pre_gib * (1 - frac)
    cell = cell_bytes(arch, tp, kv_bytes)
    tokens = int(rest_gib * (1 << 30) // cell) if rest_gib > 0 else 0
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    if r.page_floor:
        tokens = tokens // page_size * page_size
    running = max_running_requests(r, tokens, context_len, max_running)
    pool = (tokens + page_size) * cell  # each K and V buffer keeps one padding page
    graphs = runtime_bytes(arch, r, tp, chunk, gbs, disable_graphs)
    reason = None
    if context_len > arch.max_positions:
        reason = (
            f"context_length {context_len} exceeds the model's max_position_embeddings "
            f"{arch.max_positions} (SGLang refuses unless "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)"
        )
    elif frac <= 0:
        reason = (
            f"the automatic mem_fraction_static is {frac:.3f}: the reserve for a "
            f"chunked_prefill_size of {chunk} and {gbs} CUDA-graph batch sizes exceeds the GPU"
        )
    elif rest_gib <= 0:
        reason = (
            "Not enough memory: the weights take more than mem_fraction_static "
            f"({frac:.3f}) of the free memory; raise --mem-fraction-static"
        )
    elif tokens <= 0 or running < 1:
        reason = (
            f"the token pool holds {tokens} tokens (page_size {page_size}): no request fits "
            "(max_running_requests 0)"
        )
    elif baseline + weights + pool + graphs > total:
        reason = (
            f"the pool leaves {(total - baseline - weights - pool) / GiB:.2f} GiB for CUDA graphs "
            "and the prefill chunk's activations, less than SGLang reserves for them: expect an "
            "out-of-memory error while capturing CUDA graphs; lower --mem-fraction-static"
        )
    return SGLangAccount(
        release=r,
        mem_fraction_static=frac,
        fraction_source=source,
        chunked_prefill_size=chunk,
        cuda_graph_max_bs=gbs,
        page_size=page_size,
        free_before=free_before,
        weights_bytes=weights,
        rest_bytes=int(rest_gib * GiB),
        cell_bytes=cell,
        max_total_num_tokens=tokens,
        pool_bytes=pool if tokens > 0 else 0,
        max_running_requests=max(running, 0),
        context_len=context_len,
        graph_bytes=graphs,
        would_start=reason is None,
        reason=reason,
    )
