"""Versioned vLLM engine constants, loaded once from ``data/vllm_calibration.json``.

Every constant carries its provenance: the calibrate-split runs of
``research/data/vllm_runs.json`` it was fitted on (by ``research/calibrate_vllm.py``, which
writes the file), or the source line it follows. A request names the engine version; the
allowed set is the file's versions.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

import msgspec

from ..data import data_file

__all__ = [
    "CALIBRATED_VERSION",
    "Constant",
    "EngineCalibration",
    "VLLMRelease",
    "calibration",
    "vllm_release",
    "vllm_releases",
]


TopKTopP = Literal["flashinfer_if_installed", "torch_sort", "triton"]
CudagraphSteps = Literal["8", "8_then_16"]


class Constant(msgspec.Struct, frozen=True, kw_only=True):
    value: float
    unit: str
    provenance: str
    fitted_on: tuple[str, ...] = ()
    """Run ids (split ``calibrate``) the value was fitted on; empty for source-derived values."""


class Defaults(msgspec.Struct, frozen=True, kw_only=True):
    """Engine defaults of ``max_num_seqs`` / ``max_num_batched_tokens`` by entrypoint, on GPUs of
    at least ``large_gpu_min_bytes`` that are not A100s, and on the others
    (vllm/engine/arg_utils.py ``get_batch_defaults``)."""

    large_gpu_min_bytes: int
    large_gpu_excluded: tuple[str, ...]
    max_num_seqs_large: int
    max_num_seqs_small: int
    max_num_batched_tokens_large: dict[str, int]
    max_num_batched_tokens_small: dict[str, int]
    block_size: int
    source: str
    xlarge_gpu_min_bytes: int | None = None
    """From 0.28: GPUs of at least this size get the xlarge tier (both entrypoints)."""
    max_num_seqs_xlarge: int | None = None
    max_num_batched_tokens_xlarge: dict[str, int] | None = None


class VLLMRelease(msgspec.Struct, frozen=True, kw_only=True):
    """One vLLM minor release's memory rules, read from its released source
    (``data/vllm_releases.json``, written by ``research/vllm_releases.py`` from
    research/data/vllm_versions.json; research/vllm_versions.md quotes each line)."""

    version: str
    released: str | None
    cudagraph: Literal["outside", "estimated_logged", "estimated_subtracted"]
    """CUDA graphs captured after the KV cache and outside the budget; profiled and only
    logged; profiled and subtracted from the KV budget."""
    kv_cache_memory_flag: bool
    """``--kv-cache-memory`` exists."""
    hybrid_kv_cache_manager: bool
    defaults: Defaults
    summary: str
    sources: tuple[str, ...] = ()
    gpu_memory_utilization_default: float = 0.9
    requested_ceil: bool = True
    """``ceil(total x util)`` (0.14 on); before, the unrounded float product."""
    nccl_in_budget: bool = False
    """The init snapshot precedes NCCL's initialisation (0.10): its buffers count in non_kv."""
    extensible_kv_cache: bool = False
    """0.34: the KV cache is sized after warm-up and CUDA-graph capture from measured free
    memory (vllm/v1/worker/extensible_kv_cache.py), utilization default 1.0."""
    top_k_top_p: TopKTopP = "triton"
    """How the profile's dummy sampler run (top-k and top-p set) filters the logits
    (``vllm/v1/sample/ops/topk_topp_sampler.py``): ``flashinfer_if_installed`` (0.10-0.11:
    FlashInfer's kernels when the optional flashinfer package is installed, else a full
    ``torch.sort``), ``torch_sort`` (0.12-0.16: FlashInfer only with
    VLLM_USE_FLASHINFER_SAMPLER=1), ``triton`` (0.17 on: a Triton kernel, no sort)."""
    moe_workspace_persistent: bool = True
    """The fused-MoE scratch outlives the layer (0.14 on: the unquantized method runs
    ``FusedMoEModularKernel``, whose buffers come from the worker's workspace manager), so it is
    still allocated when the profile's sampler runs; before, ``fused_experts_impl`` allocates
    and frees it per call."""
    cudagraph_steps: CudagraphSteps = "8_then_16"
    """The default CUDA-graph capture sizes (``_set_cudagraph_sizes``): ``8`` (0.10-0.11:
    ``[1, 2, 4]`` and multiples of 8 up to the largest), ``8_then_16`` (0.12 on: steps of 16
    from 256, ``[1, 2, 4]`` only up to the largest); the largest is ``min(max_num_seqs x 2,
    512)``, then only sizes up to ``max_num_batched_tokens``."""
    cudagraph_largest_blackwell: int | None = None
    """The largest default capture size on compute capability 10.x (0.28 on: 1024)."""
    full_decode_graphs: bool = True
    """FULL_AND_PIECEWISE (0.11 on): a FULL decode graph for each capture size up to
    ``max_num_seqs`` besides the piecewise graph of every size (0.10: piecewise only)."""
    cudagraph_appends_batched_tokens: bool = False
    """0.21 on: ``max_num_batched_tokens`` is a capture size too when within the largest."""
    cudagraph_appends_max_num_seqs: bool = False
    """0.31 on: ``max_num_seqs`` is a capture size too when within the largest."""


