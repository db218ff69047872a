"""vrambudget's serving answers against published engine startup logs
(``research/data/engine_logs.json``): every log whose model, settings and GPU the source states
is re-created as a request and each number the engine printed is compared.

No constant of the engine models was fitted on these logs (vLLM's constants come from the
0.19.0 launches of research/data/vllm_runs.json and the tensor-parallel launches of
research/data/vllm_tp_logs.json, SGLang's from its source and vLLM's calibration, llama.cpp's
from its source and the CPU benchmark), so all of them are held out. Logs from one source
share a group.

    .venv/bin/python -m research.engine_logs            # the table docs/ACCURACY.md quotes
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from research.corpus import _config
from vrambudget.core.catalog import preset
from vrambudget.core.device import DeviceContext, resolve_device
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.resolve import resolve_model
from vrambudget.core.serving.budget import device_kv_band, held_accounts
from vrambudget.core.serving.engines_budget import sglang_engine, sglang_kv_band
from vrambudget.core.serving.gguf.llamacpp import LlamaSettings, device_buffer, llama_account
from vrambudget.core.serving.gguf.releases import (
    LLAMA_CPP_RELEASES,
    OLLAMA_RELEASES,
    GGUFRelease,
    gguf_release,
)
from vrambudget.core.serving.releases import engine_release, parse_version
from vrambudget.core.serving.vllm import account
from vrambudget.core.spec import (
    CatalogDevice,
    CustomDevice,
    DeviceRef,
    LLMServingWorkload,
    ModelSource,
    PresetModel,
)

LOGS = Path(__file__).parent / "data" / "engine_logs.json"
BAND = "KV tokens inside the band"
GRAPHS = "CUDA graphs (capture)"
MiB, GiB = 1 << 20, 1 << 30


@dataclass(frozen=True)
class Check:
    log: str
    engine: str
    quantity: str
    measured: float
    predicted: float
    unit: str
    fresh: bool = False
    """From held-out sets B, C, E, F, G, J and K: logs collected after the rules were fixed
    (``collected``)."""
    version: str = ""
    """The engine release the request named (vLLM, SGLang), or the log's (llama.cpp, Ollama)."""
    held_out_set: str = ""
    """The held-out set the log came in (``H``: llama.cpp and Ollama logs collected after the
    GGUF rules were fixed), where it is reported apart."""

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def _llama(
    log: str,
    preset: str,
    file_type: str,
    n_ctx: int,
    flash: bool,
    devices: int,
    measured: dict[str, Any],
    ngl: int | None = None,
    n_parallel: int = 1,
    n_ubatch: int = 512,
    engine: str = "ollama",
    kv_unified: bool = False,
    kv_type: str = "f16",
    n_batch: int | None = None,
    device_names: tuple[str, ...] | None = None,
    version: str = "",
) -> list[Check]:
    """llama.cpp's buffers (the lines Ollama and llama-server print) for the stated settings:
    ``n_ctx`` KV cells, ``kv_type`` for K and V, ``device_names`` the buffers' names where they
    are not CUDA0, CUDA1 ... (a process that sees one GPU of eight as CUDA1)."""
    arch = resolve_model(_model(preset))
    release = _gguf_release(engine, version)
    batch = n_batch if n_batch is not None else max(n_ubatch, 512)
    s = LlamaSettings(
        n_ctx=n_ctx,
        n_ctx_seq=n_ctx if kv_unified else n_ctx // n_parallel,
        n_parallel=n_parallel,
        kv_unified=kv_unified,
        n_gpu_layers=ngl if ngl is not None else arch.num_layers + 1,
        flash_attn=flash,
        n_ubatch=n_ubatch,
        n_batch=batch,
        type_k=kv_type,
        type_v=kv_type,
        devices=devices,
        splits=(1.0,) * devices,
        kv_offload=True,
        output_first=release.output_first,
        f16_mask=release.f16_mask,
        n_outputs=min(batch, n_parallel) if release.server_outputs else None,
    )
    a = llama_account(arch, file_type, s)
    out: list[Check] = []
    for d in a.devices:
        name = (
            device_names[d.index]
            if device_names is not None
            else f"CUDA{d.index}"
            if f"CUDA{d.index}" in measured["model_buffer_mib"]
            else f"Vulkan{d.index + 1}"
        )
        for quantity, pred, table in (
            ("model buffer", d.weights_bytes, "model_buffer_mib"),
            ("KV buffer", d.kv_bytes, "kv_buffer_mib"),
            ("compute buffer", d.compute_bytes, "compute_buffer_mib"),
        ):
            value = measured.get(table, {}).get(name)
            if value is not None:
                out.append(Check(log, engine, quantity, value, pred / MiB, "MiB"))
    # the host's share: one mapped buffer, or (llama.cpp with --no-mmap, Ollama's newer
    # runner) a CPU buffer and a pinned CUDA_Host one
    host = [v for k, v in measured["model_buffer_mib"].items() if not device_buffer(k)]
    if host:
        out.append(
            Check(log, engine, "model buffer (CPU)", sum(host), a.host_weights_bytes / MiB, "MiB")
        )
    return [dataclasses.replace(c, version=version) for c in out]


def _gguf_release(engine: str, version: str) -> GGUFRelease:
    """The modelled rules of the log's build or release (the newest where it prints none)."""
    table = LLAMA_CPP_RELEASES if engine == "llama_cpp" else OLLAMA_RELEASES
    try:
        modelled = engine_release(engine, version or None).modelled
    except InvalidWorkload:  # older than modelled: the oldest rules; newer: the newest
        older = parse_version(engine, version) < parse_version(engine, table[0].version)
        modelled = table[0 if older else -1].version
    return gguf_release(engine, modelled)


def _model(name: str) -> Any:
    """A preset id, or ``org/name`` of a config in research/data/configs."""
    if "/" in name:
        return msgspec.convert(_config(name), ModelSource)
    return PresetModel(id=name)


