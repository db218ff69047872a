"""The answer: a component-wise budget per device, plus host RAM and disk. Wire types."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .components import Component

__all__ = [
    "AllocatorCache",
    "Budget",
    "BudgetFit",
    "CalibrationUse",
    "Cheapest",
    "Compatibility",
    "CompatibilityVerdict",
    "CostRank",
    "DeployedFormat",
    "DeviceBudget",
    "DeviceFit",
    "DeviceSummary",
    "DiskBudget",
    "EngineDetails",
    "ErrorBand",
    "ExcludedDevice",
    "FitResponse",
    "GGUFDetails",
    "GGUFDeviceBuffers",
    "GPUFit",
    "HostBudget",
    "Item",
    "KVTokensBand",
    "LatencyEstimate",
    "LayoutFit",
    "LayoutInterconnect",
    "Line",
    "MIGFit",
    "Maxima",
    "ModelOrigin",
    "OllamaPeer",
    "OverheadOrigin",
    "Part",
    "Phase",
    "RuleOutcome",
    "SGLangDetails",
    "ServingSummary",
    "StackBehaviour",
    "StackUse",
    "TracePoint",
    "TraceSummary",
    "VLLMDetails",
    "WorkloadSummary",
]

InputValue = int | float | str | bool | None


class _Out(msgspec.Struct, frozen=True, kw_only=True):
    pass


class Part(_Out, frozen=True, kw_only=True):
    name: str
    bytes: int


class Line(msgspec.Struct, frozen=True, omit_defaults=True):
    """One component on one device: bytes, the formula in symbols, its inputs, its source."""

    component: Component
    bytes: int
    formula: str
    inputs: tuple[str, ...]
    """Names of the device's ``inputs`` that this line's formula uses."""
    source: str
    parts: tuple[Part, ...] = ()


class Phase(_Out, frozen=True, kw_only=True):
    """Device total at one moment of the workload (e.g. prefill, decode; forward, backward)."""

    name: str
    total_bytes: int


class ErrorBand(_Out, frozen=True, kw_only=True):
    """Where the real peak of this device is expected to fall, from the residuals of published
    measurements of the same workload class (split conformal): the measured peak lay inside
    ``[low_bytes, high_bytes]`` for ``coverage`` of them."""

    low_bytes: int
    high_bytes: int
    coverage: float
    """The fraction of measurements the band is calibrated to hold (e.g. 0.9)."""
    workload_class: str
    measurements: int
    """How many calibration measurements of this class the band comes from (0: none; the
    band is the pooled one, widened)."""
    basis: str
    source_coverage: float | None = None
    """Measured, not assumed: refitting the bands without each published source of this class
    in turn, the share of that source's measurements within the reach of the class's band
    (each source weighted once; ``research/band_loso.py``), every band of the class being
    widened until it reaches as far as ``coverage`` of them lie (the ``basis`` says when);
    at most k / (k + 1) for a class of k sources, what so few can show of a new one. A class
    short of measurements, which answers with its family's band, reports its own figure as
    measured. Null where the class has no calibration source of its own."""
    counted_bytes: int = 0
    """The weights, quantization metadata and adapters this device holds (a training
    budget's: in the phase holding most of them; otherwise at the peak phase), counted from
    the model's tensors as the modelled stack lays them out rather than fitted from
    measurements: ``low_bytes`` never falls below them (a ZeRO-3 rank holding the whole
    quantized model at init; a short prompt, where weights are nearly all of the budget)."""


class AllocatorCache(_Out, frozen=True, kw_only=True):
    """What the caching allocator will *hold* (``torch.cuda.max_memory_reserved()``,
    ``nvidia-smi``) when transformers' ``generate`` grows its KV cache by ``torch.cat``: every
    step frees blocks a little too small for the next step's cache, so cached segments pile up
    far beyond the tensors' bytes. Replayed through the caching-allocator model
    (``method``). The allocator releases them and retries when ``cudaMalloc`` fails, so they
    do not decide whether the workload fits (the budget's total does); they decide what the
    device shows and whether the run pays for cache flushes."""

    cached_bytes: int
    """Bytes the allocator holds beyond the allocated peak, as the replay finds them (where the
    device had room for them), with the stack's allocator setting (``stack`` names it:
    ``allocator_segments``)."""
    reserved_bytes: int
    """The expected ``torch.cuda.max_memory_reserved()``: the budget's allocated bytes plus
    ``cached_bytes``, at most what the device leaves the allocator."""
    device_used_bytes: int
    """The expected ``nvidia-smi`` reading at the peak: ``reserved_bytes`` plus the CUDA
    context and communication buffers."""
    releases_cache: bool
    """The device cannot hold the cached segments: the allocator will release them and retry
    (``num_alloc_retries`` in ``torch.cuda.memory_stats()``), which costs time, not memory."""
    expandable_segments_cached_bytes: int
    """``cached_bytes`` with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (the remedy:
    one growing virtual segment per pool)."""
    method: str
    source: str


class DeviceBudget(_Out, frozen=True, kw_only=True):
    label: str
    pipeline_stage: int | None
    num_devices: int
    """How many devices carry this budget (tensor x data replicas of the stage)."""
    peak_phase: str
    lines: tuple[Line, ...]
    """Exactly one line per component, in vocabulary order, at the peak phase."""
    total_bytes: int
    inputs: dict[str, InputValue]
    """Values of the workload inputs the lines' formulas name (listed once per device)."""
    phases: tuple[Phase, ...]
    band: ErrorBand | None = None
    """The error band of the subtotal (headroom excluded); null where none is calibrated."""
    allocator_cache: AllocatorCache | None = None
    """transformers ``generate`` with a growing KV cache on one device: what the caching
    allocator will hold beyond the allocated bytes (null for every other workload, and for a
    generation longer than the replay limit)."""


class Item(_Out, frozen=True, kw_only=True):
    item: str
    bytes: int
    formula: str
    source: str


class HostBudget(_Out, frozen=True, kw_only=True):
    """Host RAM of one host (up to ``num_processes`` workload processes on it)."""

    num_processes: int
    items: tuple[Item, ...]
    total_bytes: int


class DiskBudget(_Out, frozen=True, kw_only=True):
    items: tuple[Item, ...]
    total_bytes: int


class DeployedFormat(_Out, frozen=True, kw_only=True):
    """What the model runs in, and whether each choice is the checkpoint's."""

    weights: str
    """Dtype of the unquantized weights (fp32, fp16, bf16, fp8)."""
    compute: str
    """Dtype of activations."""
    quantization: str | None
    """The quantization in words (``AWQ 4-bit GEMM, group 128 ...``), or null."""
    weights_from: Literal["checkpoint", "request"]
    """``checkpoint``: the config's ``torch_dtype``; ``request``: the request's (or bf16 when
    the model names no dtype)."""
    quantization_from: Literal["checkpoint", "request", "none"]
    stored_bytes: Literal["safetensors headers", "computed"]
    """``safetensors headers``: weights and metadata are the checkpoint's stored bytes, read
    from its headers; ``computed``: from the tensor shapes and the format."""


class ModelOrigin(_Out, frozen=True, kw_only=True):
    """Where the model's architecture came from and what the answer infers about it."""

    source: str
    """``preset``, ``closed form (<model_type>)``, ``dimensions``, or the framework that built
    it (``transformers 5.23.0 Qwen3NextForCausalLM``); with where the config came from."""
    assumptions: tuple[str, ...] = ()
    """What is inferred rather than known (for a model built by the framework)."""


class WorkloadSummary(_Out, frozen=True, kw_only=True):
    name: str
    kind: Literal[
        "inference",
        "training",
        "generic",
        "llm_serving",
        "image_generation",
        "vision",
        "seq2seq",
        "speech_to_text",
    ]
    model_type: str | None = None
    num_params: int | None = None
    num_layers: int | None = None
    devices_per_instance: int
    instances: int
    format: DeployedFormat | None = None
    model: ModelOrigin | None = None


class DeviceSummary(_Out, frozen=True, kw_only=True):
    name: str
    id: str | None = None
    memory_total_bytes: int
    architecture: str
    memory_in_use_bytes: int = 0
    """Memory other processes hold (the request's, or a desktop session's assumed hold): the
    fit compares with the total less it."""
    desktop_session: Literal["windows", "linux", "none"] | None = None
    """The request's ``desktop_session`` (null: not said)."""
    memory_in_use_low_bytes: int | None = None
    memory_in_use_high_bytes: int | None = None
    """Where the hold is assumed (a desktop session without ``memory_in_use_bytes``): the band
    of published readings it may lie in. The fit's "fits", the largest batch / context and a
    serving engine's KV-token band hold at the high end."""
    memory_in_use_basis: str | None = None
    """Where an assumed hold comes from."""

    @property
    def capacity_bytes(self) -> int:
        """What the workload may use (``DeviceContext.capacity_bytes``, not serialized)."""
        return self.memory_total_bytes - self.memory_in_use_bytes


class TracePoint(_Out, frozen=True, kw_only=True):
    """The trace's largest bytes within one phase of one iteration."""

    iteration: int
    phase: str
    allocated_bytes: int
    reserved_bytes: int


class TraceSummary(_Out, frozen=True, kw_only=True):
    """What the allocator replay of a trace saw (``method: trace``), on the most loaded device
    of the first workload traced."""

    peak_allocated_bytes: int
    """``torch.cuda.max_memory_allocated()`` the replay predicts (512-byte-rounded blocks)."""
    peak_reserved_bytes: int
    """``torch.cuda.max_memory_reserved()`` the replay predicts (cached segments)."""
    peak_phase: str
    peak_iteration: int
    iterations: int
    expandable_segments: bool
    num_events: int
    """Allocations and frees replayed."""
    timeline: tuple[TracePoint, ...]
    modelled: tuple[str, ...]
    """CUDA behaviour that CPU fake tensors lack and the trace adds explicitly."""
    torch_version: str
    code: str = "built-in builders"
    """The code that ran: ``framework: transformers 5.23.0 LlamaForCausalLM`` (the
    framework's modelling code), or ``built-in builders`` (and why)."""


class VLLMDetails(_Out, tag="vllm", tag_field="engine", frozen=True, kw_only=True):
    """vLLM's own numbers (``engine: vllm``)."""

    gpu_memory_utilization: float
    num_gpu_blocks: int
    block_size: int
    num_kv_cache_groups: int
    max_num_seqs: int
    max_num_batched_tokens: int
    cudagraph_memory: str
    """Where CUDA-graph memory sits in this release's accounting: ``outside`` (captured after
    the KV cache), ``estimated`` (profiled and subtracted from the KV budget)."""
    kv_cache_memory_bytes: int | None = None
    """``--kv-cache-memory`` when given: the pool's size, profiling skipped."""


class SGLangDetails(_Out, tag="sglang", tag_field="engine", frozen=True, kw_only=True):
    """SGLang's own numbers (``engine: sglang``)."""

    mem_fraction_static: float
    mem_fraction_static_source: str
    """``request`` or the release's rule that chose it."""
    max_total_num_tokens: int
    max_running_requests: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    page_size: int
    weights_bytes: int
    """"Load weight end ... mem usage"."""


class GGUFDeviceBuffers(_Out, frozen=True, kw_only=True):
    """One backend's buffers as llama.cpp logs them."""

    device: str
    """``CUDA0`` ... or ``CPU`` (host memory)."""
    model_buffer_bytes: int
    kv_buffer_bytes: int
    compute_buffer_bytes: int
    layers: int
    """Repeating layers placed here."""
    output_layer: bool


class OllamaPeer(_Out, frozen=True, kw_only=True):
    """Ollama's own estimate for the same deployment (``llm/memory.go`` of v0.12.10), as its
    ``msg=offload`` log line shows it: a peer to compare with, not vrambudget's answer."""

    layers_offload: int
    memory_required_full_bytes: int
    memory_required_partial_bytes: int
    memory_required_kv_bytes: int
    memory_graph_full_bytes: int
    memory_graph_partial_bytes: int


class GGUFDetails(_Out, tag="gguf", tag_field="engine", frozen=True, kw_only=True):
    """llama.cpp's (and Ollama's) own numbers (``engine: llama_cpp`` / ``ollama``)."""

    file_type: str
    file_bytes: int
    """Tensor data of the GGUF file (its size less the header)."""
    tensor_types: dict[str, int]
    """Tensors per ggml type in the file (the quantization recipe's outcome)."""
    n_ctx: int
    """KV cells (context padded as llama.cpp pads it)."""
    n_ctx_per_slot: int
    n_parallel: int
    kv_unified: bool
    n_gpu_layers: int
    """Layers on the GPUs, the output layer counted (n_layer + 1 = everything)."""
    n_layer: int
    flash_attn: bool
    n_ubatch: int
    cache_type_k: str
    cache_type_v: str
    buffers: tuple[GGUFDeviceBuffers, ...]
    fitted: str | None = None
    """What llama.cpp's ``--fit`` (or Ollama's scheduler) changed to fit, in words."""
    ollama_estimate: OllamaPeer | None = None
    n_gpu_layers_at_high_hold: int | None = None
    n_ctx_at_high_hold: int | None = None
    """Where the memory others hold is assumed (a desktop session's, ``device``'s
    ``memory_in_use_high_bytes``): the layers on the GPUs and the KV cells llama.cpp's ``--fit``
    (or Ollama's scheduler) leaves beside the high end of that hold (0 where the engine would
    not start then; fewer than ``n_gpu_layers`` / ``n_ctx``: the verdict says ``fits_if_low``);
    null where the hold is measured."""


EngineDetails = VLLMDetails | SGLangDetails | GGUFDetails


class KVTokensBand(_Out, frozen=True, kw_only=True):
    """How many KV tokens the engine may really report: the prediction with the KV budget moved
    by the largest gap seen between predicted and printed budgets on published launches of the
    same kind (docs/SERVING.md, *How wrong it may be*)."""

    low: int
    """Tokens if the engine's other memory is that much larger (size for this one)."""
    high: int
    """Tokens if it is that much smaller."""
    max_concurrency_low: float
    """Requests of max_model_len the pool holds at ``low``, rounded down to 4 decimals (below
    1, or the fit's target: the verdict says ``fits_if_low``)."""
    basis: str
    """The gap applied and the launches it comes from."""


class ServingSummary(_Out, frozen=True, kw_only=True):
    """A serving engine's own numbers for the deployment (``llm_serving`` workloads), per GPU of
    one engine replica, the same shape for every engine; what only one engine has is in
    ``details`` (tagged by ``details.engine``). How each is computed: docs/SERVING.md."""

    engine: str
    engine_version: str
    """The release the request named (or the default: the newest modelled)."""
    modelled_version: str
    """The release whose rules this answer follows."""
    version_note: str | None = None
    """Why ``modelled_version`` differs from ``engine_version``."""
    calibration: str
    """What the release's accounting subtracts, and where its constants come from."""
    requested_memory_bytes: int
    """The memory the engine's own accounting may use on the most constrained GPU (vLLM:
    ceil(total x gpu_memory_utilization); SGLang: total x mem_fraction_static; llama.cpp: the
    device's memory)."""
    available_kv_cache_bytes: int
    """What that accounting leaves for the KV cache before rounding to blocks / pages / cells."""
    kv_cache_pool_bytes: int
    """The KV tensors allocated on the most constrained GPU."""
    kv_cache_bytes_per_token: int
    """K+V bytes of one token over that GPU's layers (windows not applied)."""
    kv_cache_tokens: int
    """Tokens the pool holds ("GPU KV cache size", SGLang "#tokens", llama.cpp n_ctx)."""
    kv_cache_tokens_band: KVTokensBand | None = None
    """The range ``kv_cache_tokens`` may really take (vLLM; null where the pool is given by
    ``kv_cache_memory_bytes`` or the engine has no band yet)."""
    max_model_len: int
    """Longest request (prompt + output), tokens."""
    max_concurrency: float
    """Requests of max_model_len tokens the pool holds at once (one replica)."""
    data_parallel: int
    max_concurrency_all_replicas: float
    would_start: bool
    reason: str | None = None
    """Why the engine would refuse to start or run out of memory (null when it starts)."""
    remedies: tuple[str, ...] = ()
    """Concrete changes that would make it start (each checked)."""
    launch: str
    """The command line this budget assumes (every setting that changes memory), so what
    was budgeted is what starts."""
    details: EngineDetails


class OverheadOrigin(_Out, frozen=True, kw_only=True):
    """Where one overhead line's value came from."""

    component: Component
    origin: Literal["profile", "builtin"]
    profile: str | None
    source: str


class CalibrationUse(_Out, frozen=True, kw_only=True):
    """The calibration profile the budget's overheads came from (``profile`` null: the built-in
    defaults, each with its public source)."""

    profile: str | None
    matched_on: tuple[str, ...]
    """What the profile matched: ``gpu`` and the versions that agreed (``torch``, ``cuda``,
    ``driver``); versions the request did not name are not checked."""
    overheads: tuple[OverheadOrigin, ...]


class StackBehaviour(_Out, frozen=True, kw_only=True):
    """One behaviour of the software the budget assumed, and where it was read."""

    name: str
    assumed: str
    source: str


class StackUse(_Out, frozen=True, kw_only=True):
    """The software stack the budget is for: named in the request, or the current releases."""

    framework: str
    framework_version: str
    torch_version: str
    behaviours: tuple[StackBehaviour, ...]


CompatibilityVerdict = Literal["supported", "unsupported", "unknown"]


class RuleOutcome(_Out, frozen=True, kw_only=True, omit_defaults=True):
    """One compatibility rule applied to the workload on the device."""

    rule: Annotated[
        str,
        Meta(
            description="The rule's id, e.g. `flash_attention.cuda_arch`, "
            "`cuda.driver_minimum` (docs/COMPATIBILITY.md lists every rule)."
        ),
    ]
    verdict: Annotated[
        CompatibilityVerdict,
        Meta(
            description="`supported`: the rule holds; `unsupported`: it fails (the "
            "combination does not run as budgeted); `unknown`: a fact it needs is not known."
        ),
    ]
    reason: Annotated[
        str, Meta(description="Why, with the facts compared (and any default assumed).")
    ]
    remedy: Annotated[
        str | None,
        Meta(description="What to change so that it runs (with `unsupported`, `unknown`)."),
    ] = None
    source: Annotated[str, Meta(description="Where the rule's facts were read.")]


class Compatibility(_Out, frozen=True, kw_only=True):
    """Can this device run this workload with this software at all (before memory)?"""

    verdict: Annotated[
        CompatibilityVerdict,
        Meta(
            description="`unsupported` when any rule fails, else `unknown` when any rule "
            "lacks a fact, else `supported`."
        ),
    ]
    checks: Annotated[
        tuple[RuleOutcome, ...],
        Meta(description="The rules that apply to this workload and device, in a fixed order."),
    ]


FitVerdict = Literal["fits", "fits_if_low", "does_not_fit"]


class DeviceFit(_Out, frozen=True, kw_only=True):
    """One entry of ``devices`` (a pipeline stage, or every device) against the capacity."""

    label: str
    used_bytes: int
    """What ``/v1/fits`` counts on this device: the total, headroom included (a serving
    engine: what it allocates, without the share it leaves unclaimed)."""
    free_bytes: int
    """capacity - used; negative: the bytes missing."""
    fits: bool
    verdict: FitVerdict


class BudgetFit(_Out, frozen=True, kw_only=True):
    """The budget against its device, counted as ``/v1/fits`` counts a layout
    (:mod:`vrambudget.core.verdict`)."""

    capacity_bytes: Annotated[
        int,
        Meta(
            description="Memory of one device, as the catalog (or the custom device) states "
            "it, less `device.memory_in_use_bytes` (what other processes hold): the capacity "
            "every fit compares with."
        ),
    ]
    used_bytes: Annotated[
        int, Meta(description="What the most constrained device uses (see `devices`).")
    ]
    free_bytes: Annotated[
        int,
        Meta(description="capacity - used on the most constrained device; negative: missing."),
    ]
    missing_bytes: Annotated[
        int, Meta(description="The bytes the most constrained device lacks (0 when it fits).")
    ]
    free_percent: float
    fits: Annotated[
        bool,
        Meta(
            description="Every device holds its budget (the total, headroom included, is at "
            "most the capacity; a serving engine: it starts as `/v1/fits` counts it)."
        ),
    ]
    verdict: Annotated[
        FitVerdict,
        Meta(
            description="Against the error band, the worst over the devices: `fits` (its "
            "high end fits too), `fits_if_low` (only its low end fits), `does_not_fit`."
        ),
    ]
    reason: Annotated[str | None, Meta(description="Why it does not fit (null when it fits).")] = (
        None
    )
    devices: tuple[DeviceFit, ...]


class Budget(_Out, frozen=True, kw_only=True):
    method: Literal["analytic", "trace"] = "analytic"
    workloads: tuple[WorkloadSummary, ...]
    device: DeviceSummary | None
    devices: tuple[DeviceBudget, ...]
    most_loaded: int
    """Index into ``devices`` of the device with the largest total."""
    total_bytes: int
    """Total of the most loaded device, headroom included."""
    host_ram: HostBudget
    disk: DiskBudget
    warnings: tuple[str, ...] = ()
    trace: TraceSummary | None = None
    serving: ServingSummary | None = None
    calibration: CalibrationUse | None = None
    """Which profile (or built-in default) each overhead line came from."""
    stack: StackUse | None = None
    """The software the budget assumed and the behaviours it follows, each with its source."""
    compatibility: Annotated[
        Compatibility | None,
        Meta(
            description="Whether the device can run the workloads with the software at all "
            "(compute capability, kernels, driver and CUDA/ROCm), each rule with its source; "
            "null without a device."
        ),
    ] = None
    fit: Annotated[
        BudgetFit | None,
        Meta(
            description="Whether the budget fits its device: the capacity, the free (or "
            "missing) bytes and the verdict per device; null without a device."
        ),
    ] = None


# ---------------------------------------------------------------------------------- fits --


class Maxima(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Largest values that still fit (0: not even 1 fits; null: not solved / not applicable).
    ``*_limited`` says the value hit the request limit or the model's context length."""

    batch_size: int | None = None
    context_tokens: int | None = None
    context_limited_by_model: bool = False
    concurrent_requests: int | None = None
    max_model_len: int | None = None
    """``llm_serving``: the largest max_model_len at which the engine starts (and holds
    ``target_concurrency`` sequences)."""
    max_concurrency: float | None = None
    """``llm_serving``: the engine's maximum concurrency at the workload's max_model_len."""
    n_gpu_layers: int | None = None
    """llama.cpp / Ollama: the most layers (output layer counted) that fit on the GPUs."""
    file_type: str | None = None
    """llama.cpp / Ollama: the largest GGUF quantization (F16 ... IQ2_M) that fits whole on
    the GPUs with the workload's context; null when none does."""


class LayoutInterconnect(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU-to-GPU links a layout over several GPUs assumes, from the catalog's
    ``interconnect`` of the GPU type (:mod:`vrambudget.core.interconnect`)."""

    gpu_interconnect: str
    """The catalog's words for this GPU type's links (e.g. NVLink 4 through NVSwitch, 8 GPUs)."""
    tensor_parallel_over: Literal["nvswitch", "nvlink", "nvlink_bridge", "xgmi", "pcie"] | None
    """What a tensor-parallel group's all-reduces travel over: the fast link when the group fits
    in one NVLink / xGMI domain, else ``pcie``; null when the layout has no tensor parallelism."""
    tensor_parallel_bytes_per_s: int | None
    """That link's bandwidth per GPU, both directions together (PCIe: the generation's raw
    x16 rate); null when unknown or no tensor parallelism."""
    across_nodes: bool
    """The layout spans more than one 8-GPU node (or NVLink domain): its pipeline stages talk
    over the cluster network, which this answer does not model."""
    assumption: str
    """In words: the links assumed for this layout."""


class MIGFit(msgspec.Struct, frozen=True, kw_only=True):
    """A MIG instance of a catalog GPU as the device: the smallest MIG profile whose one instance
    holds the workload (no tensor parallelism across MIG instances: they have no peer-to-peer
    path), or, when none does, the largest profile with ``fits`` false."""

    mig_instance_of: str
    """The catalog GPU id this is a MIG instance of."""
    profile: str
    """The GPU instance profile, as ``nvidia-smi mig -lgip`` names it (``3g.40gb``)."""
    resource_name: str
    """The Kubernetes extended resource a pod requests one such instance by, under the NVIDIA
    device plugin's ``mixed`` MIG strategy (``nvidia.com/mig-3g.40gb``)."""
    instances_per_gpu: int
    """How many instances of this profile one GPU holds at most."""
    compute_slices: int
    """Compute slices of 7 (the instance has about this share of the GPU's SMs)."""
    memory_fraction: str
    """The share of the GPU's memory slices (``1/8`` ... ``Full``), as the MIG User Guide
    prints it."""
    capacity_bytes: int
    """The memory the fit gives the instance (see ``capacity_basis``)."""
    capacity_basis: Literal["nvidia_smi", "marketing"]
    """``nvidia_smi``: the instance memory of a published ``nvidia-smi mig -lgip`` listing, at
    the low end of its two-decimal GiB; ``marketing``: no listing found, 0.85 x the profile
    name's GB (below every listed profile's ratio)."""
    total_bytes: int
    """The workload's budget on one instance (the one-device layout; a serving engine's total
    for the instance's memory)."""
    free_bytes: int
    fits: bool
    verdict: Literal["fits", "fits_if_low", "does_not_fit"] = "fits"
    assumptions: tuple[str, ...] = ()


class LatencyEstimate(msgspec.Struct, frozen=True, kw_only=True):
    """A roofline estimate of one layout's latency (docs/LATENCY.md): the GPU's datasheet
    peaks times the assumed efficiencies, not a measurement (median error against published
    runs in docs/LATENCY.md)."""

    compute_format: str
    """The format the GEMMs run in (`bf16`, `fp16`, `fp8`, `fp32`), whose peak is used."""
    peak_flops: int
    """Dense peak FLOP/s of that format on one device (catalog, ``data/gpu_perf.json``)."""
    memory_bandwidth_bytes_per_s: int
    mfu: float
    mbu: float
    prompt_tokens: int
    output_tokens: int
    time_to_first_token_ms: float
    """Prefill of one prompt on an idle replica."""
    memory_max_batch: int
    """Sequences decoding at once that memory holds (the memory-limited maximum)."""
    latency_max_batch: int | None
    """Largest batch whose decode step meets ``time_per_output_token_ms``; null: no target."""
    batch: int
    """The operating point: the smaller of the two maxima (0: the targets are not met)."""
    limited_by: Literal["memory", "time_per_output_token", "time_to_first_token"]
    time_per_output_token_ms: float
    """One decode step at ``batch`` (1 when ``batch`` is 0) with every sequence at prompt +
    output tokens (the slowest step of a request)."""
    output_tokens_per_s: float
    """``batch / time_per_output_token`` for the replica (0 when ``batch`` is 0)."""
    decode_bound: Literal["memory", "compute"]
    meets_targets: bool
    all_reduce: Literal["not_needed", "not_counted"]
    """Tensor parallel layouts all-reduce activations; the catalog has no link rate, so its
    time is not counted (a lower bound on the step)."""
    cost_per_million_output_tokens: float | None = None
    """With ``prices``: price per device-hour x devices / output tokens per hour x 10^6."""


class LayoutFit(msgspec.Struct, frozen=True, kw_only=True):
    device_count: int
    tensor: int
    pipeline: int
    data: int
    fits: bool
    """The device holds the budget with its headroom (with the default headroom, the band's
    high end: then ``verdict`` is ``fits`` too; a smaller requested headroom may fit where the
    verdict is ``fits_if_low``)."""
    verdict: Literal["fits", "fits_if_low", "does_not_fit"] = "fits"
    """Against the error band: ``fits`` (its high end fits), ``fits_if_low`` (only if the real
    peak falls near the band's low end), ``does_not_fit`` (not even the low end fits)."""
    total_bytes: int
    capacity_bytes: int
    """The device's memory less what other processes hold (``memory_in_use_bytes``)."""
    free_bytes: int
    free_percent: float
    limiting_component: Component
    warnings: tuple[str, ...] = ()
    maxima: Maxima
    interconnect: LayoutInterconnect | None = None
    """Layouts over several GPUs: the links they assume (null on one device)."""
    latency: LatencyEstimate | None = None
    """With ``latency_target`` (or ``prices``) and a GPU whose peaks the catalog has."""


class GPUFit(msgspec.Struct, frozen=True, kw_only=True):
    gpu_id: str | None
    name: str
    memory_total_bytes: int
    layouts: tuple[LayoutFit, ...]
    min_device_count: int | None
    """Smallest device count (up to max_device_count) at which the workload fits; null if none."""
    warnings: tuple[str, ...] = ()
    compatibility: Annotated[
        Compatibility | None,
        Meta(
            description="The device's compatibility verdict (`supported` or `unknown`: an "
            "`unsupported` device is in `excluded` instead), with the rules that are not "
            "`supported`."
        ),
    ] = None
    mig: MIGFit | None = None
    """GPU types with MIG: the smallest MIG instance the workload fits in (null: no MIG, or a
    custom device)."""


class Cheapest(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU type whose smallest fitting device count costs least (``llm_serving``); without
    prices, the one that needs the fewest devices (no price is implied)."""

    gpu_id: str | None
    name: str
    device_count: int
    basis: Literal["price", "device_count"]
    """`price`: price x device_count from the request's prices; `device_count`: no prices
    given, the fewest devices, ties broken by the least memory per device, then the name."""
    cost: float | None
    total_memory_bytes: int


class ExcludedDevice(msgspec.Struct, frozen=True, kw_only=True):
    """A device type the fit does not offer: the workload cannot run on it as requested."""

    gpu_id: Annotated[str | None, Meta(description="Catalog id (null: a custom device).")]
    name: str
    compatibility: Annotated[
        Compatibility, Meta(description="The verdict `unsupported` and the rules that fail.")
    ]


class CostRank(msgspec.Struct, frozen=True, kw_only=True):
    """A layout ranked by cost per million output tokens at its operating point."""

    gpu_id: str | None
    name: str
    device_count: int
    price_per_device_hour: float
    batch: int
    output_tokens_per_s: float
    cost_per_million_output_tokens: float


class FitResponse(msgspec.Struct, frozen=True, kw_only=True):
    gpus: tuple[GPUFit, ...]
    cheapest: Cheapest | None = None
    """``llm_serving`` workloads with `device_count` solved: the cheapest GPU type that fits."""
    cost_ranking: tuple[CostRank, ...] = ()
    """With ``prices``: the layouts that fit and have a latency estimate meeting the targets,
    cheapest per million output tokens first."""
    warnings: tuple[str, ...] = ()
    """About the workload itself (its deployed format against the checkpoint's)."""
    excluded: Annotated[
        tuple[ExcludedDevice, ...],
        Meta(
            description="Device types left out because the workload cannot run on them "
            "(compatibility `unsupported`), each with the rules that fail and what to change."
        ),
    ] = ()
