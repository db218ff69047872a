"""vLLM's startup memory accounting, per GPU: what the engine subtracts from
``gpu_memory_utilization x total`` before the rest becomes the paged KV-cache pool.

vLLM v1 ``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``), inside
``memory_profiling`` (``vllm/utils/mem_utils.py``)::

    requested  = ceil(total x gpu_memory_utilization)            (init snapshot after NCCL init)
    non_kv     = weights + torch peak increase of profile_run + non-torch increase
    available  = requested - non_kv  [- CUDA-graph estimate when the version subtracts it]
    num_blocks = min over pipeline stages of available // page // group_size

The CUDA context and the NCCL communicators exist before the snapshot, and CUDA graphs are
captured after the KV cache is allocated (vLLM 0.19.0 default), so they live in the memory the
engine leaves outside ``requested``. Each quantity below is one function with its formula; the
constants that only a real run fixes come from the versioned calibration
(``data/vllm_calibration.json``, fitted on published runs by ``research/calibrate_vllm.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..arch import Arch
from ..catalog import match_gpu, preset
from ..dtypes import bytes_of
from ..errors import InvalidWorkload
from ..formulas.activations import inference_working_set
from ..layout import check_layout, stages
from ..spec import (
    AWQ,
    FP8,
    GPTQ,
    HFConfigModel,
    Int8,
    LLMServingWorkload,
    Parallelism,
    Precision,
    PresetModel,
    Quantization,
    ServingQuantization,
)
from ..statics import StageStatic, stage_statics
from ..units import GiB, ceil_div
from . import kv
from .calibration import EngineCalibration, calibration
from .load import MLA_IMPORT_WORKSPACE_BYTES, load_memory

__all__ = [
    "Resolved",
    "ServingAccount",
    "StageAccount",
    "account",
    "activation_peak_bytes",
    "cuda_graph_bytes",
    "model_dtype",
    "non_torch_bytes",
    "requested_bytes",
    "resolve",
    "weights_quantization",
]

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def model_dtype(w: LLMServingWorkload) -> str:
    """``--dtype auto``: float16 checkpoints stay float16, everything else (bfloat16, and
    float32 checkpoints, which vLLM downcasts) runs in bfloat16 (vllm/config/model.py
    ``_get_and_verify_dtype``)."""
    if w.dtype != "auto":
        return _DTYPES[w.dtype]
    config = None
    if isinstance(w.model, PresetModel):
        config = preset(w.model.id).config
    elif isinstance(w.model, HFConfigModel):
        config = w.model.config
    stored = getattr(config, "torch_dtype", None) if config is not None else None
    return "fp16" if stored in ("float16", "half") else "bf16"


def weights_quantization(q: ServingQuantization | None) -> Quantization | None:
    """The storage layout of each vLLM quantization method (``quantization.tensor_storage``):
    fp8 one fp32 scale per tensor (``Fp8LinearMethod``), per channel (compressed-tensors
    fp8-dynamic ``weight_scale`` of shape (out, 1)) or per 128 x 128 block; w8a8 int8 with fp32
    per-channel scales; 4-bit GPTQ / AWQ packed int32 with fp16 scales (compressed-tensors
    w4a16 stored like AWQ: packed int32 + per-group scales)."""
    if q is None:
        return None
    match q.method:
        case "fp8":
            return FP8(granularity="tensor")
        case "fp8_channel":
            return FP8(granularity="channel")
        case "fp8_block":
            return FP8(granularity="block", block_size=128)
        case "w8a8_int8":
            return Int8(scale_dtype="fp32")
        case "gptq":
            return GPTQ(bits=4, group_size=q.group_size)
        case "awq" | "w4a16":
            return AWQ(bits=4, group_size=q.group_size)
    raise AssertionError(q.method)


@dataclass(frozen=True, slots=True)
class Resolved:
    """The workload's engine settings once the version's defaults are filled in."""

    cal: EngineCalibration
    dtype: str
    e: int
    kv_bytes: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    tensor: int
    pipeline: int
    data: int
    expert: int


def resolve(w: LLMServingWorkload, arch: Arch, memory_total_bytes: int, gpu_name: str) -> Resolved:
    """Fill the engine defaults (``EngineArgs.get_batch_defaults``: the larger batch on GPUs of
    at least 70 GiB that are not A100s) and check what vLLM checks at configuration time."""
    cal = calibration(w.engine_version)
    d = cal.defaults
    large = memory_total_bytes >= d.large_gpu_min_bytes and not any(
        x in gpu_name.lower() for x in d.large_gpu_excluded
    )
    seqs = w.max_num_seqs or (d.max_num_seqs_large if large else d.max_num_seqs_small)
    table = d.max_num_batched_tokens_large if large else d.max_num_batched_tokens_small
    batched = w.max_num_batched_tokens or table[w.entrypoint]
    if batched < seqs:
        raise InvalidWorkload(
            "max_num_batched_tokens" if w.max_num_batched_tokens else "max_num_seqs",
            f"max_num_batched_tokens ({batched}) must be >= max_num_seqs ({seqs}) "
            "(vLLM SchedulerConfig)",
        )
    if arch.kind != "decoder":
        raise InvalidWorkload("model", "an llm_serving workload needs a decoder model")
    par = w.parallelism
    ep = par.tensor * par.data if (par.enable_expert_parallel and arch.moe) else 1
    dtype = model_dtype(w)
    e = bytes_of(dtype)
    kv_bytes = e if w.kv_cache_dtype == "auto" else 1
    return Resolved(
        cal,
        dtype,
        e,
        kv_bytes,
        w.block_size or d.block_size,
        w.max_model_len or arch.max_positions,
        seqs,
        batched,
        par.tensor,
        par.pipeline,
        par.data,
        ep,
    )


def _layout(arch: Arch, r: Resolved) -> Parallelism:
    par = Parallelism(tensor=r.tensor, pipeline=r.pipeline, expert=r.expert)
    try:
        check_layout(arch, par)
    except InvalidWorkload as exc:
        field = {
            "parallelism.tensor": "parallelism.tensor",
            "parallelism.pipeline": "parallelism.pipeline",
        }.get(exc.field, "parallelism")
        raise InvalidWorkload(field, exc.message) from None
    return par


# ------------------------------------------------------------------------- the quantities --


def requested_bytes(total: int, utilization: float) -> int:
    """``requested_memory = ceil(total x gpu_memory_utilization)`` (vllm/v1/worker/utils.py
    ``request_memory``), with the fraction taken to a millionth. H100 80GB HBM3 (85,030,… B,
    79.19 GiB) x 0.95 = 75.23 GiB."""
    ppm = round(utilization * 1_000_000)
    return ceil_div(total * ppm, 1_000_000)


def _moe_workspace(arch: Arch, st: StageStatic, tokens: int, e: int) -> int:
    """Fused-MoE intermediate caches of one layer (vllm/model_executor/layers/fused_moe
    ``fused_experts_impl``): ``cache13`` of ``T x top_k x max(2 f', h)`` and ``cache2`` of ``T x
    top_k x f'`` in the model dtype, live while the profile run's hidden states are sampled.
    Qwen3-30B-A3B, T 8,192: 8,192 x 8 x (2,048 + 768) x 2 = 369,098,752 B."""
    if arch.moe is None or not any(layer.moe for layer, _ in st.layer_kinds):
        return 0
    f = st.dims.f_expert
    return tokens * arch.moe.experts_per_token * (max(2 * f, arch.hidden_size) + f) * e


def activation_peak_bytes(arch: Arch, st: StageStatic, r: Resolved) -> int:
    """The torch peak increase of ``profile_run``: a dummy forward of ``T =
    max_num_batched_tokens`` tokens spread over ``S = min(max_num_seqs, T)`` requests, then (last
    stage) a dummy sampler run over ``S`` rows of the full vocabulary.

    forward = fwd_scale x working set of the largest layer
    (``formulas.activations.inference_working_set``:
              residual 4 T h e + max(attention, MLP))
              + pp_hidden x T x h x e on stages before the last (the intermediate tensors sent
              on: hidden states and residual)
    sampler = sampler_bytes_per_logit x S x V + sampler_hidden x T x h x e + MoE workspace
    peak    = max(forward, sampler) on the last stage, forward elsewhere

    Llama 3.1 8B, T 8,192, S 1,024 (H100 defaults): sampler 15.2 x 1,024 x 128,256 + 2 x 8,192 x
    4,096 x 2 = 2.13 GB > forward 0.97 GB; vLLM 0.19.0 logs 1.89 GiB.
    """
    c = r.cal.c
    T = r.max_num_batched_tokens
    S = min(r.max_num_seqs, T)
    q = ceil_div(T, S)
    ws = max(
        inference_working_set(layer, arch, st.dims, S, q, q, r.e, "flash")
        for layer, _ in st.layer_kinds
    )
    forward = math.ceil(c("forward_working_set_scale") * ws)
    if not st.stage.last:
        return forward + math.ceil(c("pp_hidden_copies") * T * arch.hidden_size * r.e)
    sampler = math.ceil(
        c("sampler_bytes_per_logit") * S * arch.vocab_size
        + c("sampler_hidden_copies") * T * arch.hidden_size * r.e
    )
    sampler += math.ceil(c("moe_workspace_scale") * _moe_workspace(arch, st, T, r.e))
    return max(forward, sampler)


def non_torch_bytes(r: Resolved) -> tuple[int, int]:
    """(non-torch increase during profiling, the part of it due to communication): cuBLAS and
    attention workspaces on one GPU; custom all-reduce / NCCL buffers with tensor parallelism;
    less with pipeline parallelism only (buffers already made before the snapshot). Calibrated
    per version and layout class."""
    c = r.cal.c
    base = round(c("non_torch_tp1_bytes"))
    if r.tensor >= 4:
        value = round(c("non_torch_tp4_bytes"))
    elif r.tensor >= 2:
        value = round(c("non_torch_tp2_bytes"))
    elif r.pipeline > 1:
        value = round(c("non_torch_pp_bytes"))
    else:
        value = base
    return value, max(value - base, 0)


def baseline_bytes(r: Resolved) -> tuple[int, int]:
    """(CUDA context, NCCL communicators) that exist before the engine's memory snapshot."""
    c = r.cal.c
    nccl = round(c("nccl_init_bytes")) if r.tensor > 1 or r.pipeline > 1 else 0
    return round(c("cuda_context_bytes")), nccl


def cuda_graph_bytes(st: StageStatic, r: Resolved, eager: bool) -> int:
    """Memory of the captured CUDA graphs (piecewise + full, up to 512 tokens): ``a + b x
    layers on the stage``, fitted per version; 0 with ``enforce_eager``."""
    if eager:
        return 0
    c = r.cal.c
    return max(
        round(c("cuda_graph_base_bytes") + c("cuda_graph_per_layer_bytes") * st.stage.num_layers), 0
    )


# ---------------------------------------------------------------------------- the account --


@dataclass(frozen=True, slots=True)
class StageAccount:
    stage: int
    num_layers: int
    weights_bytes: int
    metadata_bytes: int
    rotary_bytes: int
    load_rounding_bytes: int
    """Caching-allocator blocks beyond the parameters' bytes (``load.py``)."""
    load_workspace_bytes: int
    """Attention workspaces allocated while the model loads (MLA backends' imports)."""
    activation_bytes: int
    non_torch_bytes: int
    non_torch_comm_bytes: int
    cuda_context_bytes: int
    nccl_init_bytes: int
    cuda_graph_bytes: int
    requested_bytes: int
    available_bytes: int
    group_size: int
    needed_bytes: int
    """KV bytes one request of max_model_len needs on this stage."""

    @property
    def weights_memory_bytes(self) -> int:
        """What vLLM logs as "Model loading took": allocated bytes of the load window."""
        return (
            self.weights_bytes
            + self.metadata_bytes
            + self.load_rounding_bytes
            + self.load_workspace_bytes
        )


@dataclass(frozen=True, slots=True)
class ServingAccount:
    resolved: Resolved
    groups: kv.KVGroups
    stages: tuple[StageAccount, ...]
    num_blocks: int
    kv_tokens: int
    max_concurrency: float
    would_start: bool
    reason: str | None

    def pool_bytes(self, stage: StageAccount) -> int:
        return self.num_blocks * self.groups.page_bytes * stage.group_size


@lru_cache(maxsize=256)
def mla_import_workspaces(gpu_name: str) -> int:
    """How many 128 MiB MLA workspaces vLLM's backend selection allocates while the model loads
    (``load.py``): FlashInfer-MLA's on every CUDA GPU, CUTLASS-MLA's too on compute capability
    10.x, none on ROCm. A name that matches no catalog GPU is taken as a CUDA GPU below 10.x."""
    g = match_gpu(gpu_name, None, None)
    if g is None:
        return 1
    if g.vendor != "nvidia":
        return 0
    return 2 if (g.compute_capability or "").startswith("10.") else 1


@lru_cache(maxsize=2048)
def _statics(
    arch: Arch, dtype: str, quant: Quantization | None, par: Parallelism
) -> tuple[StageStatic, ...]:
    precision = Precision(weights=dtype, compute=dtype, quantization=quant)  # type: ignore[arg-type]
    return stage_statics(arch, precision, par, None)


def account(
    w: LLMServingWorkload, arch: Arch, memory_total_bytes: int, gpu_name: str
) -> ServingAccount:
    """The engine's numbers on one GPU type. Raises ``InvalidWorkload`` for a layout or setting
    vLLM rejects at configuration time (field relative to the workload)."""
    r = resolve(w, arch, memory_total_bytes, gpu_name)
    par = _layout(arch, r)
    quant = weights_quantization(w.quantization)
    statics = _statics(arch, r.dtype, quant, par)
    loads = load_memory(arch, r.e, quant, r.tensor, r.pipeline, r.expert)
    workspace = (mla_import_workspaces(gpu_name) if arch.mla else 0) * MLA_IMPORT_WORKSPACE_BYTES
    hybrid = r.cal.hybrid_kv_cache_manager and not w.disable_hybrid_kv_cache_manager
    groups = kv.kv_groups(arch, r.tensor, r.pipeline, r.kv_bytes, r.block_size, hybrid)
    requested = requested_bytes(memory_total_bytes, w.gpu_memory_utilization)
    nt, nt_comm = non_torch_bytes(r)
    context, nccl = baseline_bytes(r)
    out = []
    for st, load in zip(statics, loads, strict=True):
        act = activation_peak_bytes(arch, st, r)
        graphs = cuda_graph_bytes(st, r, w.enforce_eager)
        rope = load.rotary_bytes  # the stage's own tables: each stage is its own process
        available = (
            requested
            - (st.weights_bytes + st.metadata_bytes + rope)
            - load.rounding_bytes
            - workspace
            - act
            - nt
        )
        if r.cal.cudagraph_in_budget:
            available -= graphs
        if r.cal.baseline_in_budget:
            available -= context + nccl
        i = st.stage.index
        out.append(
            StageAccount(
                stage=i,
                num_layers=st.stage.num_layers,
                weights_bytes=st.weights_bytes + rope,
                metadata_bytes=st.metadata_bytes,
                rotary_bytes=rope,
                load_rounding_bytes=load.rounding_bytes,
                load_workspace_bytes=workspace,
                activation_bytes=act,
                non_torch_bytes=nt,
                non_torch_comm_bytes=nt_comm,
                cuda_context_bytes=context,
                nccl_init_bytes=nccl,
                cuda_graph_bytes=graphs,
                requested_bytes=requested,
                available_bytes=available,
                group_size=groups.stage_group_size(i),
                needed_bytes=kv.needed_bytes(groups, i, r.max_model_len, r.max_num_batched_tokens),
            )
        )
    blocks = min(
        kv.num_blocks(max(s.available_bytes, 0), groups.page_bytes, s.group_size) for s in out
    )
    tokens = kv.num_tokens(blocks, groups)
    concurrency = kv.max_concurrency(blocks, groups, r.max_model_len, r.max_num_batched_tokens)
    reason = _refusal(out, r, arch)
    return ServingAccount(
        r, groups, tuple(out), blocks, tokens, concurrency, reason is None, reason
    )


def _gib(b: int) -> str:
    return f"{b / GiB:.2f} GiB"


def _refusal(stages_: list[StageAccount], r: Resolved, arch: Arch) -> str | None:
    """Why vLLM would refuse to start, in its own words, or None."""
    if r.max_model_len > arch.max_positions:
        return (
            f"max_model_len {r.max_model_len} exceeds the model's max_position_embeddings "
            f"{arch.max_positions} (vLLM refuses unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )
    for s in stages_:
        where = f" on pipeline stage {s.stage}" if len(stages_) > 1 else ""
        if s.available_bytes <= 0:
            return (
                f"no available memory for the cache blocks{where}: weights, activation peak "
                f"and non-torch memory take {_gib(s.requested_bytes - s.available_bytes)} "
                f"of the {_gib(s.requested_bytes)} that gpu_memory_utilization allows"
            )
        if s.needed_bytes > s.available_bytes:
            return (
                f"one request of max_model_len {r.max_model_len} needs "
                f"{_gib(s.needed_bytes)} of KV cache{where}, more than the "
                f"{_gib(s.available_bytes)} available"
            )
    return None


def stage_count(arch: Arch, pipeline: int) -> int:
    return len(stages(arch, pipeline))