def _vllm(
    log: str,
    workload: dict[str, Any],
    gpu_id: str | None,
    measured: dict[str, Any],
    device: tuple[str, int] | None = None,
) -> list[Check]:
    """The log's checks for the request its launch states, on the catalog's ``gpu_id`` or on
    ``device`` (name, total bytes: a GPU the catalog does not have, as the log prints it);
    without either only the weights and graphs are checked."""
    # The sampler path the log's own line states (topk_topp_sampler.py, 0.10-0.11: FlashInfer
    # when installed): the profile's warm-up sorts the vocabulary only without it.
    settings = _by_id().get(log, {}).get("settings", {})
    sampler = settings.get("flashinfer_sampler")
    if sampler is not None and "flashinfer_sampler" not in workload:
        workload = {**workload, "flashinfer_sampler": sampler}
    # Whether the GPUs reached each other peer to peer, as the log's custom_all_reduce.py line
    # says ("Custom allreduce is disabled because ...").
    if "peer_access" in settings:
        par = workload.get("parallelism", {})
        workload = {**workload, "parallelism": {**par, "peer_access": settings["peer_access"]}}
    # The NVIDIA driver where the source prints it (nvidia-smi beside the log): before R550 the
    # CUDA graphs take more (vrambudget/core/serving/driver.py).
    driver = settings.get("driver_version")
    w = msgspec.convert({"kind": "llm_serving", **workload}, LLMServingWorkload)
    arch = resolve_model(w.model)
    ctx = _device(log, gpu_id, device)
    a = account(w, arch, ctx.memory_total_bytes, ctx.name, ctx.memory_in_use_bytes, driver)
    version = workload["engine_version"]
    out = [
        Check(
            log,
            "vllm",
            "weights",
            measured["weights_gib"],
            a.stages[0].weights_memory_bytes / GiB,
            "GiB",
        )
    ]
    # Graph memory as the log prints it: "Graph capturing finished ... took" (the capture
    # after the KV cache) — a diagnostic of the graph rule, not a KV check. Logs where
    # capture freed memory (a negative reading) say nothing about it.
    if measured.get("cuda_graph_gib", 0) > 0 and not w.enforce_eager:
        out.append(
            Check(
                log,
                "vllm",
                GRAPHS,
                measured["cuda_graph_gib"],
                a.stages[0].cuda_graph_bytes / GiB,
                "GiB",
            )
        )
    if gpu_id is not None or device is not None:
        out.append(Check(log, "vllm", "KV tokens", measured["kv_cache_tokens"], a.kv_tokens, "tok"))
        band = device_kv_band(w, a, ctx, held_accounts(w, ctx, driver=driver))
        assert band is not None  # no log sets --kv-cache-memory
        inside = float(band.low <= measured["kv_cache_tokens"] <= band.high)
        out.append(Check(log, "vllm", BAND, 1.0, inside, "yes"))
        if measured.get("max_concurrency"):
            out.append(
                Check(
                    log,
                    "vllm",
                    "max concurrency",
                    measured["max_concurrency"],
                    a.max_concurrency,
                    "x",
                )
            )
    return [dataclasses.replace(c, version=version) for c in out]


def _sglang(
    log: str, workload: dict[str, Any], gpu_id: str, measured: dict[str, Any]
) -> list[Check]:
    """SGLang's lines: "Load weight end ... mem usage" (weights per rank), "max_total_num_tokens"
    (the pool) and "max_running_requests", for the request the log's launch states."""
    w = msgspec.convert({"kind": "llm_serving", "engine": "sglang", **workload}, LLMServingWorkload)
    ctx = _device(log, gpu_id)
    run = sglang_engine(w, ctx)
    a = run.account
    out = []
    if "weights_gb" in measured:
        out.append(
            Check(log, "sglang", "weights", measured["weights_gb"], a.weights_bytes / GiB, "GiB")
        )
    out.append(
        Check(
            log,
            "sglang",
            "KV tokens",
            measured["max_total_num_tokens"],
            a.max_total_num_tokens,
            "tok",
        )
    )
    out.append(
        Check(
            log,
            "sglang",
            "max running requests",
            measured["max_running_requests"],
            a.max_running_requests,
            "x",
        )
    )
    band = sglang_kv_band(w, run, ctx)
    if band is not None:
        inside = float(band.low <= measured["max_total_num_tokens"] <= band.high)
        out.append(Check(log, "sglang", BAND, 1.0, inside, "yes"))
    bare = sglang_engine(w, _device("", gpu_id)).account  # what the start itself takes
    in_use = _sglang_in_use(measured, bare.free_before)
    if in_use is not None:
        # A diagnostic, not a test of the model: the memory the log says was free before
        # loading replaces the modelled start (CUDA context, NCCL, other processes), so what
        # is left is the pool rule's own error.
        given = resolve_device(CatalogDevice(id=gpu_id, memory_in_use_bytes=in_use))
        assert given is not None
        b = sglang_engine(w, given).account
        out.append(
            Check(
                log,
                "sglang",
                PRINTED_FREE,
                measured["max_total_num_tokens"],
                b.max_total_num_tokens,
                "tok",
            )
        )
    return out


PRINTED_FREE = "KV tokens, given the printed free memory"

DESKTOP: dict[str, str] = {
    # Windows + WSL2 Docker Desktop (the README's "System Information"; driver 560.76)
    "sglang-jerryzsj-r1distill-qwen7b-rtx3090": "windows",
    # Windows + Docker Desktop (start_server.sh run from Git Bash on D:/ paths)
    "sglang-maxuhl98-llama31-8b-rtx4090-tp1": "windows",
    # WSL (the repository's session notes: Driver 596.21, the Windows driver)
    "vllm-localai-phi3-mini-4k-fp16-3090": "windows",
    # WSL2 (the repository's launch scripts; vLLM warns pinned memory is not available)
    "vllm-freshair-prp-typhoon25-qwen3-4b-rtx5060ti-bare-v0290": "windows",
    # Xorg with cinnamon, firefox and VS Code on the card (the same file's nvidia-smi)
    "vllm-retriva-qwen3-0.6b-rtx3060-util075-eager-v0190": "linux",
    "vllm-retriva-qwen3-0.6b-rtx3060-util060-eager-v0190": "linux",
}
"""Launches on a GPU that also drives a desktop, as the log's source says: re-created with
``device.desktop_session`` (the desktop's published hold, ``research/desktop_hold.py``, none of
whose readings is one of these logs), as a user on that host would ask."""


def _device(log: str, gpu_id: str | None, custom: tuple[str, int] | None = None) -> DeviceContext:
    """The log's GPU (the catalog's, a ``custom`` (name, total bytes) as the log prints it, or
    an H100 where neither is known: weights and graphs only), with its desktop session."""
    session = DESKTOP.get(log)
    ref: DeviceRef = (
        CustomDevice(name=custom[0], memory_total_bytes=custom[1], desktop_session=session)
        if custom is not None
        else CatalogDevice(id=gpu_id or "h100-sxm5-80gb", desktop_session=session)
    )
    ctx = resolve_device(ref)
    assert ctx is not None
    return ctx


