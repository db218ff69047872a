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
engine leaves outside ``requested``. Each quantity is one function with its formula
(``quantities``); the constants that only a real run fixes come from the versioned calibration
(``data/vllm_calibration.json``, fitted on published runs by ``research/calibrate_vllm.py``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import msgspec

from ..arch import Arch
from ..layout import stages
from ..result import KVTokensBand
from ..spec import LLMServingWorkload, Parallelism, Precision, Quantization
from ..statics import StageStatic, stage_statics
from ..units import GiB
from . import kv
from .calibration import CALIBRATED_VERSION
from .engine_args import (
    Resolved,
    _layout,
    catalog_gpu,
    gpu_vendor,
    resolve,
    serving_quantization,
)
from .load import MLA_IMPORT_WORKSPACE_BYTES, load_memory
from .quantities import (
    activation_peak_bytes,
    baseline_bytes,
    cuda_graph_bytes,
    graph_bytes,
    non_torch_bytes,
    requested_bytes,
)
from .releases import engine_release
from .speculative import MTP_BLOCK_PART, NO_DRAFTER, Drafter, drafter

__all__ = [
    "ServingAccount",
    "StageAccount",
    "account",
    "free_at_start",
    "kv_band",
    "mla_import_workspaces",
    "stage_count",
]

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
    activation_low_bytes: int
    """The activation peak if the sampler takes its cheaper path where the release leaves that
    to the installation (0.10-0.11 with flashinfer installed: no sort); else the same."""
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
    draft_weights_bytes: int = 0
    """A speculative drafter's weights (last stage; not in ``weights_bytes``)."""
    draft_graph_bytes: int = 0
    """The drafter's CUDA graphs (in ``cuda_graph_bytes``)."""
    draft_parts: tuple[tuple[str, int], ...] = ()

    @property
    def weights_memory_bytes(self) -> int:
        """What vLLM logs as "Model loading took": allocated bytes of the load window (the
        drafter loads inside it)."""
        return (
            self.weights_bytes
            + self.draft_weights_bytes
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


def mla_import_workspaces(gpu_name: str) -> int:
    """How many 128 MiB MLA workspaces vLLM's backend selection allocates while the model loads
    (``load.py``): FlashInfer-MLA's on every CUDA GPU, CUTLASS-MLA's too on compute capability
    10.x, none on ROCm. A name that matches no catalog GPU is taken as a CUDA GPU below 10.x."""
    g = catalog_gpu(gpu_name)
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
    w: LLMServingWorkload,
    arch: Arch,
    memory_total_bytes: int,
    gpu_name: str,
    memory_in_use_bytes: int = 0,
    driver: str | None = None,
) -> ServingAccount:
    """The engine's numbers on one GPU type, ``memory_in_use_bytes`` of which other processes
    hold, under the NVIDIA ``driver`` the request names (``software.driver_version``). Raises
    ``InvalidWorkload`` for a layout or setting vLLM rejects at configuration time (field
    relative to the workload)."""
    r = resolve(w, arch, memory_total_bytes, gpu_name, driver)
    par = _layout(arch, r)
    quant = serving_quantization(w)
    statics = _statics(arch, r.dtype, quant, par)
    loads = load_memory(arch, r.e, quant, r.tensor, r.pipeline, r.expert)
    workspace = (mla_import_workspaces(gpu_name) if arch.mla else 0) * MLA_IMPORT_WORKSPACE_BYTES
    hybrid = r.cal.hybrid_kv_cache_manager and not w.disable_hybrid_kv_cache_manager
    release = engine_release("vllm", w.engine_version).modelled
    draft = drafter(w, arch, release, r.tensor, r.pipeline, r.e, r.kv_bytes)
    if draft is not None and draft.method == "mtp":
        draft = _with_mtp_block(draft, arch, r.dtype, quant, par)
    groups = kv.kv_groups(
        arch,
        r.tensor,
        r.pipeline,
        r.kv_bytes,
        r.block_size,
        hybrid,
        draft.kv_layers if draft is not None else (),
    )
    # 0.34: on unless --kv-cache-memory is given (vllm/config/cache.py); an explicit
    # utilization only changes `requested`
    extensible = r.cal.extensible_kv_cache and w.kv_cache_memory_bytes is None
    margin_floor = (
        3 * EXTENSIBLE_MARGIN_FLOOR_BYTES
        if gpu_vendor(gpu_name) == "amd"
        else EXTENSIBLE_MARGIN_FLOOR_BYTES
    )
    util = utilization(w, r)
    requested = requested_bytes(memory_total_bytes, util, r.cal.requested_ceil)
    nt, nt_comm = non_torch_bytes(r)
    context, nccl = baseline_bytes(r)
    out = []
    for st, load in zip(statics, loads, strict=True):
        act = activation_peak_bytes(arch, st, r)
        act_low = activation_peak_bytes(arch, st, r, sort=False) if r.sampler_may_skip_sort else act
        # the drafter lives on the last pipeline stage (the n-gram one has no layers)
        here = draft if draft is not None and st.stage.last else NO_DRAFTER
        draft_weights = here.weights_bytes
        # captured at every size the target is (capture_model runs its dummy_run at each)
        draft_graphs = graph_bytes(here.layers, r, w.enforce_eager)
        graphs = cuda_graph_bytes(st, r, w.enforce_eager) + draft_graphs
        rope = load.rotary_bytes  # the stage's own tables: each stage is its own process
        available = (
            requested
            - (st.weights_bytes + st.metadata_bytes + rope + draft_weights)
            - load.rounding_bytes
            - workspace
            - act
            - nt
        )
        if r.cal.cudagraph_in_budget:
            available -= graphs
        if r.cal.baseline_in_budget:
            available -= context + nccl
        elif r.cal.nccl_in_budget:
            available -= nccl
        if extensible:
            # 0.34 extensible KV cache, sized after warm-up and graph capture
            # (vllm/v1/worker/extensible_kv_cache.py:613):
            #   available = min(requested - non_kv_used, headroom - margin) - transient peak
            # non_kv_used: what stays allocated since the init snapshot (weights, non-torch,
            # graphs); headroom: the free memory then; margin max(1 GiB, 0.75 x peak)
            used = (
                st.weights_bytes
                + st.metadata_bytes
                + rope
                + draft_weights
                + load.rounding_bytes
                + workspace
                + nt
                + graphs
            )
            headroom = memory_total_bytes - memory_in_use_bytes - context - nccl - used
            margin = max(margin_floor, act * 3 // 4)
            available = min(requested - used, headroom - margin) - act
        if w.kv_cache_memory_bytes is not None:
            # --kv-cache-memory: the pool's size as given, no profiling budget
            # (vllm/v1/worker/gpu_worker.py determine_available_memory)
            available = w.kv_cache_memory_bytes
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
                activation_low_bytes=act_low,
                non_torch_bytes=nt,
                non_torch_comm_bytes=nt_comm,
                cuda_context_bytes=context,
                nccl_init_bytes=nccl,
                cuda_graph_bytes=graphs,
                requested_bytes=requested,
                available_bytes=available,
                group_size=groups.stage_group_size(i),
                needed_bytes=kv.needed_bytes(groups, i, r.max_model_len, r.max_num_batched_tokens),
                draft_weights_bytes=draft_weights,
                draft_graph_bytes=draft_graphs,
                draft_parts=here.parts,
            )
        )
    blocks = min(
        kv.num_blocks(max(s.available_bytes, 0), groups.page_bytes, s.group_size) for s in out
    )
    tokens = kv.num_tokens(blocks, groups)
    concurrency = kv.max_concurrency(blocks, groups, r.max_model_len, r.max_num_batched_tokens)
    # checked in init_device, before the weights load: it comes first
    free = free_at_start(memory_total_bytes, memory_in_use_bytes, out[0])
    room = memory_total_bytes - memory_in_use_bytes
    reason = None
    # 0.34's extensible KV cache skips the check: its budget is only a cap
    # (vllm/v1/worker/utils.py request_memory, lines 783-786 of 0.34.0)
    if memory_in_use_bytes and free < requested and not extensible:
        reason = (
            f"free memory on the device at start ({_gib(free)}) is less than "
            f"gpu_memory_utilization x total ({_gib(requested)}): other processes hold "
            f"{_gib(memory_in_use_bytes)} (lower gpu_memory_utilization to at most "
            f"{math.floor(free * 1000 / memory_total_bytes) / 1000:.3f}, or free the GPU)"
        )
    reason = reason or _refusal(out, r, arch)
    if reason is None and not extensible:
        pool = blocks * groups.page_bytes
        for sa in out:
            resident = (
                sa.cuda_context_bytes
                + sa.nccl_init_bytes
                + sa.weights_memory_bytes
                + sa.non_torch_bytes
                + pool * sa.group_size
                + sa.cuda_graph_bytes
            )
            if resident > room and not r.cal.cudagraph_in_budget:
                reason = (
                    f"the CUDA context, NCCL and CUDA graphs outside the engine's budget need "
                    f"{_gib(resident - room)} more than the GPU has free once the KV cache is "
                    "allocated: out of memory while capturing CUDA graphs (lower "
                    "gpu_memory_utilization or set enforce_eager)"
                )
                break
    if reason is None and w.kv_cache_memory_bytes is not None:
        pool = blocks * groups.page_bytes
        for sa in out:
            used = (
                sa.weights_memory_bytes
                + sa.activation_bytes
                + sa.non_torch_bytes
                + sa.cuda_context_bytes
                + sa.nccl_init_bytes
                + sa.cuda_graph_bytes
                + pool * sa.group_size
            )
            if used > room:
                reason = (
                    f"--kv-cache-memory {_gib(w.kv_cache_memory_bytes)}: with the weights, "
                    f"activations, CUDA context and graphs it needs {_gib(used)} of the "
                    f"{_gib(room)} the GPU has free (out of memory while allocating the KV "
                    "cache)"
                )
                break
    return ServingAccount(
        r, groups, tuple(out), blocks, tokens, concurrency, reason is None, reason
    )


