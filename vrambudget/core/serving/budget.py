"""The answer for an ``llm_serving`` workload: the engine's account as a ``Budget`` (one line
per component per pipeline stage) plus the engine's own summary and, when it would not start,
what to change."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from ..compat.build import stack_build
from ..compat.facts import CUDA_ARCH_MIN, CUDA_FAMILY_MIN_DRIVER, CUDA_TOOLKIT_DRIVER
from ..components import Component
from ..device import DeviceContext, display_note, require_device
from ..errors import InvalidWorkload
from ..host import DEFAULT_DISK
from ..resolve import engine_model, model_name, model_origin, resolve_model
from ..result import (
    Budget,
    DeviceBudget,
    KVTokensBand,
    Line,
    Part,
    Phase,
    ServingSummary,
    StackBehaviour,
    VLLMDetails,
    WorkloadSummary,
)
from ..search import largest_true
from ..spec import (
    GGUF_ENGINES,
    DeviceRef,
    DiskOptions,
    LLMServingWorkload,
    Software,
    Workload,
)
from ..stack import serving_use, version_tuple
from ..units import GiB
from . import kv
from .driver import (
    OLD_DRIVER_BELOW,
    OLD_DRIVER_EXAMPLE,
    OLD_DRIVER_GRAPH_FACTOR,
    graph_driver_behaviour,
)
from .engine_args import (
    Resolved,
    gpu_vendor,
    quantization_words,
    serving_format,
    serving_host_and_disk,
    serving_quantization,
)
from .engines_budget import engine_calibration, gguf_budget, sglang_budget
from .releases import engine_release, vllm_pinned_torch
from .speculative import launch_json
from .vllm import (
    ServingAccount,
    StageAccount,
    account,
    free_at_start,
    kv_band,
    utilization,
)

__all__ = [
    "device_kv_band",
    "held_accounts",
    "remedies",
    "serving_account",
    "serving_budget",
    "stage_values",
]

C = Component

_SRC_SNAPSHOT = "vllm/v1/worker/gpu_worker.py determine_available_memory; vllm/utils/mem_utils.py"
_FORMULAS: dict[Component, tuple[str, str, tuple[str, ...]]] = {
    C.WEIGHTS: (
        (
            "tensors on the GPU (TP shards, PP stage: embeddings first, LM head last) x "
            "bytes(dtype) + the rotary cos/sin cache (max_positions x rotary_dim x e)"
        ),
        (
            "tensor inventory of transformers modeling_<family>.py; vLLM "
            "QKVParallelLinear / VocabParallelEmbedding / get_pp_indices / RotaryEmbedding"
        ),
        ("dtype", "quantization", "tensor_parallel", "pipeline_parallel"),
    ),
    C.QUANTIZATION_METADATA: (
        "scales and zero points of the quantized linear layers",
        "vLLM Fp8LinearMethod, compressed-tensors, GPTQ/AWQ (Marlin)",
        ("quantization",),
    ),
    C.KV_CACHE: (
        (
            "num_gpu_blocks x page_size x layers per group; num_gpu_blocks = min over "
            "stages of available // page_size // layers per group"
        ),
        "vllm/v1/core/kv_cache_utils.py get_num_blocks, get_kv_cache_config_from_groups",
        ("gpu_memory_utilization", "block_size", "kv_cache_dtype", "tensor_parallel"),
    ),
    C.ACTIVATIONS: (
        (
            "torch peak of profile_run: max(forward working set of "
            "max_num_batched_tokens, sampler over max_num_seqs x vocab + MoE workspace)"
        ),
        ("vllm/v1/worker/gpu_model_runner.py profile_run; calibrated (see calibration)"),
        ("max_num_batched_tokens", "max_num_seqs"),
    ),
    C.CUDA_CONTEXT: (
        (
            "CUDA context before the engine's snapshot + the non-torch increase of a "
            "single GPU (cuBLAS, attention workspaces)"
        ),
        _SRC_SNAPSHOT + "; calibrated",
        (),
    ),
    C.RUNTIME_WORKSPACE: (
        (
            "CUDA graphs: (base + per_layer x layers on the stage) per graph x the graphs "
            "the release captures (a piecewise graph per capture size, up to min(2 x "
            "max_num_seqs, 512) and max_num_batched_tokens; a FULL decode graph per size up "
            "to max_num_seqs from 0.11); 0 with enforce_eager"
            "; + MLA models: 128 MiB per MLA backend module that allocates a "
            "workspace when imported (counted in vLLM's weights memory)"
        ),
        (
            "vllm compile_or_warm_up_model / capture_model; config/vllm.py "
            "_set_cudagraph_sizes, v1/cudagraph_dispatcher.py; calibrated per graph; vllm "
            "0.19.0 v1/attention/backends/mla/flashinfer_mla.py g_fi_workspace, "
            "cutlass_mla.py g_sm100_workspace"
        ),
        ("enforce_eager",),
    ),
    C.ALLOCATOR_OVERHEAD: (
        (
            "caching-allocator blocks of the parameters beyond their bytes "
            "(a segment's remainder of 1 MiB or less is not split): the "
            "parameters replayed in vLLM's construction order through the "
            "allocator model; counted in vLLM's weights memory"
        ),
        (
            "vllm/utils/mem_utils.py DeviceMemoryProfiler (allocated bytes); "
            "c10/cuda/CUDACachingAllocator.cpp should_split"
        ),
        ("dtype", "tensor_parallel", "pipeline_parallel"),
    ),
    C.COMMUNICATION_BUFFERS: (
        (
            "NCCL communicators made before the snapshot + the non-torch "
            "increase that tensor / pipeline parallelism adds (custom "
            "all-reduce, NCCL buffers)"
        ),
        _SRC_SNAPSHOT + "; calibrated",
        ("tensor_parallel", "pipeline_parallel"),
    ),
    C.HEADROOM: (
        (
            "device total - everything above: what the engine leaves unused ((1 - "
            "gpu_memory_utilization) x total minus the memory outside its accounting, plus "
            "the KV budget below one block)"
        ),
        "vLLM gpu_memory_utilization",
        ("gpu_memory_utilization",),
    ),
}
_UNUSED = ("0 (not used by a serving engine)", "-", ())


def serving_account(
    w: LLMServingWorkload,
    memory_total_bytes: int,
    gpu_name: str,
    index: int = 0,
    in_use: int = 0,
    driver: str | None = None,
) -> ServingAccount:
    """``account`` with errors naming ``workloads[index].<field>``."""
    try:
        return account(w, resolve_model(w.model), memory_total_bytes, gpu_name, in_use, driver)
    except InvalidWorkload as exc:
        raise InvalidWorkload(f"workloads[{index}].{exc.field}", exc.message) from None


def held_accounts(
    w: LLMServingWorkload, ctx: DeviceContext, index: int = 0, driver: str | None = None
) -> tuple[ServingAccount, ServingAccount] | None:
    """The accounts beside the high and the low end of what other processes are assumed to hold
    on ``ctx`` (a desktop session's, :mod:`vrambudget.core.desktop`); None where the hold is
    the request's own (measured) or none."""
    if ctx.in_use_basis is None:
        return None
    total, name = ctx.memory_total_bytes, ctx.name
    high, low = ctx.at_hold(high=True), ctx.at_hold(high=False)
    return (
        serving_account(w, total, name, index, high.memory_in_use_bytes, driver),
        serving_account(w, total, name, index, low.memory_in_use_bytes, driver),
    )


def device_kv_band(
    w: LLMServingWorkload,
    a: ServingAccount,
    ctx: DeviceContext,
    held: tuple[ServingAccount, ServingAccount] | None,
    old: OldDriver | None = None,
) -> KVTokensBand | None:
    """``kv_band`` of ``a`` on ``ctx``, reaching ``held`` (:func:`held_accounts`) and ``old``
    (:func:`old_driver_band`: the pool under a driver before R550 that the build can run, at
    the hold's high end where there is one), which the low end takes."""
    hold = f"the {ctx.desktop_session} desktop's assumed hold"
    if old is None:
        if held is None:
            return kv_band(w, a, ctx.name)
        words = f"the low end at the high end of {hold}, the high end at its low end" + (
            "" if held[0].would_start else " (at the high end vLLM would not start)"
        )
        return kv_band(w, a, ctx.name, (*held, words))
    driver = (
        f"under a driver before R{OLD_DRIVER_BELOW}, which {old.build_words} can run (no "
        f"driver named), whose CUDA graphs take {OLD_DRIVER_GRAPH_FACTOR}x the memory"
    )
    if held is None:
        less, words = a, f"the low end {driver}"
        failed = " (under that driver vLLM would not start)"
    else:
        less = held[1]
        words = f"the low end at the high end of {hold} and {driver}, the high end at its low end"
        failed = " (beside that hold and under that driver vLLM would not start)"
    if not old.account.would_start:
        words += failed
    return kv_band(w, a, ctx.name, (old.account, less, words))


class OldDriver(msgspec.Struct, frozen=True):
    """A vLLM account under a driver before R550 (:data:`~.driver.OLD_DRIVER_EXAMPLE`), for an
    answer whose driver is not named but whose build runs on such a driver."""

    account: ServingAccount
    build_words: str
    """The build as the answer names it: ``this CUDA 12.8 build (torch 2.10's PyPI wheel; ...)``"""


def unnamed_driver_build(
    software: Software | None, version: str, ctx: DeviceContext
) -> tuple[str, int] | None:
    """For a request that names no NVIDIA driver: (what sets the oldest driver that can run
    the launch, in the answer's words; that driver's branch). The build's CUDA sets it (525 for
    12.x by minor-version compatibility, 580 for 13.x), or the GPU where its architecture needs
    a newer one (Blackwell: CUDA 12.8's 570). None where a driver is named, the GPU is AMD's or
    the build's CUDA is not known."""
    if software is not None and software.driver_version is not None:
        return None
    if gpu_vendor(ctx.name) == "amd":  # as the account reads it (a custom device by name)
        return None
    build = stack_build("vllm", version, software)
    if build.cuda is None or build.cuda[0] not in CUDA_FAMILY_MIN_DRIVER:
        return None
    basis = "software.cuda_version" if build.cuda_basis == "named" else build.cuda_basis
    words = f"this CUDA {build.cuda[0]}.{build.cuda[1]} build ({basis})"
    minimum = CUDA_FAMILY_MIN_DRIVER[build.cuda[0]]
    cc = version_tuple(ctx.compute_capability or "")
    if cc and cc[0] in CUDA_ARCH_MIN:
        cuda = CUDA_ARCH_MIN[cc[0]][0]
        own = version_tuple(CUDA_TOOLKIT_DRIVER.get(cuda, ""))
        if own and own[0] > minimum:
            arch = f"compute capability {ctx.compute_capability}"
            words = f"{ctx.name} ({arch}: CUDA {cuda[0]}.{cuda[1]} or later)"
            minimum = own[0]
    return words, minimum


def old_driver(
    w: LLMServingWorkload,
    a: ServingAccount,
    ctx: DeviceContext,
    software: Software | None,
    version: str,
    in_use: int | None = None,
) -> OldDriver | None:
    """The account under a driver before R550 (beside ``in_use`` bytes of other processes;
    default: the device's) where the request names no driver, vLLM captures CUDA graphs on an
    NVIDIA GPU, and the launch can run on such a driver (:func:`unnamed_driver_build`). None
    otherwise."""
    if w.enforce_eager or a.resolved.cuda_graphs == 0:
        return None
    build = unnamed_driver_build(software, version, ctx)
    if build is None or build[1] >= OLD_DRIVER_BELOW:
        return None
    held = ctx.memory_in_use_bytes if in_use is None else in_use
    old = serving_account(w, ctx.memory_total_bytes, ctx.name, 0, held, OLD_DRIVER_EXAMPLE)
    return OldDriver(old, build[0])


def old_driver_band(
    w: LLMServingWorkload,
    a: ServingAccount,
    ctx: DeviceContext,
    software: Software | None,
    version: str,
    old: OldDriver | None = None,
) -> OldDriver | None:
    """What the KV band's low end takes of a driver before R550 (:func:`old_driver`): the pool
    under one, beside the high end of an assumed hold where there is one; None where vLLM's
    budget does not hold the graphs (before 0.20, or ``--kv-cache-memory``: the pool is not
    moved) or no such driver can run the launch. ``old``: the account already made beside the
    device's own hold (the budget's), reused where there is no assumed hold."""
    if not a.resolved.cal.cudagraph_in_budget or w.kv_cache_memory_bytes is not None:
        return None
    if ctx.in_use_basis is None:
        return old if old is not None else old_driver(w, a, ctx, software, version)
    in_use = ctx.at_hold(high=True).memory_in_use_bytes
    return old_driver(w, a, ctx, software, version, in_use)


def _high_hold_remedies(
    w: LLMServingWorkload,
    a: ServingAccount,
    ctx: DeviceContext,
    held: tuple[ServingAccount, ServingAccount] | None,
    driver: str | None = None,
) -> tuple[str, ...]:
    """For an engine that starts beside an assumed hold's median but not beside its high end
    (``held``, :func:`held_accounts`): what would make it start there too."""
    if held is None or not a.would_start or held[0].would_start:
        return ()
    total, name = ctx.memory_total_bytes, ctx.name
    in_use = ctx.at_hold(high=True).memory_in_use_bytes
    return tuple(
        f"to start beside the high end of the desktop's assumed hold ({in_use} bytes): {r}"
        for r in remedies(w, held[0], total, name, in_use, driver)
    )


def _starts(
    w: LLMServingWorkload,
    total: int,
    name: str,
    in_use: int,
    driver: str | None,
    **changes: Any,
) -> ServingAccount | None:
    try:
        a = account(
            msgspec.structs.replace(w, **changes),
            resolve_model(w.model),
            total,
            name,
            in_use,
            driver,
        )
    except InvalidWorkload:
        return None
    return a if a.would_start else None


def remedies(
    w: LLMServingWorkload,
    a: ServingAccount,
    total: int,
    name: str,
    in_use: int = 0,
    driver: str | None = None,
) -> tuple[str, ...]:
    """What would make a refused engine start, each checked by re-running the account (under
    the same NVIDIA ``driver``)."""
    if a.would_start:
        return ()
    arch = resolve_model(w.model)
    out: list[str] = []
    mml = a.resolved.max_model_len
    cap = min(mml - 1, arch.max_positions)
    best = largest_true(
        1, cap, lambda x: _starts(w, total, name, in_use, driver, max_model_len=x) is not None
    )
    if best >= 1:
        out.append(f"lower max_model_len to {best} (the largest that starts)")
    # a smaller token budget per step shrinks the profile run's activation peak (and, for a
    # MoE model over data-parallel replicas, the gathered rows); max_num_seqs may not exceed it
    r = a.resolved
    tokens = largest_true(
        1,
        r.max_num_batched_tokens - 1,
        lambda x: (
            _starts(
                w,
                total,
                name,
                in_use,
                driver,
                max_num_batched_tokens=x,
                max_num_seqs=min(r.max_num_seqs, x),
            )
            is not None
        ),
    )
    if tokens >= 1:
        seqs = min(r.max_num_seqs, tokens)
        also = f", max_num_seqs {seqs}" if seqs < r.max_num_seqs else ""
        out.append(f"lower max_num_batched_tokens to {tokens} (the largest that starts{also})")
    permille = round(utilization(w, a.resolved) * 1000)
    # the largest share the free memory at start allows (vLLM refuses any more while other
    # processes hold memory): the search for a higher one stays below it, where starting is
    # monotone in the share
    free = free_at_start(total, in_use, a.stages[0])
    ceiling = min(free * 1000 // total, 1000) if in_use else 1000
    util = largest_true(
        permille + 1,
        ceiling,
        lambda x: _starts(w, total, name, in_use, driver, gpu_memory_utilization=x / 1000) is None,
    )  # last that still fails
    if permille < util + 1 <= ceiling and _starts(
        w, total, name, in_use, driver, gpu_memory_utilization=(util + 1) / 1000
    ):
        out.append(f"raise gpu_memory_utilization to {(util + 1) / 1000:.3f}")
    if in_use:
        # memory other processes hold refuses a share vLLM cannot get free: the largest share
        # the free memory at start allows, if the engine starts with it
        # (just below the ceiling the graphs outside the budget may not fit: step down, at
        # most 0.2, to the first share that starts)
        lower = min(ceiling, permille - 1)
        for x in range(lower, max(lower - 200, 0), -1):
            if _starts(w, total, name, in_use, driver, gpu_memory_utilization=x / 1000):
                out.append(f"lower gpu_memory_utilization to {x / 1000:.3f}")
                break
    par = w.parallelism
    t = par.tensor * 2
    while t <= max(8, par.tensor) and t <= arch.num_heads:
        fixed = _starts(
            w, total, name, in_use, driver, parallelism=msgspec.structs.replace(par, tensor=t)
        )
        if fixed is not None:
            out.append(
                f"tensor parallel {t} ({fixed.kv_tokens} KV tokens, max "
                f"concurrency {fixed.max_concurrency:.2f}x)"
            )
            break
        t *= 2
    if w.kv_cache_dtype == "auto":
        fixed = _starts(w, total, name, in_use, driver, kv_cache_dtype="fp8")
        if fixed is not None:
            out.append(f"kv_cache_dtype fp8 ({fixed.kv_tokens} KV tokens)")
    if not out:
        out.append("a GPU with more memory, or more GPUs: no single change here makes it start")
    return tuple(out)


def _inputs(w: LLMServingWorkload, a: ServingAccount) -> dict[str, Any]:
    r = a.resolved
    return {
        "engine_version": engine_release("vllm", w.engine_version).modelled,
        "dtype": r.dtype,
        "kv_cache_dtype": w.kv_cache_dtype,
        "quantization": quantization_words(w),
        "tensor_parallel": r.tensor,
        "pipeline_parallel": r.pipeline,
        "data_parallel": r.data,
        "gpu_memory_utilization": utilization(w, a.resolved),
        "max_model_len": r.max_model_len,
        "max_num_seqs": r.max_num_seqs,
        "max_num_batched_tokens": r.max_num_batched_tokens,
        "block_size": r.block_size,
        "enforce_eager": w.enforce_eager,
    }


def stage_values(s: StageAccount, pool: int) -> dict[Component, int]:
    """One stage's GPU by component (headroom excluded), ``pool`` its KV-cache bytes."""
    return {
        C.WEIGHTS: s.weights_bytes + s.draft_weights_bytes,
        C.QUANTIZATION_METADATA: s.metadata_bytes,
        C.KV_CACHE: pool,
        C.ACTIVATIONS: s.activation_bytes,
        C.CUDA_CONTEXT: s.cuda_context_bytes + s.non_torch_bytes - s.non_torch_comm_bytes,
        C.RUNTIME_WORKSPACE: s.cuda_graph_bytes + s.load_workspace_bytes,
        C.COMMUNICATION_BUFFERS: s.nccl_init_bytes + s.non_torch_comm_bytes,
        C.ALLOCATOR_OVERHEAD: s.load_rounding_bytes,
    }


def vllm_launch(w: LLMServingWorkload, a: ServingAccount) -> str:
    """``vllm serve`` with every setting the budget assumed."""
    r = a.resolved
    parts = [
        "vllm serve",
        engine_model(w.model),
        f"--tensor-parallel-size {r.tensor}",
        f"--gpu-memory-utilization {utilization(w, r):g}",
        f"--max-model-len {r.max_model_len}",
        f"--max-num-seqs {r.max_num_seqs}",
        f"--max-num-batched-tokens {r.max_num_batched_tokens}",
        f"--block-size {r.block_size}",
    ]
    if r.pipeline > 1:
        parts.append(f"--pipeline-parallel-size {r.pipeline}")
    if r.data > 1:
        parts.append(f"--data-parallel-size {r.data}")
    if w.parallelism.enable_expert_parallel:
        parts.append("--enable-expert-parallel")
    if r.tensor > 1 and w.parallelism.peer_access is False:
        parts.append("--disable-custom-all-reduce")  # as budgeted: no IPC buffers
    if w.dtype != "auto":
        parts.append(f"--dtype {w.dtype}")
    if w.kv_cache_dtype != "auto":
        parts.append(f"--kv-cache-dtype {w.kv_cache_dtype}")
    if w.enforce_eager:
        parts.append("--enforce-eager")
    if w.disable_hybrid_kv_cache_manager:
        parts.append("--disable-hybrid-kv-cache-manager")
    if w.kv_cache_memory_bytes is not None:
        parts.append(f"--kv-cache-memory {w.kv_cache_memory_bytes}")
    if w.speculative is not None:
        draft = w.speculative.model
        config = launch_json(w.speculative, engine_model(draft) if draft is not None else None)
        parts.append(f"--speculative-config '{config}'")
    if w.flashinfer_sampler is not None:
        parts.insert(0, f"VLLM_USE_FLASHINFER_SAMPLER={int(w.flashinfer_sampler)}")
    if w.quantization is not UNSET and w.quantization is not None:
        q = w.quantization.method
        parts.append(f"--quantization {'fp8' if q.startswith('fp8') else q}")
    return " ".join(parts)


def serving_budget(
    workloads: tuple[Workload, ...],
    device: DeviceRef | None,
    software: Software | None = None,
    disk: DiskOptions = DEFAULT_DISK,
) -> Budget:
    if len(workloads) != 1:
        raise InvalidWorkload("workloads", "an llm_serving workload must be the only workload")
    w = workloads[0]
    assert isinstance(w, LLMServingWorkload)
    ctx = require_device(device, "an llm_serving workload needs a device")
    if w.engine == "sglang":
        return sglang_budget(w, ctx, software, disk)
    if w.engine in GGUF_ENGINES:
        return gguf_budget(w, ctx, software, disk)
    total, gpu_name, summary_device = ctx.memory_total_bytes, ctx.name, ctx.summary()
    in_use = ctx.memory_in_use_bytes
    driver = software.driver_version if software is not None else None
    a = serving_account(w, total, gpu_name, in_use=in_use, driver=driver)
    held = held_accounts(w, ctx, driver=driver)
    arch = resolve_model(w.model)
    inputs = _inputs(w, a)
    r_version = engine_release("vllm", w.engine_version).modelled
    requested = engine_release("vllm", w.engine_version).requested
    old = old_driver(w, a, ctx, software, requested)  # what the words and warning say
    # what the KV band's low end takes: the pool, where vLLM's budget holds it
    old_band = None if old is None else old_driver_band(w, a, ctx, software, requested, old)
    devices = []
    for s in a.stages:
        values = stage_values(s, a.pool_bytes(s) if s.available_bytes > 0 else 0)
        used = sum(values.values())
        values[C.HEADROOM] = max(total - in_use - used, 0)
        parts = {
            C.WEIGHTS: (
                ("parameters", s.weights_bytes - s.rotary_bytes),
                ("rotary cos/sin cache", s.rotary_bytes),
                *s.draft_parts,
            ),
            C.CUDA_CONTEXT: (
                ("CUDA context (before the engine's snapshot)", s.cuda_context_bytes),
                ("non-torch increase during profiling", s.non_torch_bytes - s.non_torch_comm_bytes),
            ),
            C.COMMUNICATION_BUFFERS: (
                ("NCCL communicators (before the snapshot)", s.nccl_init_bytes),
                ("non-torch increase from TP / PP", s.non_torch_comm_bytes),
            ),
            C.RUNTIME_WORKSPACE: (
                (
                    f"CUDA graphs ({a.resolved.cuda_graphs} captured: piecewise + FULL decode"
                    f"{_driver_words(a.resolved)})"
                    if s.cuda_graph_bytes
                    else "CUDA graphs",
                    s.cuda_graph_bytes - s.draft_graph_bytes,
                ),
                (
                    f"the drafter's CUDA graphs ({a.resolved.cuda_graphs}, one per captured size)",
                    s.draft_graph_bytes,
                ),
                (
                    "MLA backend workspaces allocated at import (in the weights memory vLLM logs)",
                    s.load_workspace_bytes,
                ),
            ),
        }
        lines = []
        for c in Component:
            formula, source, names = _FORMULAS.get(c, _UNUSED)
            if (
                c
                in (
                    C.KV_CACHE,
                    C.ACTIVATIONS,
                    C.CUDA_CONTEXT,
                    C.RUNTIME_WORKSPACE,
                    C.COMMUNICATION_BUFFERS,
                    C.ALLOCATOR_OVERHEAD,
                )
                and source != "-"
            ):
                source = f"{source}; engine {r_version}"
            p = tuple(Part(name=n, bytes=b) for n, b in parts.get(c, ()) if b)
            lines.append(Line(c, values.get(c, 0), formula, names, source, p))
        label = "every device" if len(a.stages) == 1 else f"pipeline stage {s.stage}"
        device_total = used + values[C.HEADROOM]
        devices.append(
            DeviceBudget(
                label=label,
                pipeline_stage=s.stage,
                num_devices=a.resolved.tensor * a.resolved.data,
                peak_phase="serving",
                lines=tuple(lines),
                total_bytes=device_total,
                inputs={
                    **inputs,
                    "available_kv_cache_bytes": s.available_bytes,
                    "requested_memory_bytes": s.requested_bytes,
                },
                phases=(Phase(name="serving", total_bytes=device_total),),
            )
        )
    most = max(
        range(len(devices)),
        key=lambda i: (
            devices[i].total_bytes - {ln.component: ln.bytes for ln in devices[i].lines}[C.HEADROOM]
        ),
    )
    limiting = min(a.stages, key=lambda s: s.available_bytes)
    warnings = [n for n in (display_note(ctx, "vLLM"),) if n]
    if sum(v.bytes for v in devices[most].lines if v.component is not C.HEADROOM) > total - in_use:
        warnings.append(
            "the memory outside the engine's accounting (CUDA context, NCCL, CUDA "
            "graphs) exceeds what gpu_memory_utilization leaves free: expect an "
            "out-of-memory error while capturing CUDA graphs"
        )
    elif old is not None and a.would_start and not old.account.would_start:
        warnings.append(
            f"with an NVIDIA driver before R{OLD_DRIVER_BELOW}, which {old.build_words} runs, "
            f"vLLM would not start: {old.account.reason}; name software.driver_version"
        )
    if serving_quantization(w) is None and w.dtype == "float32":
        warnings.append(
            "float32 serving: activation peak calibrated on bfloat16 runs "
            "(under-estimated by ~12% in the one float32 run)"
        )
    r = a.resolved
    rel = engine_release("vllm", w.engine_version)
    serving = ServingSummary(
        engine=w.engine,
        engine_version=rel.requested,
        modelled_version=rel.modelled,
        version_note=rel.note,
        calibration=r.cal.description,
        requested_memory_bytes=limiting.requested_bytes,
        available_kv_cache_bytes=limiting.available_bytes,
        kv_cache_pool_bytes=a.pool_bytes(limiting) if limiting.available_bytes > 0 else 0,
        kv_cache_bytes_per_token=kv.per_token_bytes(
            kv.layer_specs(arch, r.tensor, r.kv_bytes)[
                slice(*a.groups.stage_layers[limiting.stage])
            ]
        ),
        kv_cache_tokens=a.kv_tokens,
        kv_cache_tokens_band=device_kv_band(w, a, ctx, held, old_band),
        max_model_len=r.max_model_len,
        max_concurrency=round(a.max_concurrency, 4),
        data_parallel=r.data,
        max_concurrency_all_replicas=round(a.max_concurrency * r.data, 4),
        would_start=a.would_start,
        reason=a.reason,
        remedies=remedies(w, a, total, gpu_name, in_use, driver)
        or _high_hold_remedies(w, a, ctx, held, driver),
        launch=vllm_launch(w, a),
        details=VLLMDetails(
            gpu_memory_utilization=utilization(w, r),
            num_gpu_blocks=a.num_blocks,
            block_size=r.block_size,
            num_kv_cache_groups=a.groups.num_groups,
            max_num_seqs=r.max_num_seqs,
            max_num_batched_tokens=r.max_num_batched_tokens,
            cudagraph_memory="estimated" if r.cal.cudagraph_in_budget else "outside",
            kv_cache_memory_bytes=w.kv_cache_memory_bytes,
        ),
    )
    host_ram, disk_budget = serving_host_and_disk(
        w, arch, r.dtype, r.tensor, r.pipeline, r.data, disk
    )
    return Budget(
        workloads=(
            WorkloadSummary(
                name=w.name or model_name(w.model),
                kind="llm_serving",
                model_type=arch.model_type,
                num_params=arch.num_params,
                num_layers=arch.num_layers,
                devices_per_instance=w.parallelism.devices,
                instances=1,
                format=serving_format(w, r.dtype),
                model=model_origin(w.model),
            ),
        ),
        device=summary_device,
        devices=tuple(devices),
        most_loaded=most,
        total_bytes=devices[most].total_bytes,
        host_ram=host_ram,
        disk=disk_budget,
        warnings=tuple(warnings),
        serving=serving,
        calibration=engine_calibration(devices[most]),
        stack=serving_use(
            w.engine,
            rel.modelled,
            software,
            _vllm_accounting(w, rel.modelled, r),
            pin[1] if (pin := vllm_pinned_torch(rel.modelled)) else None,
            (
                _sampler_behaviour(w, r),
                *_graph_driver(w, a, software, requested, ctx, old),
                *_speculative(w),
            ),
        ),
    )


_SAMPLER_ASSUMED = {
    "flashinfer_if_installed": "the profile's warm-up sampler sorts the vocabulary for top-k / "
    "top-p (torch.sort: 36 B per row x vocabulary element beyond the logits), as without the "
    "optional flashinfer package (pip install vllm); vLLM's Docker image has flashinfer and "
    "skips the sort (the KV band's high end)",
    "torch_sort": "the profile's warm-up sampler sorts the vocabulary for top-k / top-p "
    "(torch.sort: 36 B per row x vocabulary element beyond the logits; FlashInfer only with "
    "VLLM_USE_FLASHINFER_SAMPLER=1)",
    "triton": "the profile's warm-up sampler filters top-k / top-p with a Triton kernel, no sort "
    "(bytes per row x vocabulary element fitted on 0.19.0 launches)",
}


_SPECULATIVE_ASSUMED = {
    "ngram": "the n-gram drafter matches the prompt's tokens on the CPU: no device memory",
    "eagle": "the EAGLE head shares the target's embedding and LM head; its decoder layers "
    "(tensor-parallel like the target's) and its fc (2 x hidden -> hidden, replicated) load "
    "with the target on the last pipeline stage, its attention layers cache K and V in the "
    "target's pool (one more page per block and layer), and it captures a piecewise CUDA "
    "graph at every size the target does (counted with the target's per-graph fit); its "
    "profile-run forward stays below the target's peak",
    "eagle3": "the EAGLE-3 head shares the target's embedding (on one pipeline stage) and "
    "keeps its own LM head over its draft vocabulary; its one decoder layer (qkv over twice "
    "the width, a hidden_norm), fc (three target hidden states -> hidden), final norm and "
    "draft-to-target token map load with the target on the last pipeline stage, its attention "
    "layer caches K and V in the target's pool, and it captures a piecewise CUDA graph at "
    "every size the target does (counted with the target's per-graph fit)",
    "mtp": "the target's multi-token-prediction module(s) load with it on the last pipeline "
    "stage: per module a decoder layer of the target's last kind (quantized and split as the "
    "target's), eh_proj (2 x hidden -> hidden, replicated), three norms and its own LM head; "
    "the embedding is the target's (on one stage); its attention caches in the target's pool, "
    "and it captures a piecewise CUDA graph at every size the target does (counted with the "
    "target's per-graph fit)",
    "draft_model": "the draft model loads whole (its own embedding and head, the target's "
    "tensor-parallel size) on the last pipeline stage, its attention layers cache K and V in "
    "the target's pool (one more page per block and layer), and it captures a piecewise CUDA "
    "graph at every size the target does (counted with the target's per-graph fit); its "
    "profile-run forward stays below the target's peak",
}


def _speculative(w: LLMServingWorkload) -> tuple[StackBehaviour, ...]:
    if w.speculative is None:
        return ()
    return (
        StackBehaviour(
            name="speculative_decoding",
            assumed=_SPECULATIVE_ASSUMED[w.speculative.method],
            source="vllm/v1/worker/gpu_model_runner.py (the drafter on the last PP rank, "
            "loaded inside the 'Model loading took' profiler; its dummy_run in "
            "capture_model), v1/spec_decode/eagle.py load_model (shared embedding and LM "
            "head), v1/spec_decode/draft_model.py (0.15 on: nothing shared, the target's "
            "TP), model_executor/models/llama_eagle.py, llama_eagle3.py and deepseek_mtp.py "
            "(layers, fc, LM heads): 0.10.1, 0.15.0, 0.26.0, 0.34.0 "
            "(vrambudget/core/serving/speculative.py)",
        ),
    )


def _vllm_accounting(w: LLMServingWorkload, version: str, r: Resolved) -> StackBehaviour:
    """How the release sizes its KV pool, in its own terms."""
    if w.kv_cache_memory_bytes is not None:
        how = (
            "--kv-cache-memory: the KV pool is the size given, not what "
            "gpu_memory_utilization leaves"
        )
    elif r.cal.extensible_kv_cache:
        how = (
            "the extensible KV cache, sized after warm-up and CUDA-graph capture: min(requested "
            "- what stays allocated, free - max(1 GiB (3 GiB on ROCm), 0.75 x the profile run's "
            "peak)) - that peak"
        )
    elif r.cal.cudagraph_in_budget:
        how = (
            "the weights, the profile run's activation peak, the non-torch memory and vLLM's "
            "estimate of the CUDA graphs come out of gpu_memory_utilization x total; the KV pool "
            "is what is left"
        )
    else:
        how = (
            "the weights, the profile run's activation peak and the non-torch memory come out "
            "of gpu_memory_utilization x total, the KV pool is what is left; the CUDA graphs "
            "are captured afterwards, outside it"
        )
    return StackBehaviour(
        name="engine_accounting",
        assumed=f"vLLM {version}'s own memory accounting: {how}",
        source=f"vLLM {version} vllm/v1/worker/gpu_worker.py determine_available_memory and "
        "the model runner's profile_run (vrambudget/core/serving/vllm.py cites file and line; "
        "research/vllm_accounting.md)",
    )


def _driver_words(r: Resolved) -> str:
    return "" if r.graph_factor == 1.0 else f"; x{r.graph_factor} for a driver before R550"


def _graph_driver(
    w: LLMServingWorkload,
    a: ServingAccount,
    software: Software | None,
    version: str,
    ctx: DeviceContext,
    old: OldDriver | None,
) -> tuple[StackBehaviour, ...]:
    """The NVIDIA driver's share in the CUDA-graph memory, where the engine captures graphs
    on an NVIDIA GPU; without a driver named, what sets the oldest driver that can run the
    launch and what one before R550 (``old``) would change."""
    r = a.resolved
    if w.enforce_eager or r.cuda_graphs == 0 or gpu_vendor(ctx.name) == "amd":
        return ()
    driver = software.driver_version if software is not None else None
    build = unnamed_driver_build(software, version, ctx)
    if build is None:
        return (graph_driver_behaviour(driver, r.graph_factor),)
    shift = _old_driver_shift(w, a, old) if old is not None and a.would_start else None
    return (graph_driver_behaviour(None, 1.0, unnamed=(*build, shift)),)


def _old_driver_shift(w: LLMServingWorkload, a: ServingAccount, old: OldDriver) -> str:
    """What a driver before R550 changes on a launch that starts under a current one: the KV
    pool where vLLM's budget holds the graphs, else the graph memory outside it."""
    if a.resolved.cal.cudagraph_in_budget and w.kv_cache_memory_bytes is None:
        if not old.account.would_start:
            return "vLLM would not start here"
        return f"{a.kv_tokens - old.account.kv_tokens:,} KV tokens fewer here"
    more = max(
        o.cuda_graph_bytes - s.cuda_graph_bytes
        for o, s in zip(old.account.stages, a.stages, strict=True)
    )
    shift = f"{more / GiB:.2f} GiB more CUDA-graph memory here"
    return shift + ("" if old.account.would_start else ", and vLLM would not start")


def _sampler_behaviour(w: LLMServingWorkload, r: Resolved) -> StackBehaviour:
    assumed = (
        "the profile's warm-up sampler runs top-k / top-p on FlashInfer "
        "(VLLM_USE_FLASHINFER_SAMPLER=1): no sort"
        if w.flashinfer_sampler
        else _SAMPLER_ASSUMED[r.cal.top_k_top_p]
    )
    return StackBehaviour(
        name="warmup_sampler",
        assumed=assumed,
        source="vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p and "
        "gpu_model_runner.py _dummy_sampler_run of the release (research/data/"
        "vllm_versions.json cites the line); torch aten/src/ATen/native/cuda/SortStable.cu",
    )