class EngineCalibration(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    accounting: Literal["v1"]
    description: str
    hybrid_kv_cache_manager: bool
    """Sliding-window layers get their own KV-cache groups (vLLM >= 0.10); otherwise they are
    cached as full attention when the model also has full-attention layers."""
    cudagraph_in_budget: bool
    """CUDA-graph memory is subtracted from the KV budget
    (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)."""
    baseline_in_budget: bool
    """The CUDA context and NCCL initialisation (before the baseline snapshot) count against
    ``gpu_memory_utilization``."""
    defaults: Defaults
    constants: dict[str, Constant]
    gpu_memory_utilization_default: float = 0.9
    requested_ceil: bool = True
    nccl_in_budget: bool = False
    extensible_kv_cache: bool = False
    top_k_top_p: TopKTopP = "triton"
    moe_workspace_persistent: bool = True
    cudagraph_steps: CudagraphSteps = "8_then_16"
    cudagraph_largest_blackwell: int | None = None
    full_decode_graphs: bool = True
    cudagraph_appends_batched_tokens: bool = False
    cudagraph_appends_max_num_seqs: bool = False

    def c(self, name: str) -> float:
        return self.constants[name].value


class _File(msgspec.Struct, frozen=True):
    schema: Literal["vrambudget.vllm_calibration/1"]
    default_version: str
    versions: tuple[EngineCalibration, ...]
    note: str = ""


class _Releases(msgspec.Struct, frozen=True):
    schema: Literal["vrambudget.vllm_releases/1"]
    releases: tuple[VLLMRelease, ...]
    note: str = ""


@cache
def _file() -> _File:
    return data_file("vllm_calibration.json", _File)


@cache
def vllm_releases() -> tuple[VLLMRelease, ...]:
    return data_file("vllm_releases.json", _Releases).releases


def vllm_release(version: str) -> VLLMRelease:
    for r in vllm_releases():
        if r.version == version:
            return r
    raise KeyError(version)


CALIBRATED_VERSION: str = _file().default_version
"""The release the constants were fitted on (published launch logs)."""


@cache
def calibration(version: str) -> EngineCalibration:
    """The accounting of a modelled release: its own rules (defaults, CUDA-graph placement,
    hybrid KV manager) with the constants fitted on the calibrated release's launches
    (the only release with enough published logs; docs/SERVING.md says what that costs)."""
    base = next(v for v in _file().versions if v.version == CALIBRATED_VERSION)
    r = vllm_release(version)
    description = base.description
    if version != CALIBRATED_VERSION:
        description = (
            f"vLLM {version} (V1 engine): {r.summary}; constants fitted on "
            f"{CALIBRATED_VERSION} launches (research/vllm_versions.md)"
        )
    return msgspec.structs.replace(
        base,
        version=version,
        description=description,
        hybrid_kv_cache_manager=r.hybrid_kv_cache_manager,
        cudagraph_in_budget=r.cudagraph == "estimated_subtracted",
        defaults=r.defaults,
        gpu_memory_utilization_default=r.gpu_memory_utilization_default,
        requested_ceil=r.requested_ceil,
        nccl_in_budget=r.nccl_in_budget,
        extensible_kv_cache=r.extensible_kv_cache,
        top_k_top_p=r.top_k_top_p,
        moe_workspace_persistent=r.moe_workspace_persistent,
        cudagraph_steps=r.cudagraph_steps,
        cudagraph_largest_blackwell=r.cudagraph_largest_blackwell,
        full_decode_graphs=r.full_decode_graphs,
        cudagraph_appends_batched_tokens=r.cudagraph_appends_batched_tokens,
        cudagraph_appends_max_num_seqs=r.cudagraph_appends_max_num_seqs,
    )