EXTENSIBLE_MARGIN_FLOOR_BYTES = 1 << 30
"""vllm/v1/worker/extensible_kv_cache.py:64 KV_CACHE_MARGIN_FLOOR_BYTES (CUDA; 3 GiB on ROCm)."""


def _with_mtp_block(
    d: Drafter, arch: Arch, dtype: str, quant: Quantization | None, par: Parallelism
) -> Drafter:
    """An MTP drafter with its decoder layers' bytes: ``d.layers`` layers of the target's last
    kind, quantized and split over the GPUs as the target's own (its statics, one stage)."""
    (layer, _), n = arch.layer_runs[-1], d.layers
    block_arch = dataclasses.replace(
        arch,
        num_layers=n,
        layer_runs=((layer, n),),
        embeddings=(),
        head=(),
        extras=(),
        stored_top=(),
        checkpoint_only_params=0,
        mtp_layers=0,
    )
    st = _statics(block_arch, dtype, quant, msgspec.structs.replace(par, pipeline=1))[0]
    block = st.weights_bytes + st.metadata_bytes
    return dataclasses.replace(
        d, weights_bytes=d.weights_bytes + block, parts=((MTP_BLOCK_PART, block), *d.parts)
    )


def utilization(w: LLMServingWorkload, r: Resolved) -> float:
    """The request's gpu_memory_utilization, or the release's default (0.9; 0.92 from 0.20;
    1.0 with 0.34's extensible KV cache)."""
    if w.gpu_memory_utilization is not None:
        return w.gpu_memory_utilization
    return 1.0 if r.cal.extensible_kv_cache else r.cal.gpu_memory_utilization_default