def _sglang_in_use(measured: dict[str, Any], free_before: int) -> int | None:
    """The memory in use by others that makes the modelled free memory at SGLang's start equal
    the free memory its log prints ("Load weight begin. avail mem", or "Load weight end"'s
    avail mem plus its mem usage); None when the log prints neither, or when the modelled start
    alone already takes more than the log's (a negative use cannot be asked for)."""
    before = measured.get("avail_mem_before_load_gb")
    if before is None and {"avail_mem_after_weights_gb", "weights_gb"} <= measured.keys():
        before = measured["avail_mem_after_weights_gb"] + measured["weights_gb"]
    if before is None:
        return None
    in_use = free_before - round(before * GiB)  # the modelled free memory less the printed
    return in_use if in_use >= 0 else None


def preset_shapes(preset_id: str, **changes: Any) -> dict[str, Any]:
    """A checkpoint with a preset's shapes as an ``hf_config`` model: the preset's config.json
    with the keys the checkpoint changes (a longer context, its quantization_config)."""
    return {
        "source": "hf_config",
        "config": {**msgspec.to_builtins(preset(preset_id).config), **changes},
    }


QWEN_AWQ: dict[str, Any] = {
    "bits": 4,
    "group_size": 128,
    "modules_to_not_convert": None,
    "quant_method": "awq",
    "version": "gemm",
    "zero_point": True,
}
"""Qwen's AWQ checkpoints' ``quantization_config``: Qwen/Qwen3-32B-AWQ's config.json block,
verbatim as quoted with the loaded model's tensor list (down_proj.qweight [25600, 640] int32,
qzeros [200, 640], scales [200, 5120]) in a public GitHub report (find_string id 62727925985);
the same block is quoted for a Qwen2.5-32B-Instruct-AWQ config (find_string id 56950856993)."""

QWEN3_2507 = {"max_position_embeddings": 262144}
"""Qwen3-30B-A3B-Instruct-2507 and Qwen3-Coder-30B-A3B: Qwen3-30B-A3B's shapes, 256K positions."""

HELD_OUT_B: dict[str, tuple[dict[str, Any], str]] = {
    # Qwen2.5-Coder-14B-Instruct has Qwen2.5-14B's shapes
    "vllm-controllersearch-qwen25-coder-14b-l40s-16k": (
        {
            "engine_version": "0.11.2",
            "model": {"source": "preset", "id": "qwen2.5-14b"},
            "max_model_len": 16384,
        },
        "l40s-48gb",
    ),
    # Qwen2.5-Coder-32B-Instruct-AWQ: Qwen2.5-32B's shapes, float16, AWQ detected (Marlin)
    "vllm-logomesh-qwen25-coder-32b-awq-a100-40gb-16k": (
        {
            "engine_version": "0.13.0",
            "model": preset_shapes(
                "qwen2.5-32b", torch_dtype="float16", quantization_config=QWEN_AWQ
            ),
            "max_model_len": 16384,
        },
        "a100-sxm4-40gb",
    ),
    "vllm-logomesh-qwen25-coder-32b-awq-a100-40gb-4k": (
        {
            "engine_version": "0.13.0",
            "model": preset_shapes(
                "qwen2.5-32b", torch_dtype="float16", quantization_config=QWEN_AWQ
            ),
            "max_model_len": 4096,
        },
        "a100-sxm4-40gb",
    ),
    # a 0.26.1 release candidate: the 0.26 rules
    "vllm-autoscientists-qwen3-coder-30b-a3b-a100-80gb-128k-seqs16": (
        {
            "engine_version": "0.26.0",
            "model": preset_shapes("qwen3-30b-a3b", **QWEN3_2507),
            "max_model_len": 131072,
            "gpu_memory_utilization": 0.9,
            "max_num_seqs": 16,
        },
        "a100-sxm4-80gb",
    ),
    # two launches with the same arguments (the GPU is inferred from the repository's plans)
    **{
        f"vllm-memawarerlhf-qwen25-3b-fp16-4090-4k-seqs1-{x}": (
            {
                "engine_version": "0.10.2",
                "model": {"source": "preset", "id": "qwen2.5-3b"},
                "dtype": "float16",
                "max_model_len": 4096,
                "max_num_seqs": 1,
            },
            "rtx-4090-24gb",
        )
        for x in ("a", "b")
    },
    # Meta-Llama-3-8B-Instruct: Llama 3.1 8B's shapes with 8,192 positions and no RoPE scaling
    "vllm-bench3-llama3-8b-h200-1k": (
        {
            "engine_version": "0.11.2",
            "model": preset_shapes("llama-3.1-8b", max_position_embeddings=8192, rope_scaling=None),
            "dtype": "bfloat16",
            "max_model_len": 1024,
        },
        "h200-sxm-141gb",
    ),
    "vllm-localai-phi3-mini-4k-fp16-3090": (
        {
            "engine_version": "0.19.1",
            "model": {"source": "preset", "id": "phi-3-mini-4k"},
            "dtype": "float16",
            "max_model_len": 4096,
            "gpu_memory_utilization": 0.85,
        },
        "rtx-3090-24gb",
    ),
    "vllm-telcorag-qwen3-30b-a3b-2507-h200-gmu05-16k": (
        {
            "engine_version": "0.15.0",
            "model": preset_shapes("qwen3-30b-a3b", **QWEN3_2507),
            "max_model_len": 16000,
            "gpu_memory_utilization": 0.5,
        },
        "h200-sxm-141gb",
    ),
    # four launches that each change one setting
    **{
        f"vllm-runpodbench-qwen3-8b-h100-{tag}-gmu095": (
            {
                "engine_version": "0.18.0",
                "model": {"source": "preset", "id": "qwen3-8b"},
                "max_model_len": 8128,
                "gpu_memory_utilization": 0.95,
                **change,
            },
            "h100-sxm5-80gb",
        )
        for tag, change in (
            ("eager", {"enforce_eager": True}),
            ("seqs64", {"max_num_seqs": 64}),
            ("mbt4096", {"max_num_batched_tokens": 4096}),
            ("kvfp8", {"kv_cache_dtype": "fp8"}),
        )
    },
    "vllm-kolyangg-qwen3-30b-a3b-2507-h100-6k": (
        {
            "engine_version": "0.10.2",
            "model": preset_shapes("qwen3-30b-a3b", **QWEN3_2507),
            "dtype": "bfloat16",
            "max_model_len": 6144,
        },
        "h100-sxm5-80gb",
    ),
    "vllm-nnamdi-qwen3-30b-a3b-2507-fp8online-h100-8k-seqs64": (
        {
            "engine_version": "0.22.1",
            "model": preset_shapes("qwen3-30b-a3b", **QWEN3_2507),
            "dtype": "bfloat16",
            "max_model_len": 8192,
            "gpu_memory_utilization": 0.92,
            "max_num_seqs": 64,
            "max_num_batched_tokens": 8192,
            "quantization": {"method": "fp8", "applied_at_load": True},
        },
        "h100-sxm5-80gb",
    ),
}
"""Held-out set B (collected 2026-12-04, after the vLLM rules were fixed): each log as a request.
Left out: the MiniMax-M2.5 TP4 MI300X launch (no model with its shapes here)."""


