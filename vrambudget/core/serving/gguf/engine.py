"""A ``llama_cpp`` or ``ollama`` deployment on one GPU type: the settings the release builds from
the request and its defaults, who decides what stays on the GPUs (``--fit``, Ollama's estimate,
or the request), the buffers that result, and whether it starts.

The engines do not refuse ahead of time the way vLLM does: llama.cpp allocates each buffer and
fails with ``cudaMalloc failed: out of memory`` when one does not fit. ``would_start`` is that
check: every GPU's buffers plus the backend's own context within the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from msgspec.structs import replace as replace_struct

from ...arch import Arch
from ...errors import InvalidWorkload
from ...search import largest_true, smallest_true
from ...spec import GGUFOptions, LLMServingWorkload
from ...units import GiB, MiB
from .llamacpp import (
    LlamaAccount,
    LlamaSettings,
    cpu_moe_flag,
    llama_account,
    split_fractions,
)
from .ollama_estimate import OllamaEstimate, ollama_estimate
from .releases import GGUFRelease, gguf_release

__all__ = ["GGUFAccount", "concurrency", "gguf_account", "launch_command"]

FIT_MARGIN_BYTES = 1 << 30
"""llama.cpp ``--fit-target`` default: 1024 MiB left free per device (common/common.h:483)."""
NO_OP_OFFLOAD_BUILD = 5350
"""A llama.cpp build with ``--no-op-offload`` (ggml-org/llama.cpp#13386, merged 2025-05-10;
the first is a few builds earlier)."""
N_CPU_MOE_BUILD = 6089
"""The first llama.cpp build with ``--n-cpu-moe`` (ggml-org/llama.cpp#15077, 2025-08-04)."""
FIT_MIN_CTX = 4096
"""``--fit-ctx`` default: the context ``--fit`` never reduces below (common/common.h:480)."""


@dataclass(frozen=True, slots=True)
class GGUFAccount:
    release: GGUFRelease
    settings: LlamaSettings
    account: LlamaAccount
    context_bytes: int
    """The backend's own device memory per GPU (CUDA context, cuBLAS handles)."""
    device_total_bytes: int
    would_start: bool
    reason: str | None
    fitted: str | None
    ollama: OllamaEstimate | None
    n_ctx_requested: int
    """Context per request: n_ctx / n_parallel for llama.cpp (unless unified), num_ctx for
    Ollama."""
    ctx_asked: int
    """The context the engine is started with, before padding (-c; Ollama's num_ctx)."""

    def device_used(self, d: int) -> int:
        return self.account.devices[d].buffers_bytes + self.context_bytes


def concurrency(g: GGUFAccount) -> float:
    """Requests of ``n_ctx_requested`` tokens held at once: every slot with its own context
    holds one; a unified cache holds n_ctx tokens in all, at most one per slot."""
    s = g.settings
    if s.kv_unified:
        return min(float(s.n_parallel), s.n_ctx / max(g.n_ctx_requested, 1))
    return float(s.n_parallel)


def _opts(w: LLMServingWorkload) -> GGUFOptions:
    return w.gguf if w.gguf is not None else GGUFOptions()


def _n_ctx_default(r: GGUFRelease, arch: Arch, total: int) -> int:
    d = r.n_ctx_default
    if d == "model":
        return arch.max_positions
    if d == "vram":
        # Ollama >= 0.15.5: 4096 below 23 GiB of VRAM, 32768 below 47 GiB, else 262144, capped
        # at the trained context (research/ollama_accounting.md, num_ctx)
        n = 4096 if total < 23 * GiB else (32768 if total < 47 * GiB else 262144)
        return min(n, arch.max_positions)
    return min(d, arch.max_positions) if r.version.startswith("0.") else d


_QUANTIZED = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_OLLAMA_CACHE = ("f16", "q8_0", "q4_0")


def _batch(w: LLMServingWorkload) -> int:
    """``-b``: 2048 (llama.cpp), ``num_batch`` 512 (Ollama, which runs -b and -ub at it)."""
    o = _opts(w)
    return o.n_batch if o.n_batch is not None else (512 if w.engine == "ollama" else 2048)


def _flash(w: LLMServingWorkload, r: GGUFRelease) -> bool:
    o = _opts(w)
    return o.flash_attn == "on" or (o.flash_attn == "auto" and r.flash_attn_default == "auto")


def check_options(w: LLMServingWorkload, r: GGUFRelease, ctx_req: int) -> None:
    """What llama.cpp (or Ollama) refuses, or cannot be told, as field errors."""
    o = _opts(w)
    flash = _flash(w, r)
    if w.engine == "ollama":
        if o.n_ubatch is not None:
            raise InvalidWorkload(
                "gguf.n_ubatch", "Ollama runs -b and -ub at num_batch: set gguf.n_batch instead"
            )
        if o.tensor_split is not None:
            raise InvalidWorkload(
                "gguf.tensor_split", "Ollama splits layers itself: leave tensor_split null"
            )
        if not o.op_offload:
            raise InvalidWorkload(
                "gguf.op_offload",
                "Ollama has no setting for llama.cpp's --no-op-offload: leave op_offload true",
            )
        if o.n_cpu_moe:
            raise InvalidWorkload(
                "gguf.n_cpu_moe",
                "Ollama has no setting that keeps expert weights in host memory (llama.cpp's "
                "--n-cpu-moe): leave n_cpu_moe 0",
            )
        if o.cache_type_k != o.cache_type_v or o.cache_type_k not in _OLLAMA_CACHE:
            raise InvalidWorkload(
                "gguf.cache_type_k",
                "Ollama's OLLAMA_KV_CACHE_TYPE sets both caches: f16, q8_0 or q4_0, the same "
                "for K and V",
            )
    elif not o.op_offload and parse_build(w.engine_version or r.version) < NO_OP_OFFLOAD_BUILD:
        raise InvalidWorkload(
            "gguf.op_offload",
            f"llama.cpp {w.engine_version or r.version} predates --no-op-offload "
            f"(b{NO_OP_OFFLOAD_BUILD}, ggml-org/llama.cpp#13386): choose engine_version "
            f"b{NO_OP_OFFLOAD_BUILD} or later, or leave it true",
        )
    elif o.n_cpu_moe and parse_build(w.engine_version or r.version) < N_CPU_MOE_BUILD:
        raise InvalidWorkload(
            "gguf.n_cpu_moe",
            f"llama.cpp {w.engine_version or r.version} predates --n-cpu-moe "
            f"(b{N_CPU_MOE_BUILD}, ggml-org/llama.cpp#15077): choose engine_version "
            f"b{N_CPU_MOE_BUILD} or later, or leave it 0",
        )
    elif o.cache_type_v in _QUANTIZED and not flash:
        raise InvalidWorkload(
            "gguf.cache_type_v",
            f"a quantized V cache needs flash attention, which llama.cpp {r.version} leaves off "
            "by default: set gguf.flash_attn 'on'",
        )
    parallel = o.n_parallel if o.n_parallel is not None else r.n_parallel_default
    if parallel > 0 and w.engine == "llama_cpp" and ctx_req < parallel:
        raise InvalidWorkload(
            "gguf.n_ctx",
            f"n_ctx {ctx_req} leaves each of the {parallel} slots no cells (llama.cpp "
            f"throws n_ctx_seq == 0): at least {parallel}",
        )


def _settings(
    w: LLMServingWorkload,
    r: GGUFRelease,
    arch: Arch,
    total: int,
    n_ctx: int,
    ngl: int,
    n_cpu_moe: int | None = None,
) -> LlamaSettings:
    """The settings the release starts with; ``n_cpu_moe`` (default: the request's) is --fit's
    own choice where it keeps a MoE model's experts in host memory."""
    o = _opts(w)
    moe_host = o.n_cpu_moe if n_cpu_moe is None else n_cpu_moe
    parallel = o.n_parallel if o.n_parallel is not None else r.n_parallel_default
    unified = False
    if parallel < 0:  # llama-server auto: 4 slots, one unified cache (tools/server/server.cpp:156)
        parallel, unified = 4, True
    if w.engine == "ollama":
        n_ctx = n_ctx * parallel  # Ollama starts the runner with -c num_ctx x num_parallel
    flash = _flash(w, r)
    # 256 cells (before b7079: 256 with flash attention, else 32; llama_kv_cache_get_padding)
    pad = 256 if (r.pad == 256 or flash) else r.pad
    cells = _pad(n_ctx, pad)
    if not unified:
        per = _pad(cells // parallel, pad) if r.pad == 256 else cells // parallel
        cells = per * parallel
    batch = _batch(w)
    if w.engine == "ollama":
        ubatch = batch
    else:
        ubatch = o.n_ubatch if o.n_ubatch is not None else r.n_ubatch_default
    type_k, type_v = o.cache_type_k, o.cache_type_v
    if w.engine == "ollama" and not flash:
        # Ollama applies OLLAMA_KV_CACHE_TYPE only with flash attention (llm/memory.go:219-225)
        type_k = type_v = "f16"
    return LlamaSettings(
        n_ctx=cells,
        n_ctx_seq=cells if unified else cells // parallel,
        n_parallel=parallel,
        kv_unified=unified,
        n_gpu_layers=ngl,
        flash_attn=flash,
        n_ubatch=min(ubatch, batch),
        n_batch=batch,
        type_k=type_k,
        type_v=type_v,
        devices=o.devices,
        splits=split_fractions(o.devices, o.tensor_split),
        kv_offload=o.kv_offload,
        output_first=r.output_first,
        f16_mask=r.f16_mask,
        n_outputs=min(batch, parallel) if r.server_outputs else None,
        n_cpu_moe=min(moe_host, arch.num_layers),
        op_offload=o.op_offload,
    )


def _pad(x: int, to: int) -> int:
    return (x + to - 1) // to * to


def _fits(a: LlamaAccount, context: int, total: int, margin: int) -> bool:
    return all(d.buffers_bytes + context + margin <= total for d in a.devices)


@lru_cache(maxsize=1024)
def gguf_account(
    w: LLMServingWorkload,
    arch: Arch,
    total: int,
    context_bytes: int,
    modelled: str,
    in_use: int = 0,
) -> GGUFAccount:
    """The deployment on GPUs of ``total`` bytes each, ``context_bytes`` of which the backend
    takes before any buffer and ``in_use`` other processes hold (the fitting and the start see
    what is left; the default context follows the total). Errors name fields under ``gguf``."""
    room = total - in_use
    o = _opts(w)
    r = gguf_release(w.engine, modelled)
    n_layer = arch.num_layers
    if o.tensor_split is not None and len(o.tensor_split) != o.devices:
        raise InvalidWorkload(
            "gguf.tensor_split",
            f"one proportion per device: {o.devices} expected, {len(o.tensor_split)} given",
        )
    if o.n_gpu_layers is not None and o.n_gpu_layers > n_layer + 1:
        ngl_req: int | None = n_layer + 1  # llama.cpp caps at n_layer + 1 (act_gpu_layers)
    else:
        ngl_req = o.n_gpu_layers
    ctx_req = o.n_ctx if o.n_ctx is not None else _n_ctx_default(r, arch, total)
    check_options(w, r, ctx_req)
    fitted: list[str] = []
    est: OllamaEstimate | None = None
    full = n_layer + 1
    s = _settings(w, r, arch, total, ctx_req, ngl_req if ngl_req is not None else full)
    a = llama_account(arch, o.file_type, s, o.tensors)
    margin = FIT_MARGIN_BYTES if r.fit == "llama_fit" else 0
    if (
        r.fit == "ollama_estimate"
        and r.n_parallel_default == 2
        and o.n_parallel is None
        and ngl_req is None
    ):
        # Ollama 0.6.7 - 0.9: two slots when the model fits whole with them, else one
        trial = _ollama(w, r, arch, a, room - context_bytes, None)
        if trial.layers < full:
            w = _with_parallel(w, 1)
            o = _opts(w)
            s = _settings(w, r, arch, total, ctx_req, full)
            a = llama_account(arch, o.file_type, s, o.tensors)
    if r.fit == "llama_fit" and not _fits(a, context_bytes, room, margin):
        if w.engine == "llama_cpp" and o.n_ctx is None and ctx_req > FIT_MIN_CTX:
            best = _largest_ctx(w, r, arch, room, context_bytes, ctx_req, s.n_gpu_layers, margin)
            if best != ctx_req:
                fitted.append(f"context reduced from {ctx_req} to {best}")
                ctx_req = best
                s = _settings(w, r, arch, total, ctx_req, s.n_gpu_layers)
                a = llama_account(arch, o.file_type, s, o.tensors)
        # --fit places weights only where the request set no placement of its own: layers,
        # a tensor split over several GPUs, tensor overrides (--n-cpu-moe) make it stop after
        # the context (common/fit.cpp:463-486, "... already set by user, abort")
        user_split = o.devices > 1 and o.tensor_split is not None
        fit_places = ngl_req is None and not o.n_cpu_moe and not user_split
        if ngl_req is None and not fit_places and not _fits(a, context_bytes, room, margin):
            what = "n_cpu_moe" if o.n_cpu_moe else "tensor_split"
            fitted.append(f"--fit leaves the layers as they are ({what} is set)")
        placed = None
        if fit_places and arch.moe is not None and not _fits(a, context_bytes, room, margin):
            # --fit keeps a MoE model's dense weights on the GPUs first (common/fit.cpp:
            # "dense-only" layers, ggml-org/llama.cpp#16653): every layer there with the
            # experts of as few layers as fit in host memory; else as many dense-only layers
            # as fit, the rest of the model in host memory
            placed = _fit_experts(w, r, arch, total, room, context_bytes, ctx_req, margin)
            if placed is not None:
                s, a, note = placed
                fitted.append(note)
        if fit_places and not _fits(a, context_bytes, room, margin):
            ngl = _most_layers(w, r, arch, room, context_bytes, ctx_req, margin)
            fitted.append(f"{ngl} of {full} layers on the GPUs, the rest in host memory")
            s = _settings(w, r, arch, total, ctx_req, ngl)
            a = llama_account(arch, o.file_type, s, o.tensors)
    elif r.fit == "ollama_estimate" and o.devices >= 1:
        est = _ollama(w, r, arch, a, room - context_bytes, ngl_req)
        if ngl_req is None and est.layers < full:
            fitted.append(f"Ollama's estimate offloads {est.layers} of {full} layers")
            s = _settings(w, r, arch, total, ctx_req, est.layers)
            a = llama_account(arch, o.file_type, s, o.tensors)
    elif r.fit == "ollama_backend" and ngl_req is None and not _fits(a, context_bytes, room, 0):
        ngl = _most_layers(w, r, arch, room, context_bytes, ctx_req, 0)
        fitted.append(f"Ollama's scheduler offloads {ngl} of {full} layers")
        s = _settings(w, r, arch, total, ctx_req, ngl)
        a = llama_account(arch, o.file_type, s, o.tensors)
    reason = None
    for d in a.devices:
        used = d.buffers_bytes + context_bytes
        if used > room:
            reason = (
                f"GPU {d.index} needs {used / MiB:,.0f} MiB (model {d.weights_bytes / MiB:,.0f} "
                f"+ KV {d.kv_bytes / MiB:,.0f} + compute {d.compute_bytes / MiB:,.0f} + backend "
                f"{context_bytes / MiB:,.0f}) of the {room / MiB:,.0f} MiB it may use: "
                "cudaMalloc fails while loading"
            )
            break
    per_request = s.n_ctx if s.kv_unified else s.n_ctx_seq
    if w.engine == "ollama":
        per_request = s.n_ctx // s.n_parallel
    return GGUFAccount(
        release=r,
        settings=s,
        account=a,
        context_bytes=context_bytes,
        device_total_bytes=total,
        would_start=reason is None,
        reason=reason,
        fitted="; ".join(fitted) or None,
        ollama=est,
        n_ctx_requested=per_request,
        ctx_asked=ctx_req,
    )


def _with_parallel(w: LLMServingWorkload, n: int) -> LLMServingWorkload:
    o = replace_struct(_opts(w), n_parallel=n)
    return replace_struct(w, gguf=o)


def _largest_ctx(
    w: LLMServingWorkload,
    r: GGUFRelease,
    arch: Arch,
    total: int,
    context: int,
    start: int,
    ngl: int,
    margin: int,
) -> int:
    """--fit's context reduction (common/fit.cpp:393-452): the largest context, in steps of
    256 and not below 4096, whose projected use leaves the margin; 4096 when none does."""
    o = _opts(w)
    lo, hi = FIT_MIN_CTX // 256, max(start // 256, FIT_MIN_CTX // 256)

    def ok(k: int) -> bool:
        s = _settings(w, r, arch, total, k * 256, ngl)
        return _fits(llama_account(arch, o.file_type, s, o.tensors), context, total, margin)

    if not ok(lo):
        return FIT_MIN_CTX
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo * 256


def _fit_experts(
    w: LLMServingWorkload,
    r: GGUFRelease,
    arch: Arch,
    total: int,
    room: int,
    context: int,
    n_ctx: int,
    margin: int,
) -> tuple[LlamaSettings, LlamaAccount, str] | None:
    """--fit's layout for a MoE model that does not fit whole (common/fit.cpp, steps 3-4):
    with only the dense weights on the GPUs there is room, so every layer goes there and the
    dense-only layers (their experts in host memory) are converted to full layers while they
    fit; else the most dense-only layers that fit, the other layers in host memory. llama.cpp
    keeps the experts of the last layers on the host and may fit part of one more layer's
    experts (its ``LAYER_FRACTION_*`` overflow); the budget takes the same count of whole
    layers, first layers first (``--n-cpu-moe``: the same bytes on one GPU)."""
    o = _opts(w)
    n_layer = arch.num_layers
    full = n_layer + 1

    def account(ngl: int, n_cpu_moe: int) -> tuple[LlamaSettings, LlamaAccount]:
        s = _settings(w, r, arch, total, n_ctx, ngl, n_cpu_moe)
        return s, llama_account(arch, o.file_type, s, o.tensors)

    s, a = account(full, n_layer)
    if _fits(a, context, room, margin):
        # the fewest layers whose experts stay in host memory (fewer need more GPU memory)
        k = smallest_true(0, n_layer, lambda n: _fits(account(full, n)[1], context, room, margin))
        s, a = account(full, k)
        return (
            s,
            a,
            (
                f"every layer on the GPUs, the expert weights of {a.host_expert_layers} layers "
                "in host memory (--fit keeps a MoE model's dense weights on the GPUs first)"
            ),
        )
    ngl = largest_true(0, full, lambda n: _fits(account(n, n_layer)[1], context, room, margin))
    if ngl < 0:
        return None  # not even the dense weights of one layer: whole layers, as for a dense model
    s, a = account(ngl, n_layer)
    return (
        s,
        a,
        (
            f"{ngl} of {full} layers on the GPUs with their expert weights in host memory, "
            "the rest in host memory (--fit keeps a MoE model's dense weights on the GPUs first)"
        ),
    )


def _most_layers(
    w: LLMServingWorkload,
    r: GGUFRelease,
    arch: Arch,
    total: int,
    context: int,
    n_ctx: int,
    margin: int,
) -> int:
    """The most GPU layers (output layer counted) that leave the margin; 0 when none do."""
    o = _opts(w)
    best = 0
    lo, hi = 0, arch.num_layers + 1
    while lo <= hi:
        mid = (lo + hi) // 2
        s = _settings(w, r, arch, total, n_ctx, mid)
        if _fits(llama_account(arch, o.file_type, s, o.tensors), context, total, margin):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _ollama(
    w: LLMServingWorkload,
    r: GGUFRelease,
    arch: Arch,
    a: LlamaAccount,
    free: int,
    ngl: int | None,
) -> OllamaEstimate:
    o = _opts(w)
    s = a.settings
    return ollama_estimate(
        arch,
        a.layer_weights[:-1],
        a.layer_weights[-1],
        (free,) * o.devices,
        num_ctx=s.n_ctx // s.n_parallel,
        num_parallel=s.n_parallel,
        num_batch=s.n_batch,
        cache_type=o.cache_type_k,
        flash_attention=s.flash_attn,
        num_gpu=-1 if ngl is None else ngl,
    )


def _fa_flag(r: GGUFRelease, flash: bool) -> str:
    """``-fa on|off`` from b6327 (flash_attn_type); before, ``-fa`` is a switch."""
    if parse_build(r.version) >= 6327:
        return f"-fa {'on' if flash else 'off'}"
    return "-fa" if flash else ""


def parse_build(version: str) -> int:
    return int(version.removeprefix("b")) if version.startswith("b") else 0


def launch_command(w: LLMServingWorkload, g: GGUFAccount, model_ref: str) -> str:
    """The command that starts what was budgeted."""
    s = g.settings
    o = _opts(w)
    if w.engine == "ollama":
        env = []
        if s.n_parallel != 1:
            env.append(f"OLLAMA_NUM_PARALLEL={s.n_parallel}")
        if s.flash_attn:
            env.append("OLLAMA_FLASH_ATTENTION=1")
            if s.type_k != "f16":
                env.append(f"OLLAMA_KV_CACHE_TYPE={s.type_k}")
        opts = [f'"num_ctx": {g.ctx_asked}']
        if o.n_gpu_layers is not None:
            opts.append(f'"num_gpu": {o.n_gpu_layers}')
        if s.n_batch != 512:
            opts.append(f'"num_batch": {s.n_batch}')
        prefix = " ".join(env) + " " if env else ""
        return (
            f"{prefix}ollama serve; curl localhost:11434/api/generate -d "
            f'\'{{"model": "{model_ref}:{o.file_type.lower()}", "options": '
            f"{{{', '.join(opts)}}}}}'"
        )
    parts = [
        "llama-server",
        f"-m {model_ref}-{o.file_type}.gguf",
        f"-c {s.n_ctx}",
        f"-np {s.n_parallel if not (s.kv_unified and o.n_parallel is None) else -1}",
        f"-ngl {s.n_gpu_layers}",
        _fa_flag(g.release, s.flash_attn),
        f"-b {s.n_batch}",
        f"-ub {s.n_ubatch}",
    ]
    if s.type_k != "f16":
        parts.append(f"-ctk {s.type_k}")
    if s.type_v != "f16":
        parts.append(f"-ctv {s.type_v}")
    if s.devices > 1:
        parts.append("--split-mode layer --tensor-split " + ",".join(f"{x:g}" for x in s.splits))
    if not s.kv_offload:
        parts.append("--no-kv-offload")
    if s.n_cpu_moe:
        parts.append(cpu_moe_flag(s.n_cpu_moe, len(g.account.layer_weights) - 1))
    if not s.op_offload:
        parts.append("--no-op-offload")
    if g.release.fit == "llama_fit":
        parts.append("--fit off")  # the budget fixed every setting: start exactly that
    parts = [p for p in parts if p]
    return " ".join(parts)