def free_at_start(memory_total_bytes: int, memory_in_use_bytes: int, s: StageAccount) -> int:
    """The free memory vLLM's init snapshot sees (after its CUDA context and NCCL), which must
    hold the requested share (``vllm/v1/worker/utils.py`` ``request_memory``)."""
    return memory_total_bytes - memory_in_use_bytes - s.cuda_context_bytes - s.nccl_init_bytes


def _gib(b: int) -> str:
    return f"{b / GiB:.2f} GiB"


def _refusal(stages_: list[StageAccount], r: Resolved, arch: Arch) -> str | None:
    """Why vLLM would refuse to start, in its own words, or None."""
    if r.unsupported is not None:
        return r.unsupported
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


def _blocks(a: ServingAccount, delta: int, cheaper_sampler: bool = False) -> int:
    """KV blocks if every stage's budget were ``delta`` bytes larger (and, with
    ``cheaper_sampler``, larger by what the sampler's cheaper path leaves)."""
    return min(
        kv.num_blocks(
            max(
                s.available_bytes
                + delta
                + (s.activation_bytes - s.activation_low_bytes if cheaper_sampler else 0),
                0,
            ),
            a.groups.page_bytes,
            s.group_size,
        )
        for s in a.stages
    )


def _on_calibrated_gpu(gpu_name: str) -> bool:
    g = catalog_gpu(gpu_name)
    return g is not None and g.id == CALIBRATED_GPU