QWEN3_4B = _config("Qwen/Qwen3-4B")
QWEN3_4B_2507 = {
    **QWEN3_4B,
    "config": {**QWEN3_4B["config"], "max_position_embeddings": 262144, "rope_theta": 5000000},
}
"""Qwen3-4B-Instruct-2507: Qwen3-4B's shapes with 262,144 positions (the shapes a public
Qwen3-4B-2507-based text encoder config quotes: find_string id 60921683662)."""

HELD_OUT_C: dict[str, tuple[str, dict[str, Any], str]] = {
    # vLLM: all defaults but host and download_dir (the log prints 40,960 and 8,192)
    "vllm-benyucong-qwen3-4b-h100-40k-default": (
        "vllm",
        {"engine_version": "0.10.2", "model": QWEN3_4B},
        "h100-sxm5-80gb",
    ),
    # offline LLM(): the LLM-class defaults (8,192 batched tokens printed), bf16; the second
    # launch changes the batch settings only
    **{
        f"vllm-atreydesai-qwen3-4b-2507-rtxa6000-32k{tag}": (
            "vllm",
            {
                "engine_version": "0.11.2",
                "model": QWEN3_4B_2507,
                "entrypoint": "llm_class",
                "dtype": "bfloat16",
                "max_model_len": 32768,
                **change,
            },
            "rtx-a6000-48gb",
        )
        for tag, change in (
            ("", {}),
            ("-seqs1-mbt32k", {"max_num_seqs": 1, "max_num_batched_tokens": 32768}),
        )
    },
    # SGLang: lmsysorg/sglang:latest on 2025-07-14 (0.4.9.post1/post2 by PyPI's dates, inferred);
    # a Windows Docker Desktop host; the log's own context_len of 131,072 (the model's)
    "sglang-maxuhl98-llama31-8b-rtx4090-tp1": (
        "sglang",
        {"engine_version": "0.4.9", "model": {"source": "preset", "id": "llama-3.1-8b"}},
        "rtx-4090-24gb",
    ),
    # Qwen3-Reranker-0.6B has Qwen3-0.6B's shapes; pip-resolved 0.5.18 per the document
    "sglang-otel-qwen3-reranker-0.6b-h100-tp1-mfs0.3": (
        "sglang",
        {
            "engine_version": "0.5.18",
            "model": _config("Qwen/Qwen3-0.6B"),
            "sglang": {"mem_fraction_static": 0.3},
        },
        "h100-sxm5-80gb",
    ),
    # Set D (collected 2026-12-05, after the SGLang FP32 rotary rule): Qwen3-14B at TP4 over
    # four PCIe RTX 4090s, --mem-fraction-static 0.8, the model's context; SGLang from a source
    # checkout between 0.5.6 and 0.5.8 (inferred from its torch pin and log format): the 0.5.7
    # rules
    "sglang-ugyhybnb-qwen3-14b-4x4090-tp4-mfs0.8": (
        "sglang",
        {
            "engine_version": "0.5.7",
            "model": _config("Qwen/Qwen3-14B"),
            "parallelism": {"tensor": 4},
            "sglang": {"mem_fraction_static": 0.8},
        },
        "rtx-4090-24gb",
    ),
}
"""Held-out set C (collected 2026-12-05, after the vLLM and SGLang rules were written): each log


whose GPU is named or inferred and whose model's shapes are here, as a request. Kept in
research/data/engine_logs.json but not checked: Qwen3.5 / Qwen3.6 (hybrid linear attention),
Olmo 3 and Nanbeige 4.1 (no shapes here), MI355X (not in the catalog) and four SGLang logs that
name no GPU."""

_VLLM_LAB = {
    "model": {"source": "preset", "id": "qwen3-8b"},
    "dtype": "bfloat16",
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.75,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 4096,
    "enforce_eager": True,
}
_NGRAM = {"speculative": {"method": "ngram", "num_speculative_tokens": 4}}
HeldOut = dict[str, tuple[dict[str, Any], str | None, tuple[str, float] | None]]
"""Log id -> (the request its launch states, the catalog GPU, or None and (name, total GiB as
the log prints it) for a GPU the catalog does not have; neither: weights and graphs only)."""

HELD_OUT_E: HeldOut = {
    f"vllm-vllmlab-qwen3-8b-4090-48g-v0{v}-{tag}": (
        {"engine_version": f"0.{v}.0", **_VLLM_LAB, **extra},
        None,
        ("NVIDIA GeForce RTX 4090", 47.37),
    )
    for v in (18, 29)
    for tag, extra in (("base", {}), ("ngram4", _NGRAM))
}
"""Held-out set E (collected 2026-12-05, after the speculative-decoding rules): one repository's
Qwen3-8B launches on a 48 GB RTX 4090 (47.37 GiB as vLLM prints it; not in the catalog), 0.18.0
and 0.29.0, each with and without n-gram speculative decoding."""

