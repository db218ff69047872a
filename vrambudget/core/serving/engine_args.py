"""The workload's vLLM engine settings: ``--dtype auto``, the storage layout of each
``--quantization`` method, the ``EngineArgs`` defaults of the calibrated version and what vLLM
checks at configuration time."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import msgspec
from msgspec import UNSET

from ..arch import Arch
from ..catalog import GPU, match_gpu
from ..deployed import (
    checkpoint_of,
    checkpoint_quantization,
    has_headers,
    stored_bytes_source,
    without_headers,
)
from ..dtypes import bytes_of, float_dtype
from ..errors import InvalidWorkload
from ..host import DEFAULT_DISK, host_and_disk
from ..layout import check_layout
from ..resolved import ResolvedModel
from ..result import DeployedFormat, DiskBudget, HostBudget
from ..spec import (
    AWQ,
    FP8,
    GPTQ,
    DiskOptions,
    InferenceWorkload,
    Int8,
    LLMServingWorkload,
    Parallelism,
    Precision,
    Quantization,
    ServingQuantization,
)
from .calibration import EngineCalibration, calibration, vllm_release
from .driver import graph_driver_factor
from .releases import engine_release


def vllm_release_has_kv_memory(version: str) -> bool:
    from .calibration import CALIBRATED_VERSION

    return version == CALIBRATED_VERSION or vllm_release(version).kv_cache_memory_flag


__all__ = [
    "PCIE_DISTRIBUTED_BYTES",
    "Fabric",
    "Resolved",
    "catalog_gpu",
    "deploy_serving",
    "gpu_vendor",
    "model_dtype",
    "pcie_cost",
    "quantization_words",
    "resolve",
    "serving_format",
    "serving_host_and_disk",
    "serving_quantization",
    "tp_fabric",
    "weights_quantization",
]


def model_dtype(w: LLMServingWorkload) -> str:
    """``--dtype auto``: float16 checkpoints stay float16, everything else (bfloat16, and
    float32 checkpoints, which vLLM downcasts) runs in bfloat16 (vllm/config/model.py
    ``_get_and_verify_dtype``)."""
    if w.dtype != "auto":
        dtype = float_dtype(w.dtype)
        assert dtype is not None, w.dtype  # the schema allows bfloat16, float16, float32
        return dtype
    ckpt = checkpoint_of(w.model)
    return "fp16" if ckpt is not None and ckpt.dtype == "fp16" else "bf16"


def serving_quantization(w: LLMServingWorkload) -> Quantization | None:
    """The weights' storage as vLLM loads this deployment: the request's ``--quantization``,
    or -- left out -- the checkpoint's ``quantization_config`` (vLLM reads it from the config:
    ``vllm/config/model.py`` ``_verify_quantization``), stored as the checkpoint stores it."""
    if w.quantization is UNSET:
        q = checkpoint_quantization(w.model)
        return q.scheme if q is not None else None
    return weights_quantization(w.quantization)


def quantization_words(w: LLMServingWorkload) -> str | None:
    """The deployment's quantization in the answer's words (the method, or the checkpoint's)."""
    if w.quantization is UNSET:
        q = checkpoint_quantization(w.model)
        return q.summary if q is not None else None
    return w.quantization.method if w.quantization is not None else None


def deploy_serving(w: LLMServingWorkload) -> LLMServingWorkload:
    """``w`` with a checkpoint's stored bytes dropped when vLLM loads it in another format
    (a float32 checkpoint downcast by ``--dtype auto``, ``--quantization fp8`` applied at
    load): the bytes are then computed from the shapes."""
    m = w.model
    if not isinstance(m, ResolvedModel) or not has_headers(m):
        return w
    ckpt = checkpoint_of(m)
    same_quant = w.quantization is UNSET
    same_dtype = (
        ckpt is None
        or ckpt.dtype is None
        or (ckpt.quantization is not None)
        or (model_dtype(w) == ckpt.dtype)
    )
    if same_quant and same_dtype:
        return w
    return msgspec.structs.replace(w, model=without_headers(m))


def serving_format(w: LLMServingWorkload, dtype: str) -> DeployedFormat:
    """What the engine runs the model in, and whether each choice is the checkpoint's."""
    ckpt = checkpoint_of(w.model)
    from_ckpt = w.quantization is UNSET and ckpt is not None and ckpt.quantization is not None
    words = quantization_words(w)
    return DeployedFormat(
        weights=dtype,
        compute=dtype,
        quantization=words,
        weights_from="checkpoint" if ckpt is not None and ckpt.dtype == dtype else "request",
        quantization_from="checkpoint" if from_ckpt else ("request" if words else "none"),
        stored_bytes=stored_bytes_source(w.model),
    )


def serving_host_and_disk(
    w: LLMServingWorkload,
    arch: Arch,
    dtype: str,
    tensor: int,
    pipeline: int = 1,
    data: int = 1,
    disk: DiskOptions = DEFAULT_DISK,
) -> tuple[HostBudget, DiskBudget]:
    """Host RAM and disk of a served checkpoint: those of the same model as an inference
    workload in the engine's dtype and quantization (``disk``: which copies of its files)."""
    shadow = InferenceWorkload(
        model=w.model,
        precision=Precision(
            weights=dtype,  # type: ignore[arg-type]
            compute=dtype,  # type: ignore[arg-type]
            quantization=serving_quantization(w),
        ),
        parallelism=Parallelism(tensor=tensor, pipeline=pipeline, data=data),
    )
    return host_and_disk(((shadow, arch),), disk)


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


Fabric = Literal["nvlink", "pcie", "no_p2p"]
"""What a tensor-parallel group all-reduces over: NVLink-class links, PCIe with peer access, or
no peer access at all (across nodes, or P2P disabled by the host)."""


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
    fabric: Fabric = "nvlink"
    """What tensor parallelism all-reduces over on this GPU type (:func:`tp_fabric`)."""
    plain_awq: bool = False
    """vLLM's own AWQ kernel runs, not Marlin (:func:`awq_kernel`)."""
    unsupported: str | None = None
    """Why vLLM refuses this deployment on this GPU type, in its own words (a quantization
    method the GPU's compute capability lacks), or None."""
    sampler_sort: bool = False
    """The profile's warm-up sampler sorts the vocabulary (:func:`sampler_sorts`)."""
    sampler_may_skip_sort: bool = False
    """The release leaves the sort to the installation (0.10-0.11 without flashinfer_sampler):
    the KV band's high end takes the path without it."""
    cuda_graphs: int = 0
    """How many CUDA graphs the engine captures unless ``enforce_eager``
    (:func:`cudagraph_sizes`: piecewise + FULL decode)."""
    graph_factor: float = 1.0
    """The driver's CUDA-graph memory over a current driver's
    (:func:`~.driver.graph_driver_factor`)."""


MARLIN_GROUP_SIZES = (-1, 32, 64, 128)
"""``marlin_utils.py`` ``MARLIN_SUPPORTED_GROUP_SIZES`` (vLLM 0.10-0.34)."""
AWQ_MIN_CAPABILITY = 75
"""``awq.py`` ``AWQConfig.get_min_capability``: Turing or newer."""
MARLIN_MIN_CAPABILITY = 80
"""``marlin_utils.py`` ``query_marlin_supported_quant_types``: no Marlin types below 8.0."""


def _capability(g: GPU | None) -> int | None:
    if g is None or g.vendor != "nvidia" or not g.compute_capability:
        return None
    major, _, minor = g.compute_capability.partition(".")
    return int(major) * 10 + int(minor or 0)


def awq_kernel(w: LLMServingWorkload, gpu_name: str) -> Literal["awq", "awq_marlin"] | None:
    """Which AWQ kernel vLLM runs for this deployment on this GPU type (None: not AWQ).

    ``--quantization awq`` named keeps vLLM's own kernel (``awq_marlin.py``
    ``override_quantization_method``: only an unset, ``marlin`` or ``awq_marlin`` flag converts).
    A detected AWQ checkpoint converts to Marlin when ``is_awq_marlin_compatible`` holds: a CUDA
    GPU of compute capability 8.0 or newer and a Marlin group size; otherwise (T4, ROCm, group
    size 256) the plain kernel runs. A GPU the catalog does not know is taken as Marlin-capable."""
    if isinstance(w.quantization, ServingQuantization):
        return "awq" if w.quantization.method == "awq" else None
    if w.quantization is not UNSET:
        return None
    q = checkpoint_quantization(w.model)
    if q is None or not isinstance(q.scheme, AWQ):
        return None
    g = catalog_gpu(gpu_name)
    if g is not None and g.vendor != "nvidia":
        return "awq"
    cap = _capability(g)
    if (cap is not None and cap < MARLIN_MIN_CAPABILITY) or (
        q.scheme.group_size not in MARLIN_GROUP_SIZES
    ):
        return "awq"
    return "awq_marlin"


def _unsupported(w: LLMServingWorkload, kernel: str | None, gpu_name: str) -> str | None:
    """vLLM's refusal of a quantization method below its minimum capability
    (``vllm/config/vllm.py`` ``_get_quantization_config``) and of a dtype the plain AWQ kernel
    lacks (``awq.py`` ``get_supported_act_dtypes``: float16 only), in its words."""
    if kernel != "awq":
        return None
    cap = _capability(catalog_gpu(gpu_name))
    if cap is not None and cap < AWQ_MIN_CAPABILITY:
        return (
            "The quantization method awq is not supported for the current GPU. Minimum "
            f"capability: {AWQ_MIN_CAPABILITY}. Current capability: {cap}."
        )
    if w.dtype in ("bfloat16", "float32"):
        return (
            f"torch.{w.dtype} is not supported for quantization method awq. Supported dtypes: "
            "[torch.float16] (set dtype float16)"
        )
    return None


def sampler_sorts(top_k_top_p: str, flashinfer: bool | None) -> bool:
    """Whether the profile's dummy sampler run sorts the vocabulary for top-k / top-p
    (``apply_top_k_top_p``): not with ``VLLM_USE_FLASHINFER_SAMPLER=1`` (FlashInfer's kernels),
    not from 0.17 (a Triton kernel), always in 0.12-0.16 otherwise, and in 0.10-0.11 unless
    flashinfer is installed -- taken as not, ``pip install vllm``'s case: the safe side, more
    activation and fewer KV tokens."""
    if flashinfer:
        return False
    return top_k_top_p != "triton"


@lru_cache(maxsize=256)
def catalog_gpu(gpu_name: str) -> GPU | None:
    """The catalog GPU a device name is (:func:`~..catalog.match_gpu` on the name alone),
    looked up once per name: the engine rules read its vendor, capability and links."""
    return match_gpu(gpu_name, None, None)


def gpu_vendor(gpu_name: str) -> str:
    """The catalog GPU's vendor; a name that matches none is taken as an NVIDIA GPU."""
    g = catalog_gpu(gpu_name)
    return g.vendor if g is not None else "nvidia"


PCIE_DISTRIBUTED_BYTES = 180_664_402
"""A distributed start's device memory beyond the CUDA context (NCCL communicators, the custom
all-reduce's buffers) on GPUs without NVLink/NVSwitch, at most: 2 x RTX 3090 under SGLang
(a bridged pair, 0.5.12; research/data/sglang_startup_logs.json
mattbucci-2x3090-gemma4-12b-awq-tp2) printed 22.91 GiB free on rank 0 before loading, the
lower of its two ranks (SGLang takes the minimum over ranks): 25,327,697,920 - 24,599,425,188
(22.91 GiB) - 547,608,330 (the context) B. 2 x A100 80GB PCIe (SGLang 0.5.8) took less than
a context in all; 4 x L4 (0.4.3, held out) 0.32 GiB in all. Taken for SGLang on PCIe and for
either engine where the group has no peer access (NCCL's shared-memory and network transports
keep their buffers in host memory)."""


def pcie_cost(fabric: Fabric) -> bool:
    """Whether a tensor-parallel group on ``fabric`` pays PCIe's communication cost: on PCIe
    boards, and without peer access (no custom all-reduce either way beyond what PCIe launches
    showed, and NCCL through host memory), where NVLink-class boards pay more."""
    return fabric in ("pcie", "no_p2p")


def tp_fabric(gpu_name: str, peer_access: bool | None = None) -> Fabric:
    """``pcie`` for a catalog GPU whose GPUs reach each other over PCIe only (L4, L40S, A10G,
    RTX cards, T4, A100/H100 PCIe); ``nvlink`` for NVSwitch / NVLink / xGMI boards and for any
    GPU the catalog does not know (the larger tensor-parallel cost: the safe side). vLLM's
    custom all-reduce and its symmetric-memory all-reduce need peer access over a fast fabric
    (``custom_all_reduce.py``: off on more than two PCIe-only GPUs; ``symm_mem.py``: Hopper /
    Blackwell only), and NCCL's buffers follow the links it finds.

    ``no_p2p`` where the caller says the group has no peer access (``parallelism.peer_access``
    false: across nodes, or P2P disabled by the host), whatever the GPU type: vLLM 0.10.1
    ``distributed/device_communicators/custom_all_reduce.py`` lines 83-88 and 146-151 disable
    the custom all-reduce ("spans across nodes", "lacks GPU P2P capability"), and NCCL's
    shared-memory and network transports stage through host memory."""
    if peer_access is False:
        return "no_p2p"
    g = catalog_gpu(gpu_name)
    if g is None or g.interconnect is None:
        return "nvlink"
    return "pcie" if g.interconnect.kind == "pcie" else "nvlink"


def cudagraph_sizes(
    cal: EngineCalibration, max_num_seqs: int, max_num_batched_tokens: int, gpu_name: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch sizes (tokens) of the piecewise and of the FULL decode CUDA graphs the release
    captures by default, without speculative decoding (decode query length 1).

    ``_set_cudagraph_sizes`` (vllm/config/__init__.py:551 in 0.11.0, vllm/config/vllm.py:988 in
    0.12.0, :1739 in 0.26.0): the largest size is ``min(max_num_seqs x 2, 512)`` (1024 on
    compute capability 10.x from 0.28); 0.10-0.11 take ``[1, 2, 4]`` and every multiple of 8 up
    to it, 0.12 on steps of 8 below 256 and of 16 from 256, ``[1, 2, 4]`` only up to it; sizes
    above ``max_num_batched_tokens`` are dropped; ``max_num_batched_tokens`` (0.21 on) and
    ``max_num_seqs`` (0.31 on) are added when within the largest. ``initialize_cudagraph_keys``
    (v1/cudagraph_dispatcher.py:63 in 0.11.0) adds a FULL graph for every size up to
    ``max_num_seqs`` (FULL_AND_PIECEWISE, the default from 0.11; 0.10 captures piecewise
    graphs only). The 0.26 log of research/data/engine_logs.json (max_num_seqs 16) prints
    "PIECEWISE=7 (largest=32), FULL=5 (largest=16)"; the 0.19 H100 sweep 51 and 51."""
    largest = 512
    cap = _capability(catalog_gpu(gpu_name))
    if cal.cudagraph_largest_blackwell and cap is not None and cap // 10 == 10:
        largest = cal.cudagraph_largest_blackwell
    largest = min(max_num_seqs * 2, largest)
    if cal.cudagraph_steps == "8":
        sizes = [1, 2, 4, *range(8, largest + 1, 8)]
    else:
        largest = min(largest, max_num_batched_tokens)
        sizes = [i for i in (1, 2, 4) if i <= largest]
        sizes += [*range(8, min(largest + 1, 256), 8), *range(256, largest + 1, 16)]
        # 0.21 on: the largest batch is captured too (vllm/config/vllm.py:1580 in 0.21.0);
        # 0.31 on: so is the largest decode batch (:2540 in 0.31.0)
        if cal.cudagraph_appends_batched_tokens and max_num_batched_tokens <= largest:
            sizes.append(max_num_batched_tokens)
        if cal.cudagraph_appends_max_num_seqs and max_num_seqs <= largest:
            sizes.append(max_num_seqs)
    piecewise = tuple(sorted(i for i in set(sizes) if i <= max_num_batched_tokens))
    full = tuple(i for i in piecewise if i <= max_num_seqs) if cal.full_decode_graphs else ()
    return piecewise, full


def resolve(
    w: LLMServingWorkload,
    arch: Arch,
    memory_total_bytes: int,
    gpu_name: str,
    driver: str | None = None,
) -> Resolved:
    """Fill the engine defaults (``EngineArgs.get_batch_defaults``: the larger batch on GPUs of
    at least 70 GiB that are not A100s) and check what vLLM checks at configuration time;
    ``driver`` is the request's ``software.driver_version``."""
    rel = engine_release("vllm", w.engine_version)
    cal = calibration(rel.modelled)
    if w.kv_cache_memory_bytes is not None and not vllm_release_has_kv_memory(rel.modelled):
        raise InvalidWorkload(
            "kv_cache_memory_bytes",
            f"--kv-cache-memory does not exist in vLLM {rel.modelled} (added in 0.11)",
        )
    d = cal.defaults
    large = memory_total_bytes >= d.large_gpu_min_bytes and not any(
        x in gpu_name.lower() for x in d.large_gpu_excluded
    )
    xlarge = (
        large
        and d.xlarge_gpu_min_bytes is not None
        and memory_total_bytes >= d.xlarge_gpu_min_bytes
    )
    if xlarge and d.max_num_seqs_xlarge and d.max_num_batched_tokens_xlarge:
        seqs = w.max_num_seqs or d.max_num_seqs_xlarge
        batched = w.max_num_batched_tokens or d.max_num_batched_tokens_xlarge[w.entrypoint]
    else:
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
    # A MoE model's routed experts are spread over the tensor x data ranks: whole experts with
    # expert parallelism; without it, over data-parallel replicas too, each expert split by
    # tensor parallelism over tensor x data ranks (model_executor/layers/fused_moe/config.py
    # FusedMoEParallelConfig.make, flatten_tp_across_dp_and_pcp, 0.28.0 lines 1208-1219), the
    # same bytes per GPU as whole experts, which is how it is counted where the experts divide
    # over those ranks; where they do not (vLLM needs only the expert width to), every GPU is
    # counted with every expert, whole (more than it holds)
    ranks = par.tensor * par.data
    ep = 1
    if arch.moe and (par.enable_expert_parallel or par.data > 1):
        split = par.enable_expert_parallel or arch.moe.num_experts % ranks == 0
        ep = ranks if split else 1
    dtype = model_dtype(w)
    e = bytes_of(dtype)
    kv_bytes = e if w.kv_cache_dtype == "auto" else 1
    kernel = awq_kernel(w, gpu_name)
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
        tp_fabric(gpu_name, par.peer_access),
        kernel == "awq",
        _unsupported(w, kernel, gpu_name),
        sampler_sorts(cal.top_k_top_p, w.flashinfer_sampler),
        cal.top_k_top_p == "flashinfer_if_installed" and w.flashinfer_sampler is None,
        sum(map(len, cudagraph_sizes(cal, seqs, batched, gpu_name))),
        1.0 if driver is None else graph_driver_factor(driver, gpu_vendor(gpu_name)),
    )


def _layout(arch: Arch, r: Resolved) -> Parallelism:
    # data: expert parallelism spreads the experts over tensor x data ranks (the data-parallel
    # replicas share them); an inference layout's statics read data nowhere else
    par = Parallelism(tensor=r.tensor, pipeline=r.pipeline, data=r.data, expert=r.expert)
    try:
        check_layout(arch, par)
    except InvalidWorkload as exc:
        field = {
            "parallelism.tensor": "parallelism.tensor",
            "parallelism.pipeline": "parallelism.pipeline",
        }.get(exc.field, "parallelism")
        raise InvalidWorkload(field, exc.message) from None
    return par