CALIBRATED_GPU = "h100-sxm5-80gb"
"""The GPU type of the calibrated release's launches."""


def kv_band(
    w: LLMServingWorkload,
    a: ServingAccount,
    gpu_name: str,
    held: tuple[ServingAccount, ServingAccount, str] | None = None,
) -> KVTokensBand | None:
    """The KV tokens (and the concurrency at the low end) if every stage's KV budget were ``U``
    bytes smaller or larger, ``U`` the largest gap between predicted and printed budgets on
    published launches of the same kind: ``kv_band_calibrated_bytes`` for the calibrated
    release on its GPU type, ``kv_band_transfer_bytes`` for any other release or GPU. None with
    ``--kv-cache-memory``: the pool is given. The low end's concurrency is rounded down, so a
    verdict read from it never rounds up across a target. ``held``: the accounts the low and
    the high end take (an assumed hold of other processes at its high and its low end; a
    driver before R550) and the basis's words for them; none at the low end where the engine
    would not start."""
    if w.kv_cache_memory_bytes is not None:
        return None
    r = a.resolved
    calibrated = r.cal.version == CALIBRATED_VERSION and _on_calibrated_gpu(gpu_name)
    u = round(r.cal.c("kv_band_calibrated_bytes" if calibrated else "kv_band_transfer_bytes"))
    more, less = (a, a) if held is None else held[:2]
    low_blocks = _blocks(more, -u) if more.would_start else 0
    low_conc = kv.max_concurrency(low_blocks, a.groups, r.max_model_len, r.max_num_batched_tokens)
    basis = f"KV budget +/- {u / GiB:.2f} GiB per GPU: the largest gap between predicted and " + (
        f"printed budgets over the {CALIBRATED_VERSION} H100 launches it was fitted on"
        if calibrated
        else "printed budgets over published launches of other releases and GPUs"
    )
    cheaper = any(s.activation_low_bytes < s.activation_bytes for s in a.stages)
    if cheaper:
        basis += (
            "; the high end also takes the sampler without a sort (flashinfer installed, as in "
            "vLLM's Docker image), the estimate the torch.sort path of a pip install"
        )
    if held is not None:
        basis += f"; {held[2]}"
    return KVTokensBand(
        low=kv.num_tokens(low_blocks, a.groups),
        high=kv.num_tokens(_blocks(less, u, cheaper), a.groups),
        max_concurrency_low=math.floor(low_conc * 10_000) / 10_000,
        basis=basis,
    )