QWEN3_0_6B = _config("Qwen/Qwen3-0.6B")
RTX_3060 = ("NVIDIA GeForce RTX 3060", 11.63)
"""The RTX 3060 12GB of set F's retriva launches, not in the catalog: 11.63 GiB as the same
file's first, failed launch prints it ("Free memory on device cuda:0 (9.02/11.63 GiB)")."""
HELD_OUT_F: HeldOut = {
    # vllm serve with its defaults on an A100 40GB (the model's 40,960 positions)
    "vllm-tokenkaki-qwen3-8b-a100-40gb-serve-v0191": (
        {"engine_version": "0.19.1", "model": {"source": "preset", "id": "qwen3-8b"}},
        "a100-sxm4-40gb",
        None,
    ),
    # vllm bench latency / throughput: the offline LLM class's defaults
    **{
        f"vllm-tokenkaki-qwen3-8b-a100-40gb-bench-{kind}-v0191": (
            {
                "engine_version": "0.19.1",
                "model": {"source": "preset", "id": "qwen3-8b"},
                "entrypoint": "llm_class",
            },
            "a100-sxm4-40gb",
            None,
        )
        for kind in ("latency", "throughput")
    },
    # Qwen2.5-72B-Instruct: Qwen2.5-72B's shapes, TP4 over four PCIe L40S
    "vllm-gnosia93-qwen25-72b-4xl40s-tp4-v0190": (
        {
            "engine_version": "0.19.0",
            "model": {"source": "preset", "id": "qwen2.5-72b"},
            "max_model_len": 8192,
            "parallelism": {"tensor": 4},
        },
        "l40s-48gb",
        None,
    ),
    "vllm-retriva-qwen3-0.6b-rtx3060-util075-eager-v0190": (
        {
            "engine_version": "0.19.0",
            "model": QWEN3_0_6B,
            "max_model_len": 8192,
            "gpu_memory_utilization": 0.75,
            "enforce_eager": True,
        },
        None,
        RTX_3060,
    ),
    "vllm-retriva-qwen3-0.6b-rtx3060-util060-eager-v0190": (
        {
            "engine_version": "0.19.0",
            "model": QWEN3_0_6B,
            "max_model_len": 4096,
            "gpu_memory_utilization": 0.6,
            "max_num_seqs": 8,
            "max_num_batched_tokens": 1024,
            "enforce_eager": True,
        },
        None,
        RTX_3060,
    ),
    # typhoon2.5-qwen3-4b (Qwen3-4B's shapes) through Xinference on an RTX 5060 Ti under WSL2:
    # the GPU's total is not printed, so only the weights (and graphs) are checked
    "vllm-freshair-prp-typhoon25-qwen3-4b-rtx5060ti-xinference-v0300": (
        {
            "engine_version": "0.30.0",
            "model": QWEN3_4B,
            "max_model_len": 8192,
            "gpu_memory_utilization": 0.7,
            "max_num_seqs": 256,
            "block_size": 16,
        },
        None,
        None,
    ),
}
"""Held-out set F (collected 2026-12-05, after the speculative-decoding rules): seven launches
from four repositories no other set uses, vLLM 0.19.0, 0.19.1 and 0.30.0; every one is checked
(the KV tokens where the GPU's total is known)."""

A40 = ("NVIDIA A40", 44.42)
"""The A40 of set G's Synapse launches, not in the catalog: 44.42 GiB as each log prints it
("Free memory on device (44.16/44.42 GiB)")."""
_SYNAPSE = {
    "engine_version": "0.31.0",
    "model": {"source": "preset", "id": "qwen2.5-7b"},
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": 128,
}
HELD_OUT_G: HeldOut = {
    # vllm serve of Qwen2.5-7B-Instruct (Qwen2.5-7B's shapes) on one A40, three sessions
    **{
        f"vllm-synapse-{run}-qwen25-7b-bf16-a40-v0310": (
            {**_SYNAPSE, "dtype": "bfloat16"},
            None,
            A40,
        )
        for run in ("2026-10-08t2214-full", "2026-10-09t0124-full", "2026-10-09t1514-perf")
    },
    # Qwen2.5-7B-Instruct-AWQ: 4-bit AWQ, fp16 activations (the engine-config line's dtype)
    **{
        f"vllm-synapse-{run}-qwen25-7b-awq-a40-v0310": (
            {**_SYNAPSE, "dtype": "float16", "quantization": {"method": "awq"}},
            None,
            A40,
        )
        for run in ("2026-10-09t0124-full", "2026-10-09t1514-perf")
    },
    # vllm serve of Qwen2.5-3B-Instruct in fp16 on a GPU the log does not name: weights and
    # graphs only
    "vllm-augmentqa-qwen25-3b-fp16-v0170": (
        {
            "engine_version": "0.17.0",
            "model": {"source": "preset", "id": "qwen2.5-3b"},
            "max_model_len": 4096,
            "dtype": "float16",
        },
        None,
        None,
    ),
    # bare vLLM 0.29.0 of typhoon2.5-qwen3-4b on the RTX 5060 Ti (inferred from the
    # repository) of set F's 0.30.0 Xinference launch; the log prints the total to one decimal
    # ("Free memory on device (14.8/15.9 GiB)") on a desktop GPU whose other processes held
    # about 1.1 GiB
    "vllm-freshair-prp-typhoon25-qwen3-4b-rtx5060ti-bare-v0290": (
        {
            "engine_version": "0.29.0",
            "model": QWEN3_4B,
            "max_model_len": 8192,
            "gpu_memory_utilization": 0.7,
        },
        None,
        ("NVIDIA GeForce RTX 5060 Ti", 15.9),
    ),
}
"""Held-out set G (collected 2026-12-05 after the speculative-decoding rules, checked in a later
session without change): the first vLLM 0.31.0 logs, one repository's Qwen2.5-7B-Instruct
launches on an A40, with a 0.17.0 and a 0.29.0 launch. Kept but not checked: the three
GPTQ-Int8 launches (no citable copy of the checkpoint's quantization_config was found), the
0.31.0 test fixture (no launch line), and the 0.16.0 bitsandbytes 4-bit launch (not a vLLM
quantization the serving model has)."""

HELD_OUT_J: HeldOut = {
    # vllm serve of a local Qwen3-14B (Qwen/Qwen3-14B's shapes) with --max-model-len 32768
    "vllm-trainsft-qwen3-14b-a100-80gb-32k-v0100": (
        {
            "engine_version": "0.10.0",
            "model": _config("Qwen/Qwen3-14B"),
            "max_model_len": 32768,
        },
        "a100-sxm4-80gb",
        None,
    ),
}
"""Held-out set J (collected 2026-12-07, after every rule above): one repository's vLLM 0.10.0
launch on an A100-SXM4-80GB (named by the same repository's Unsloth log of that machine)."""

