"""Budgets of the engines other than vLLM: SGLang (its pool accounting) and the GGUF engines
(llama.cpp, Ollama: their buffers). Each answer has the same shape as vLLM's: device budgets,
host RAM and disk, and one ``ServingSummary`` with the engine's own numbers in ``details``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from ..arch import Arch
from ..components import Component
from ..device import DeviceContext, display_note
from ..dtypes import bytes_of
from ..errors import InvalidWorkload
from ..formulas.cuda_context import start_context
from ..host import DEFAULT_DISK
from ..resolve import engine_model, model_name, model_origin, resolve_model
from ..result import (
    Budget,
    CalibrationUse,
    DeployedFormat,
    DeviceBudget,
    KVTokensBand,
    Line,
    OverheadOrigin,
    Phase,
    ServingSummary,
    SGLangDetails,
    StackBehaviour,
    WorkloadSummary,
)
from ..search import largest_true, smallest_true
from ..spec import (
    DiskOptions,
    GGUFOptions,
    LLMServingWorkload,
    ServingQuantization,
    SGLangOptions,
    Software,
)
from ..stack import serving_use
from .calibration import CALIBRATED_VERSION, EngineCalibration, calibration
from .driver import graph_driver_behaviour, graph_driver_factor
from .engine_args import (
    PCIE_DISTRIBUTED_BYTES,
    Fabric,
    gpu_vendor,
    model_dtype,
    pcie_cost,
    serving_format,
    serving_host_and_disk,
    serving_quantization,
    tp_fabric,
)
from .gguf.budget import gguf_details, gguf_devices, gguf_host_and_disk
from .gguf.engine import GGUFAccount, concurrency, gguf_account, launch_command
from .gguf.llamacpp import cpu_moe_flag, unmodelled_compute
from .gguf.releases import gguf_release
from .load import load_memory
from .releases import EngineRelease, engine_release
from .sglang import SGLangAccount, sglang_account, sglang_release

__all__ = ["gguf_budget", "gguf_engine", "sglang_budget", "sglang_engine"]

C = Component


def _field(exc: InvalidWorkload, index: int) -> InvalidWorkload:
    return InvalidWorkload(f"workloads[{index}].{exc.field}", exc.message)


# ------------------------------------------------------------------------------ GGUF engines --


def gguf_engine(
    w: LLMServingWorkload, ctx: DeviceContext, index: int = 0
) -> tuple[EngineRelease, GGUFAccount]:
    try:
        rel = engine_release(w.engine, w.engine_version)
        arch = resolve_model(w.model)
        if arch.kind != "decoder":
            raise InvalidWorkload("model", "llama.cpp serves decoder language models here")
        g = gguf_account(
            w,
            arch,
            ctx.memory_total_bytes,
            ctx.overheads.cuda_context_bytes,
            rel.modelled,
            ctx.memory_in_use_bytes,
        )
    except InvalidWorkload as exc:
        raise _field(exc, index) from None
    return rel, g


def gguf_at_high_hold(w: LLMServingWorkload, ctx: DeviceContext) -> dict[str, int]:
    """The layers and KV cells llama.cpp (or Ollama) keeps on the GPUs beside the high end of
    an assumed hold of other processes (a desktop session's), 0 where it would not start; none
    where the hold is the request's own."""
    high = ctx.at_hold(high=True)
    if high is ctx:
        return {}
    _, g = gguf_engine(w, high)
    if not g.would_start:
        return {"n_gpu_layers_at_high_hold": 0, "n_ctx_at_high_hold": 0}
    return {
        "n_gpu_layers_at_high_hold": g.settings.n_gpu_layers,
        "n_ctx_at_high_hold": g.settings.n_ctx,
    }


def _gguf_remedies(w: LLMServingWorkload, g: GGUFAccount, ctx: DeviceContext) -> tuple[str, ...]:
    if g.would_start:
        return ()
    o = w.gguf if w.gguf is not None else GGUFOptions()
    out: list[str] = []
    arch = resolve_model(w.model)

    def starts(**changes: object) -> GGUFAccount | None:
        w2 = msgspec.structs.replace(w, gguf=msgspec.structs.replace(o, **changes))
        try:
            _, g2 = gguf_engine(w2, ctx)
        except InvalidWorkload:
            return None
        return g2 if g2.would_start else None

    full = arch.num_layers + 1
    # every layer first: a host layer's copies on the GPU (offload_op) can make one layer
    # fewer need more than all of them, so the search below is not monotone at its top
    ngl = (
        full
        if starts(n_gpu_layers=full) is not None
        else largest_true(0, full, lambda n: starts(n_gpu_layers=n) is not None)
    )
    if ngl == full:
        out.append(f"n_gpu_layers {full} (every layer on the GPU fits)")
    elif ngl >= 0 and starts(n_gpu_layers=ngl) is not None:
        out.append(f"n_gpu_layers {ngl} (the most that fit; the rest run on the CPU)")
    n_layer = arch.num_layers
    moe_ok = arch.moe is not None and w.engine == "llama_cpp" and o.n_cpu_moe < n_layer
    if moe_ok and starts(n_cpu_moe=n_layer, n_gpu_layers=full) is not None:
        # the fewest layers whose experts stay in host memory, every layer on the GPU (fewer
        # host experts need more GPU memory: monotone)
        fewest = smallest_true(
            o.n_cpu_moe + 1, n_layer, lambda n: starts(n_cpu_moe=n, n_gpu_layers=full) is not None
        )
        flag = cpu_moe_flag(fewest, n_layer)
        out.append(
            f"n_cpu_moe {fewest} with every layer on the GPU ({flag}: the fewest layers whose "
            "expert weights stay in host memory)"
        )
    n_ctx = g.settings.n_ctx
    best = largest_true(1, max(n_ctx - 1, 1), lambda n: starts(n_ctx=n) is not None)
    if best >= 1 and starts(n_ctx=best) is not None:
        out.append(f"n_ctx {best} (the largest that fits with every layer as set)")
    if o.cache_type_k == "f16":
        fixed = starts(cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on")
        if fixed is not None:
            out.append("cache_type_k / cache_type_v q8_0 with flash attention")
    for ft in _SMALLER.get(o.file_type, ()) if o.tensors is None else ():
        if starts(file_type=ft) is not None:
            out.append(f"file_type {ft} (the largest quantization that fits)")
            break
    if not out:
        out.append("a GPU with more memory, or more GPUs (gguf.devices)")
    return tuple(out)


_LADDER = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ3_M", "Q2_K", "IQ2_M")
_SMALLER: dict[str, tuple[str, ...]] = {
    ft: _LADDER[_LADDER.index(ft) + 1 :] if ft in _LADDER else _LADDER[4:]
    for ft in (
        "F32",
        "BF16",
        *_LADDER,
        "Q5_K_S",
        "Q5_1",
        "Q5_0",
        "Q4_K_S",
        "Q4_1",
        "Q4_0",
        "IQ4_NL",
        "Q3_K_L",
        "Q3_K_S",
        "IQ3_S",
        "IQ3_XS",
        "IQ3_XXS",
        "Q2_K_S",
        "IQ2_S",
        "IQ2_XS",
        "IQ2_XXS",
        "IQ1_M",
        "IQ1_S",
    )
}


def gguf_budget(
    w: LLMServingWorkload,
    ctx: DeviceContext,
    software: Software | None,
    disk_options: DiskOptions = DEFAULT_DISK,
) -> Budget:
    rel, g = gguf_engine(w, ctx)
    arch = resolve_model(w.model)
    devices = gguf_devices(w, g, ctx)
    host, disk = gguf_host_and_disk(g, disk_options)
    s = g.settings
    most = max(range(len(devices)), key=lambda i: _used(devices[i]))
    limiting = g.account.devices[most] if g.account.devices else None
    pool = sum(d.kv_bytes for d in g.account.devices)
    per_token = g.account.kv_bytes_per_cell
    per_request = g.n_ctx_requested
    held = concurrency(g)
    name = model_name(w.model)
    summary = ServingSummary(
        engine=w.engine,
        engine_version=rel.requested,
        modelled_version=rel.modelled,
        version_note=rel.note,
        calibration=f"{g.release.summary} ({g.release.source})",
        requested_memory_bytes=ctx.memory_total_bytes,
        available_kv_cache_bytes=max(
            ctx.capacity_bytes - (g.device_used(most) - (limiting.kv_bytes if limiting else 0)),
            0,
        ),
        kv_cache_pool_bytes=pool,
        kv_cache_bytes_per_token=per_token,
        kv_cache_tokens=s.n_ctx,
        max_model_len=per_request,
        max_concurrency=round(held, 4),
        data_parallel=1,
        max_concurrency_all_replicas=round(held, 4),
        would_start=g.would_start,
        reason=g.reason,
        remedies=_gguf_remedies(w, g, ctx),
        launch=launch_command(w, g, name),
        details=msgspec.structs.replace(gguf_details(w, g), **gguf_at_high_hold(w, ctx)),
    )
    warnings = []
    if g.fitted:
        warnings.append(f"{w.engine} adjusts unset settings to fit: {g.fitted}")
    if s.n_gpu_layers < arch.num_layers + 1:
        warnings.append(
            f"{arch.num_layers + 1 - s.n_gpu_layers} of {arch.num_layers + 1} layers run on the "
            "CPU from host memory: generation is limited by host memory bandwidth"
        )
    warnings += unmodelled_compute(arch, g.account)
    if s.n_cpu_moe and arch.moe is None:
        warnings.append(
            "n_cpu_moe: the model has no expert weights (a dense model); --n-cpu-moe moves nothing"
        )
    elif g.account.host_expert_layers:
        flag = " (--n-cpu-moe)" if w.engine == "llama_cpp" else ""
        copies = (
            "with micro-batches of 32 tokens or more the first GPU copies one expert tensor "
            "at a time into its compute buffer (counted)"
            if s.op_offload
            else "the host runs their matmuls (--no-op-offload)"
        )
        warnings.append(
            f"the expert weights of {g.account.host_expert_layers} layer(s) stay in host "
            f"memory{flag}: generation reads them at host memory bandwidth, and {copies}"
        )
    if (s.type_k != "f16" or s.type_v != "f16") and s.flash_attn:
        warnings.append(
            "quantized KV cache: the compute buffer adds llama.cpp's f16 copies of K and V "
            "(measured up to 23% above the plain formula on the CPU backend)"
        )
    o = w.gguf if w.gguf is not None else GGUFOptions()
    return Budget(
        workloads=(
            WorkloadSummary(
                name=w.name or name,
                kind="llm_serving",
                model_type=arch.model_type,
                num_params=arch.num_params,
                num_layers=arch.num_layers,
                devices_per_instance=s.devices,
                instances=1,
                format=DeployedFormat(
                    weights=o.file_type,
                    compute="f32",
                    quantization=f"GGUF {o.file_type} (llama-quantize recipe)",
                    weights_from="request",
                    quantization_from="request",
                    stored_bytes="computed",
                ),
                model=model_origin(w.model),
            ),
        ),
        device=ctx.summary(),
        devices=devices,
        most_loaded=most,
        total_bytes=devices[most].total_bytes,
        host_ram=host,
        disk=disk,
        warnings=tuple(warnings),
        serving=summary,
        calibration=engine_calibration(devices[most]),
        stack=serving_use(
            w.engine, rel.modelled, software, _gguf_accounting(w.engine, rel.modelled)
        ),
    )


_GGUF_PLACEMENT = {
    "none": "every layer where the GPU-layer count puts it, the context as given: nothing is "
    "sized from the free memory",
    "llama_fit": "--fit (on by default): an unset context, then the GPU layers, are reduced "
    "until every GPU keeps 1 GiB free",
    "ollama_estimate": "Ollama's own memory estimate picks the GPU layers from the free memory",
    "ollama_backend": "Ollama's scheduler picks the GPU layers from the backend's own "
    "allocation sizes and the free memory",
}


def _gguf_accounting(engine: str, version: str) -> StackBehaviour:
    name = "llama.cpp" if engine == "llama_cpp" else "Ollama"
    ollama = " with Ollama's defaults (num_ctx, num_parallel)" if engine == "ollama" else ""
    placement = _GGUF_PLACEMENT[gguf_release(engine, version).fit]
    return StackBehaviour(
        name="engine_accounting",
        assumed=f"{name} {version}'s buffers as its backends allocate them{ollama}: the model "
        "buffer per device for the layers offloaded to it (the rest in host memory), the KV "
        f"buffer at n_ctx, the compute buffer per backend; {placement}",
        source="llama.cpp src/llama-model.cpp, llama-kv-cache.cpp and llama-context.cpp "
        "(vrambudget/core/serving/gguf/ cites file and line; research/llamacpp_accounting.md"
        + ("; research/ollama_accounting.md)" if engine == "ollama" else ")"),
    )


def _used(d: DeviceBudget) -> int:
    return sum(ln.bytes for ln in d.lines if ln.component is not C.HEADROOM)


def engine_calibration(device: DeviceBudget) -> CalibrationUse:
    """Serving budgets take their overheads from the engine release's rules and calibration
    (data/vllm_calibration.json, the engines' own sources), not from probe profiles: each
    line's source says which."""
    sources = {ln.component: ln.source for ln in device.lines}
    return CalibrationUse(
        profile=None,
        matched_on=(),
        overheads=tuple(
            OverheadOrigin(component=c, origin="builtin", profile=None, source=sources[c])
            for c in (
                C.CUDA_CONTEXT,
                C.RUNTIME_WORKSPACE,
                C.COMMUNICATION_BUFFERS,
                C.ALLOCATOR_OVERHEAD,
            )
        ),
    )


# ------------------------------------------------------------------------------------ SGLang --


@dataclass(frozen=True, slots=True)
class _SGLangRun:
    release: EngineRelease
    account: SGLangAccount
    tp: int
    dtype: str
    kv_bytes: int
    context_len: int
    cuda_context: int
    nccl: int
    """The CUDA context and NCCL communicators before SGLang measures free memory. The context
    is the bare context at a process's start on this GPU (on NVIDIA with a catalog SM count,
    :func:`~vrambudget.core.formulas.cuda_context.start_context`, whose line gives an H100
    548,653,699 B, within 0.2% of the 547,608,330 B vLLM 0.19.0's H100 launches were fitted
    to); elsewhere vLLM 0.19.0's calibrated value. NCCL: :func:`sglang_nccl_bytes`."""
    in_use: int = 0
    """Memory other processes hold (the request's device): also gone when SGLang measures."""

    @property
    def baseline(self) -> int:
        return self.cuda_context + self.nccl + self.in_use


def sglang_nccl_bytes(cal: EngineCalibration, tp: int, fabric: Fabric) -> int:
    """Device memory SGLang's distributed start takes before it measures the free memory,
    beyond the CUDA context: vLLM 0.19's NCCL baseline (an upper bound: SGLang sets
    ``NCCL_CUMEM_ENABLE=0`` and NVLS off) where the GPUs are NVLink/NVSwitch-connected; on
    PCIe-only GPUs, where the custom all-reduce is off beyond two GPUs and NCCL's buffers over
    PCIe are small, the most a published launch showed (:data:`PCIE_DISTRIBUTED_BYTES`;
    research/sglang_startup_logs.md)."""
    if tp <= 1:
        return 0
    if pcie_cost(fabric):
        return PCIE_DISTRIBUTED_BYTES
    return round(cal.c("nccl_init_bytes"))


def sglang_engine(w: LLMServingWorkload, ctx: DeviceContext, index: int = 0) -> _SGLangRun:
    try:
        rel = engine_release("sglang", w.engine_version)
        r = sglang_release(rel.modelled)
        arch = resolve_model(w.model)
        if w.parallelism.pipeline != 1 or w.parallelism.data != 1:
            raise InvalidWorkload(
                "parallelism",
                "SGLang is modelled with tensor parallelism only (pipeline 1, data 1)",
            )
        tp = w.parallelism.tensor
        if arch.num_heads % tp:
            raise InvalidWorkload(
                "parallelism.tensor",
                f"must divide the model's {arch.num_heads} attention heads",
            )
        dtype = model_dtype(w)
        kv_bytes = 1 if w.kv_cache_dtype.startswith("fp8") else (4 if dtype == "fp32" else 2)
        weights = _weights_per_rank(w, arch, dtype, tp, cuda=ctx.vendor != "amd")
        context_len = w.max_model_len or arch.max_positions
        o = w.sglang if w.sglang is not None else SGLangOptions()
        cal = calibration(CALIBRATED_VERSION)
        bare = (
            start_context(ctx.sm_count, ctx.compute_capability)
            if ctx.vendor == "nvidia" and ctx.sm_count and ctx.compute_capability
            else None
        )
        context = bare[0] if bare is not None else round(cal.c("cuda_context_bytes"))
        nccl = sglang_nccl_bytes(cal, tp, tp_fabric(ctx.name, w.parallelism.peer_access))
        a = sglang_account(
            arch,
            r,
            ctx.memory_total_bytes,
            context + nccl + ctx.memory_in_use_bytes,
            weights,
            tp,
            kv_bytes,
            context_len,
            o.mem_fraction_static,
            o.chunked_prefill_size,
            o.cuda_graph_max_bs,
            o.disable_cuda_graph,
            o.max_running_requests,
            o.max_total_tokens,
            o.page_size,
            ctx.nvidia_smi_total_mib,
            ctx.vendor != "amd",
        )
    except InvalidWorkload as exc:
        raise _field(exc, index) from None
    return _SGLangRun(
        rel, a, tp, dtype, kv_bytes, context_len, context, nccl, ctx.memory_in_use_bytes
    )


def sglang_kv_band(
    w: LLMServingWorkload, run: _SGLangRun, ctx: DeviceContext, index: int = 0
) -> KVTokensBand | None:
    """The pool's tokens at the high and the low end of what other processes are assumed to
    hold (a desktop session's, :mod:`vrambudget.core.desktop`): SGLang's pool is its fraction
    of the free memory at its start, so the hold moves it directly. None where the hold is the
    request's own (measured) or none."""
    if ctx.in_use_basis is None:
        return None
    more = sglang_engine(w, ctx.at_hold(high=True), index).account
    less = sglang_engine(w, ctx.at_hold(high=False), index).account
    low = more.max_total_num_tokens if more.would_start else 0
    return KVTokensBand(
        low=low,
        high=less.max_total_num_tokens,
        max_concurrency_low=math.floor(low / max(run.context_len, 1) * 10_000) / 10_000,
        basis=f"the pool at the high and the low end of the {ctx.desktop_session} desktop's "
        "assumed hold (SGLang's pool is mem_fraction_static of the memory free at its start)"
        + ("" if more.would_start else "; at the high end SGLang would not start"),
    )


def _weights_per_rank(
    w: LLMServingWorkload, arch: Arch, dtype: str, tp: int, cuda: bool = True
) -> int:
    """What loading puts on one rank: its weight shards and the rotary tables, which every
    rank builds whole. SGLang keeps them in FP32 on CUDA ("cache needs to be in FP32 for
    numerical stability": ``layers/rotary_embedding.py`` ``RotaryEmbedding.__init__`` casts to
    the model dtype only off CUDA, in 0.4.3, 0.4.9 and 0.5.18 alike); the tables' rows follow
    the model's rope as vLLM's do (:func:`~.rope.rotary_cache_bytes`). Llama 3.1 8B: 131,072 x
    128 x 4 = 67,108,864 B, which the RTX 4090 log's "mem usage=15.02 GB" shows above the
    14.96 GiB of parameters.

    As reserved by the caching allocator: SGLang reads the device's free memory before and
    after loading, the cache emptied, and a segment holding a weight is not released, so each
    tensor costs its segment's rounding (:func:`~.load.load_memory`, which replays the
    construction SGLang shares with vLLM). Qwen3-14B over 4 RTX 4090s: 180 MiB a rank beyond
    the tensors, the log's 7.08 GB against 6.90 GiB of tensors and tables."""
    quant = serving_quantization(w)
    return load_memory(arch, bytes_of(dtype), quant, tp, 1, 1, cuda)[0].reserved_bytes


def _sglang_launch(w: LLMServingWorkload, run: _SGLangRun) -> str:
    a = run.account
    o = w.sglang if w.sglang is not None else SGLangOptions()
    parts = [
        "python -m sglang.launch_server",
        f"--model-path {engine_model(w.model)}",
        f"--tp {run.tp}",
        f"--context-length {run.context_len}",
        f"--mem-fraction-static {a.mem_fraction_static:.3f}",
        f"--chunked-prefill-size {a.chunked_prefill_size}",
        f"--cuda-graph-max-bs {a.cuda_graph_max_bs}",
    ]
    if a.max_running_requests > 0:  # none where the engine would not start: no pool to size
        parts.append(f"--max-running-requests {a.max_running_requests}")
    if o.page_size != 1:
        parts.append(f"--page-size {o.page_size}")
    if o.max_total_tokens is not None:
        parts.append(f"--max-total-tokens {o.max_total_tokens}")
    if w.kv_cache_dtype != "auto":
        parts.append(
            f"--kv-cache-dtype {'fp8_e4m3' if w.kv_cache_dtype == 'fp8' else w.kv_cache_dtype}"
        )
    if o.disable_cuda_graph:
        parts.append("--disable-cuda-graph")
    if run.tp > 1 and w.parallelism.peer_access is False:
        parts.append("--disable-custom-all-reduce")  # as budgeted: no IPC buffers
    if w.dtype != "auto":
        parts.append(f"--dtype {w.dtype}")
    q = w.quantization
    if isinstance(q, ServingQuantization):
        parts.append(f"--quantization {'fp8' if q.method.startswith('fp8') else q.method}")
    return " ".join(parts)


def _sglang_remedies(w: LLMServingWorkload, run: _SGLangRun, ctx: DeviceContext) -> tuple[str, ...]:
    if run.account.would_start and run.account.max_total_num_tokens >= run.context_len:
        return ()
    out: list[str] = []
    o = w.sglang if w.sglang is not None else SGLangOptions()

    def ok(w2: LLMServingWorkload) -> bool:
        try:
            r2 = sglang_engine(w2, ctx)
        except InvalidWorkload:
            return False
        return r2.account.would_start and r2.account.max_total_num_tokens >= r2.context_len

    arch = resolve_model(w.model)
    best = largest_true(
        1,
        min(run.context_len - 1, arch.max_positions),
        lambda n: ok(msgspec.structs.replace(w, max_model_len=n)),
    )
    if best >= 1 and ok(msgspec.structs.replace(w, max_model_len=best)):
        out.append(f"lower max_model_len (--context-length) to {best}")
    t = run.tp * 2
    while t <= 8 and arch.num_heads % t == 0:
        w2 = msgspec.structs.replace(
            w, parallelism=msgspec.structs.replace(w.parallelism, tensor=t)
        )
        if ok(w2):
            out.append(f"tensor parallel {t}")
            break
        t *= 2
    if w.kv_cache_dtype == "auto" and ok(msgspec.structs.replace(w, kv_cache_dtype="fp8")):
        out.append("kv_cache_dtype fp8")
    permille = round(run.account.mem_fraction_static * 1000)

    def with_fraction(x: int) -> LLMServingWorkload:
        return msgspec.structs.replace(
            w, sglang=msgspec.structs.replace(o, mem_fraction_static=x / 1000)
        )

    permille = max(permille, 1)
    last_bad = largest_true(permille + 1, 999, lambda x: not ok(with_fraction(x)))
    if permille < last_bad + 1 <= 999 and ok(with_fraction(last_bad + 1)):
        out.append(f"raise mem_fraction_static to {(last_bad + 1) / 1000:.3f}")
    elif permille > 1:
        # too high a fraction leaves no room for the graphs: the largest lower one whose pool
        # still leaves it (monotone in the fraction), if it starts
        def room(x: int) -> bool:
            try:
                a = sglang_engine(with_fraction(x), ctx).account
            except InvalidWorkload:
                return False
            return run.baseline + a.weights_bytes + a.pool_bytes + a.graph_bytes <= (
                ctx.memory_total_bytes
            )

        lower = largest_true(1, permille - 1, room)
        if lower >= 1 and ok(with_fraction(lower)):
            out.append(f"lower mem_fraction_static to {lower / 1000:.3f}")
    if not out:
        out.append("a GPU with more memory, or more GPUs")
    return tuple(out)


def sglang_budget(
    w: LLMServingWorkload,
    ctx: DeviceContext,
    software: Software | None,
    disk_options: DiskOptions = DEFAULT_DISK,
) -> Budget:
    run = sglang_engine(w, ctx)
    a = run.account
    arch = resolve_model(w.model)
    total = ctx.capacity_bytes
    values = {
        C.WEIGHTS: a.weights_bytes,
        C.KV_CACHE: a.pool_bytes,
        C.ACTIVATIONS: a.graph_bytes,
        C.CUDA_CONTEXT: run.cuda_context,
        C.COMMUNICATION_BUFFERS: run.nccl,
    }
    used = sum(values.values())
    values[C.HEADROOM] = max(total - used, 0)
    formulas = {
        C.WEIGHTS: (
            "this rank's weights (TP shards) as SGLang loads them, and the rotary table "
            "(FP32 on CUDA)",
            "SGLang model_runner load_model; layers/rotary_embedding.py; tensor inventory",
        ),
        C.KV_CACHE: (
            "(max_total_num_tokens + page_size) x cell; tokens = (post - pre x (1 - "
            "mem_fraction_static)) // cell, floored to pages",
            "sglang/srt/model_executor/model_runner.py profile_max_num_token",
        ),
        C.ACTIVATIONS: (
            "decode CUDA graphs (2 MiB per captured batch size) + prefill CUDA graphs (8 MiB "
            "per captured size; 1.5 GiB with MLA) + a prefill chunk's working set "
            "(chunked_prefill_size x (2 n_ff / tp + 4 hidden) x 2 B)",
            "sglang/srt/arg_groups/memory_hook.py (0.5.23) for the graphs; the chunk's working "
            "set is vrambudget's estimate; not calibrated on logs",
        ),
        C.CUDA_CONTEXT: (
            "CUDA context and torch before SGLang measures free memory",
            "vLLM-calibrated CUDA context (same torch process start)",
        ),
        C.COMMUNICATION_BUFFERS: (
            "NCCL communicators made before the measurement (TP > 1)",
            "vLLM-calibrated NCCL init",
        ),
        C.HEADROOM: ("device total - everything above", "SGLang mem_fraction_static"),
    }
    lines = []
    for c in Component:
        formula, source = formulas.get(c, ("0 (not used by SGLang)", "-"))
        lines.append(Line(c, values.get(c, 0), formula, (), source))
    device_total = used + values[C.HEADROOM]
    device = DeviceBudget(
        label="every device",
        pipeline_stage=None,
        num_devices=run.tp,
        peak_phase="serving",
        lines=tuple(lines),
        total_bytes=device_total,
        inputs={
            "engine_version": run.release.modelled,
            "mem_fraction_static": a.mem_fraction_static,
            "tensor_parallel": run.tp,
            "context_len": run.context_len,
        },
        phases=(Phase(name="serving", total_bytes=device_total),),
    )
    held = a.max_total_num_tokens / max(run.context_len, 1)
    summary = ServingSummary(
        engine="sglang",
        engine_version=run.release.requested,
        modelled_version=run.release.modelled,
        version_note=run.release.note,
        calibration=f"SGLang {run.release.modelled}: {a.release.summary}; pool from free memory "
        "after the CUDA context (research/sglang_accounting.md)",
        requested_memory_bytes=int(a.free_before * a.mem_fraction_static),
        available_kv_cache_bytes=max(a.rest_bytes, 0),
        kv_cache_pool_bytes=a.pool_bytes,
        kv_cache_bytes_per_token=a.cell_bytes,
        kv_cache_tokens=a.max_total_num_tokens,
        kv_cache_tokens_band=sglang_kv_band(w, run, ctx),
        max_model_len=run.context_len,
        max_concurrency=round(held, 4),
        data_parallel=1,
        max_concurrency_all_replicas=round(held, 4),
        would_start=a.would_start,
        reason=a.reason,
        remedies=_sglang_remedies(w, run, ctx),
        launch=_sglang_launch(w, run),
        details=SGLangDetails(
            mem_fraction_static=a.mem_fraction_static,
            mem_fraction_static_source=a.fraction_source,
            max_total_num_tokens=a.max_total_num_tokens,
            max_running_requests=a.max_running_requests,
            chunked_prefill_size=a.chunked_prefill_size,
            cuda_graph_max_bs=a.cuda_graph_max_bs,
            page_size=a.page_size,
            weights_bytes=a.weights_bytes,
        ),
    )
    host_ram, disk = serving_host_and_disk(w, arch, run.dtype, run.tp, disk=disk_options)
    warnings = [n for n in (display_note(ctx, "SGLang"),) if n]
    if held < 1 and a.would_start:
        warnings.append(
            f"the pool holds {a.max_total_num_tokens} tokens, fewer than one request of "
            f"{run.context_len}"
        )
    return Budget(
        workloads=(
            WorkloadSummary(
                name=w.name or model_name(w.model),
                kind="llm_serving",
                model_type=arch.model_type,
                num_params=arch.num_params,
                num_layers=arch.num_layers,
                devices_per_instance=run.tp,
                instances=1,
                format=serving_format(w, run.dtype),
                model=model_origin(w.model),
            ),
        ),
        device=ctx.summary(),
        devices=(device,),
        most_loaded=0,
        total_bytes=device_total,
        host_ram=host_ram,
        disk=disk,
        warnings=tuple(warnings),
        serving=summary,
        calibration=engine_calibration(device),
        stack=serving_use(
            "sglang",
            run.release.modelled,
            software,
            StackBehaviour(
                name="engine_accounting",
                assumed=f"SGLang {run.release.modelled}'s own memory accounting: the token pool "
                "is mem_fraction_static x the free memory at start, less the weights; the CUDA "
                "graphs and a prefill chunk's activations come out of what is left over",
                source=f"SGLang {run.release.modelled} "
                "python/sglang/srt/model_executor/model_runner.py profile_max_num_token "
                "(vrambudget/core/serving/sglang.py cites each release's lines; "
                "research/sglang_accounting.md)",
            ),
            pinned_torch=None,
            extra=_sglang_driver(software, w, ctx),
        ),
    )


def _sglang_driver(
    software: Software | None, w: LLMServingWorkload, ctx: DeviceContext
) -> tuple[StackBehaviour, ...]:
    """A driver before R550 named for SGLang capturing CUDA graphs on an NVIDIA GPU: said, not
    counted (SGLang's graph memory here is its reserve per captured batch size, not a per-graph
    fit the driver's factor could scale)."""
    driver = software.driver_version if software is not None else None
    graphs = not (w.sglang is not None and w.sglang.disable_cuda_graph)
    if not graphs or graph_driver_factor(driver, gpu_vendor(ctx.name)) == 1.0:
        return ()
    return (graph_driver_behaviour(driver, scaled=False),)