LLAMA3_70B_AWQ: dict[str, Any] = {**QWEN_AWQ}
"""TechxGenus/Meta-Llama-3-70B-Instruct-AWQ's ``quantization_config``, INFERRED, not read: no
copy of that checkpoint's config.json was found. It is AutoAWQ's default block (4 bits, groups
of 128, zero point, GEMM), verbatim the block of the same uploader's sibling
TechxGenus/Meta-Llama-3-70B-AWQ config.json (huggingface.co, uploaded the same day) and of
casperhansen/llama-3-70b-instruct-awq's; set K's log prints 18.55 GiB of weights per GPU where
it gives 18.53 (-0.11%)."""

HELD_OUT_K: HeldOut = {
    # vllm serve of a local TechxGenus/Meta-Llama-3-70B-Instruct-AWQ at TP2 over two PCIe L40S,
    # every other setting at its default; Meta-Llama-3-70B-Instruct has Llama 3.1 70B's shapes
    # with 8,192 positions and no RoPE scaling (its config.json as quoted: find_string ids
    # 66940204889, 22159703707), float16 (the engine-config line's dtype), AWQ (awq_marlin)
    "vllm-kagaho-llama3-70b-instruct-awq-2xl40s-tp2-v0160": (
        {
            "engine_version": "0.16.0",
            "model": preset_shapes(
                "llama-3.1-70b",
                max_position_embeddings=8192,
                rope_scaling=None,
                torch_dtype="float16",
                quantization_config=LLAMA3_70B_AWQ,
            ),
            "parallelism": {"tensor": 2},
        },
        "l40s-48gb",
        None,
    ),
}
"""Held-out set K (collected 2026-12-07, after the rules it checks were written, driver rule
included): one repository's vLLM 0.16.0 launch of a 4-bit AWQ Llama 3 70B at TP2 on two of a
host's four L40S (named, with driver 580.119.02, by the same repository's nvidia-smi and
``vllm collect-env`` printouts); custom all-reduce ran (its workers register the graphs'
buffers)."""


HELD_OUT_H: dict[str, tuple[str, str, int, bool, dict[str, Any]]] = {
    # (model, GGUF file type, KV cells, flash attention as the log resolved it, the rest)
    "llamacpp-fsd-b7896-qwen25-14b-q4km-3090-np4-32k": (
        "qwen2.5-14b",
        "Q4_K_M",
        32768,
        True,
        {"n_parallel": 4, "kv_unified": True, "n_batch": 2048},
    ),
    # no layer on the GPU, which still gets a compute buffer (CUDA0): offload_op
    "llamacpp-alpy-b5285-qwen3-4b-q6k-1660ti-ngl0": (
        "Qwen/Qwen3-4B",
        "Q6_K",
        4096,
        False,
        {"ngl": 0, "n_batch": 2048, "device_names": ("CUDA0",)},
    ),
    "llamacpp-alpy-b5285-qwen3-8b-q4km-1660ti-ngl0": (
        "qwen3-8b",
        "Q4_K_M",
        4096,
        False,
        {"ngl": 0, "n_batch": 2048, "device_names": ("CUDA0",)},
    ),
    # Qwen2.5-Coder-7B-Instruct has Qwen2.5-7B's shapes (28 layers, 3584 wide, vocabulary
    # 152,064, untied), as the log's print_info lines say
    "llamacpp-rusteze-b7780-qwen25-coder-7b-q8-rtx5080-32k-fa": (
        "qwen2.5-7b",
        "Q8_0",
        32768,
        True,
        {},
    ),
    # one cache of 8,192 cells for the four slots ("kv_size = 8192"): streams came later
    "ollama-materialagent-060-llama31-8b-q4km-v100-np4": (
        "llama-3.1-8b",
        "Q4_K_M",
        8192,
        False,
        {"n_parallel": 4, "kv_unified": True, "n_batch": 2048},
    ),
    "ollama-robustness-0210-llama31-8b-q4km-a100-80gb-128k": (
        "llama-3.1-8b",
        "Q4_K_M",
        131072,
        True,
        {"device_names": ("CUDA1",)},
    ),
    "ollama-angela-0177-qwen25-14b-q4km-t4-6k-ub256": (
        "qwen2.5-14b",
        "Q4_K_M",
        6144,
        True,
        {"n_ubatch": 256, "n_batch": 256},
    ),
    # Qwen2.5-Coder-32B-Instruct has Qwen2.5-32B's shapes (64 layers, 5120 wide, 8 KV heads)
    "ollama-agenticmalgen-0221-qwen25-coder-32b-q4km-a100-40gb-32k": (
        "qwen2.5-32b",
        "Q4_K_M",
        32768,
        True,
        {},
    ),
    "ollama-tfg-01110-llama31-70b-q4km-a40-partial-32k": (
        "llama-3.1-70b",
        "Q4_K_M",
        32768,
        False,
        {"ngl": 64},
    ),
    "ollama-tfg-03010-llama-server-qwen25-coder-32b-q4km-a40-partial-4k": (
        "qwen2.5-32b",
        "Q4_K_M",
        4096,
        True,
        {"ngl": 48},
    ),
    "ollama-audiointel-0212-llama31-8b-q4km-rtx4050laptop-partial": (
        "llama-3.1-8b",
        "Q4_K_M",
        4096,
        True,
        {"ngl": 31},
    ),
}
"""Held-out set H (collected 2026-12-07, after the GGUF rules were fixed): llama.cpp and Ollama
startup logs on one NVIDIA GPU, from repositories no other set uses, each re-created with the
settings its own lines print. Kept with their provenance but not checked: two Mistral-Nemo
12B logs (no config of that model here), and two Ollama 0.1.30 logs (llama.cpp of 2024-03,
before the modelled builds; Yi-6B and Command-R). Ollama 0.6.0, older than the first modelled
Ollama release (0.6.7), is checked as the llama.cpp of 2025 it runs (from b4000 on)."""


HELD_OUT_I: dict[str, tuple[str, str, int, bool, dict[str, Any]]] = {
    # (model, GGUF file type, KV cells, flash attention as the log resolved it, the rest)
    # llama-cpp-python of an arXiv paper of 2025-09 (no build printed): 20 repeating layers and
    # no output layer on the GPU, the placement before ggml-org/llama.cpp#18148; checked with
    # the rules of b6327, the modelled build of that time (inferred from the paper's date)
    "llamacpp-python-arxiv2509.11947-mistral-7b-q4km-rtx4060laptop-ngl20-of33": (
        "mistral-7b-v0.1",
        "Q4_K_M",
        768,
        True,
        {"ngl": 20, "n_ubatch": 256, "n_batch": 256, "version": "b6327"},
    ),
    # the three Qwen 2.5 32B-shaped logs (64 layers, 5120 wide, 27,648 FFN, vocabulary
    # 152,064, as their print_info lines say): a Qwen 2.5 32B tag, DeepSeek-R1-Distill-Qwen-32B
    # and QwQ-32B
    "ollama-nithin2311-0.19.0-qwen25-32b-q4km-rtx3090-ngl49of65-32k-fa-auto": (
        "qwen2.5-32b",
        "Q4_K_M",
        32768,
        True,
        {"ngl": 49},
    ),
    "ollama-furi5-itext2kg-0.5.11-deepseek-r1-distill-qwen32b-q4km-rtx3090-ngl43of65-2k": (
        "qwen2.5-32b",
        "Q4_K_M",
        2048,
        False,
        {"ngl": 43},
    ),
    "ollama-furi5-itext2kg-0.5.11-deepseek-r1-distill-qwen32b-q4km-rtx3090-full65-8k-par4": (
        "qwen2.5-32b",
        "Q4_K_M",
        8192,
        False,
        {"n_parallel": 4, "kv_unified": True, "n_batch": 2048},
    ),
    "ollama-aact-0.6.1-qwq32b-q4km-rtx3080ti-ngl33of65-2k": (
        "qwen2.5-32b",
        "Q4_K_M",
        2048,
        False,
        {"ngl": 33},
    ),
}
"""Held-out set I (collected 2026-12-07 after the compute-buffer rules were rewritten from
llama.cpp's own scheduler, bench/llamacpp_rpc.py): nine logs from sources no other set uses.
Kept with their provenance but not checked: Qwen3-Coder-Next 80B-A3B and Qwen3.5-35B-A3B
(hybrid attention, not modelled), gpt-oss-120b through Ollama 0.30.7 (no config here) and
Ollama 0.1.38 (2024-05, before the modelled releases). Ollama 0.5.11 and 0.6.1, older than the
first modelled Ollama release (0.6.7), are checked with its rules."""


@cache
def _by_id() -> dict[str, dict[str, Any]]:
    return {entry["id"]: entry for entry in json.loads(LOGS.read_text())["logs"]}


def checks() -> list[Check]:
    logs = _by_id()

    def m(prefix: str) -> tuple[str, dict[str, Any]]:
        keys = [k for k in logs if k.startswith(prefix)]
        key = min(keys, key=len)  # the exact id when one id prefixes another
        return key, logs[key]["measured"]

    def v(key: str) -> str:
        return str(logs[key]["engine_version"] or "")

    out: list[Check] = []
    # llama.cpp buffers printed by Ollama's runner (Llama 3.1 70B, Llama 3.2 1B) and llama-server
    k, x = m("ollama-ticketllm-llama31-70b-q4km-l40s")
    out += _llama(k, "llama-3.1-70b", "Q4_K_M", 8192, True, 1, x, version=v(k))
    k, x = m("ollama-ticketllm-llama31-70b-q4km-l40s-c")
    out += _llama(k, "llama-3.1-70b", "Q4_K_M", 4096, True, 1, x, version=v(k))
    k, x = m("ollama-ticketllm-llama31-70b-q4km-2xquad")
    out += _llama(k, "llama-3.1-70b", "Q4_K_M", 4096, True, 2, x, version=v(k))
    k, x = m("ollama-podcast-llama31-70b-q4_0-2xh100mi")
    out += _llama(k, "llama-3.1-70b", "Q4_0", 4096, False, 2, x, version=v(k))
    k, x = m("ollama-cs6501-llama32-1b-q8-t4")
    out += _llama(k, "meta-llama/Llama-3.2-1B-Instruct", "Q8_0", 4096, True, 1, x, version=v(k))
    k, x = m("llamacpp-aigis-b8179-qwen25-3b-q4km")
    # the KV split (68 + 4 MiB of 72) shows 34 of 36 layers on the GPU: -ngl 35
    out += _llama(
        k,
        "qwen2.5-3b",
        "Q4_K_M",
        2048,
        True,
        1,
        x,
        ngl=35,
        n_parallel=4,
        engine="llama_cpp",
        version=v(k),
    )
    for name, table in (("H", HELD_OUT_H), ("I", HELD_OUT_I)):
        for key, (model_id, file_type, n_ctx, flash, kw) in table.items():
            entry = logs[key]
            kw = dict(kw)
            # a version the log does not print may be inferred in the table (set I)
            version = kw.pop("version", entry["engine_version"] or "")
            out += [
                dataclasses.replace(c, fresh=True, held_out_set=name)
                for c in _llama(
                    key,
                    model_id,
                    file_type,
                    n_ctx,
                    flash,
                    1,
                    entry["measured"],
                    engine=entry["engine"],
                    version=version,
                    **kw,
                )
            ]
    # SGLang (automatic mem_fraction_static; the printed context_len of 131,072 leaves the
    # running-request estimate at its 2,048 floor, as the presets' context does)
    k, x = m("sglang-jerryzsj-r1distill-qwen7b-rtx3090")
    # DeepSeek-R1-Distill-Qwen-7B has Qwen2.5-7B's shapes; lmsysorg/sglang:latest of 2025-02-04
    # (0.4.2.post1 or earlier: the 0.4.0 rules)
    out += _sglang(
        k,
        {"engine_version": "0.4.2", "model": {"source": "preset", "id": "qwen2.5-7b"}},
        "rtx-3090-24gb",
        x,
    )
    k, x = m("sglang-didierdurand-qwq32b-4xl4-tp4")
    # QwQ-32B has Qwen2.5-32B's shapes
    out += _sglang(
        k,
        {
            "engine_version": "0.4.3.post4",
            "model": {"source": "preset", "id": "qwen2.5-32b"},
            "parallelism": {"tensor": 4},
        },
        "l4-24gb",
        x,
    )
    # vLLM: "Model loading took", "GPU KV cache size", "Maximum concurrency"
    for key, entry in logs.items():
        if not key.startswith("vllm-dennislee-qwen2-7b"):
            continue
        st = entry["settings"]
        out += _vllm(
            key,
            {
                "engine_version": "0.10.1",
                # Qwen2-7B-Instruct has Qwen2.5-7B's shapes (28 layers, 3584 wide, 4 KV heads,
                # vocabulary 152,064)
                "model": {"source": "preset", "id": "qwen2.5-7b"},
                "max_model_len": st["max_model_len"],
                "gpu_memory_utilization": st["gpu_memory_utilization"],
                "parallelism": {"tensor": st.get("tensor_parallel", 1)},
            },
            entry["gpu_id"],
            entry["measured"],
        )
    k, x = m("vllm-demoenvl4-llama31-8b-32k-l4")
    out += _vllm(
        k,
        {
            "engine_version": "0.11.0",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "max_model_len": 32000,
            "gpu_memory_utilization": 0.92,
            "max_num_seqs": 128,
        },
        "l4-24gb",
        x,
    )
    k, x = m("vllm-duotalk-qwen25-14b-awq-a5000")
    out += _vllm(
        k,
        {
            "engine_version": "0.13.0",
            "model": {"source": "preset", "id": "qwen2.5-14b"},
            "max_model_len": 8192,
            "dtype": "float16",
            "quantization": {"method": "awq"},
        },
        "rtx-a5000-24gb",
        x,
    )
    for key, (workload, gpu_id) in HELD_OUT_B.items():
        out += [
            dataclasses.replace(c, fresh=True)
            for c in _vllm(key, workload, gpu_id, logs[key]["measured"])
        ]
    for key, (engine, workload, gpu_id) in HELD_OUT_C.items():
        measured = logs[key]["measured"]
        rows = (
            _vllm(key, workload, gpu_id, measured)
            if engine == "vllm"
            else _sglang(key, workload, gpu_id, measured)
        )
        out += [dataclasses.replace(c, fresh=True) for c in rows]
    for key, (workload, gpu_id, custom) in {
        **HELD_OUT_E,
        **HELD_OUT_F,
        **HELD_OUT_G,
        **HELD_OUT_J,
        **HELD_OUT_K,
    }.items():
        device = (custom[0], round(custom[1] * GiB)) if custom is not None else None
        out += [
            dataclasses.replace(c, fresh=True)
            for c in _vllm(key, workload, gpu_id, logs[key]["measured"], device)
        ]
    for prefix, version, preset_id in (
        ("vllm-energyllm-llama31-8b-4k", "0.11.0", "llama-3.1-8b"),
        ("vllm-memsuit-llama31-8b-32k", "0.17.0", "llama-3.1-8b"),
        ("vllm-arno-qwen25-7b-fp16-rocm", "0.17.0", "qwen2.5-7b"),
        ("vllm-vediosifter-qwen3-30b-a3b", "0.12.0", "qwen3-30b-a3b"),
    ):
        k, x = m(prefix)
        out += _vllm(
            k,
            {
                "engine_version": version,
                "model": {"source": "preset", "id": preset_id},
                "max_model_len": 4096,
            },
            None,
            x,
        )
    return out


def summary(rows: list[Check]) -> list[tuple[str, str, int, float, float, int]]:
    """(engine, quantity, n, median |error|, max |error|, predictions below the measurement)."""
    out = []
    for engine, quantity in sorted({(r.engine, r.quantity) for r in rows}):
        errs = [r.error for r in rows if (r.engine, r.quantity) == (engine, quantity)]
        out.append(
            (
                engine,
                quantity,
                len(errs),
                statistics.median(abs(e) for e in errs),
                max(abs(e) for e in errs),
                sum(1 for e in errs if e < -1e-4),
            )
        )
    return out


def kv_errors_by_release(rows: list[Check]) -> dict[str, list[float]]:
    """vLLM's KV-token errors grouped by minor release (``0.26`` for ``0.26.0``), in order."""
    by: dict[str, list[float]] = {}
    for r in rows:
        if (r.engine, r.quantity) == ("vllm", "KV tokens"):
            by.setdefault(".".join(r.version.split(".")[:2]), []).append(r.error)
    return dict(sorted(by.items(), key=lambda kv: tuple(int(p) for p in kv[0].split("."))))


ENGINE_WORDS = {"vllm": "vLLM", "sglang": "SGLang (where a desktop's hold is assumed)"}


def main(argv: list[str] | None = None) -> int:
    rows = checks()
    args = sys.argv[1:] if argv is None else argv
    if "--rows" in args:
        for r in rows:
            print(
                f"{r.log[:44]:<46}{r.quantity:<20}{r.measured:>12.2f}"
                f"{r.predicted:>12.2f} {r.unit:<7}{r.error:>+8.1%}"
            )
    band = [r for r in rows if r.quantity == BAND]
    rows = [r for r in rows if r.quantity != BAND]
    print(f"{'engine':<10}{'quantity':<20}{'n':>4}{'median':>9}{'max':>9}{'below':>7}")
    for engine, quantity, n, med, mx, below in summary([r for r in rows if not r.held_out_set]):
        print(f"{engine:<10}{quantity:<20}{n:>4}{med:>8.2%}{mx:>9.2%}{below:>7}")
    for engine in ("vllm", "sglang"):
        mine = [r for r in band if r.engine == engine]
        print(
            f"{ENGINE_WORDS[engine]} KV tokens inside kv_cache_tokens_band: "
            f"{sum(r.predicted for r in mine):.0f} of {len(mine)}"
        )
    fresh = [r for r in rows if r.fresh and not r.held_out_set]
    print("\nheld-out sets B, C, E, F, G, J and K (collected after the rules were fixed) alone:")
    for engine, quantity, n, med, mx, below in summary(fresh):
        print(f"{engine:<10}{quantity:<20}{n:>4}{med:>8.2%}{mx:>9.2%}{below:>7}")
    for name, title in (
        ("H", "llama.cpp and Ollama, collected after the GGUF rules were fixed"),
        ("I", "llama.cpp and Ollama, collected after the compute-buffer rules were rewritten"),
    ):
        print(f"\nheld-out set {name} ({title}):")
        for engine, quantity, n, med, mx, below in summary(
            [r for r in rows if r.held_out_set == name]
        ):
            print(f"{engine:<10}{quantity:<20}{n:>4}{med:>8.2%}{mx:>9.2%}{below:>7}")
    if "--by-version" in args:
        print("\nvLLM KV tokens by release (minor):")
        for v, e in kv_errors_by_release(rows).items():
            med, mx = statistics.median(abs(x) for x in e), max(abs(x) for x in e)
            print(f"{v:<8}{len(e):>4}{med:>8.2%}{mx:>9.2%}")
    band_b = [r for r in band if r.fresh and r.engine == "vllm"]
    print(
        "vLLM KV tokens inside kv_cache_tokens_band (sets B, C, E, F, G, J and K): "
        f"{sum(r.predicted for r in band_b):.0f} of {len(band_b)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
