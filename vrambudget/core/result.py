"""The answer: a component-wise budget per device, plus host RAM and disk. Wire types."""

from __future__ import annotations

from typing import Literal

import msgspec

from .components import Component

__all__ = [
    "Budget",
    "CalibrationUse",
    "Cheapest",
    "DeployedFormat",
    "DeviceBudget",
    "DeviceSummary",
    "DiskBudget",
    "ErrorBand",
    "FitResponse",
    "GPUFit",
    "HostBudget",
    "Item",
    "LayoutFit",
    "Line",
    "Maxima",
    "ModelOrigin",
    "OverheadOrigin",
    "Part",
    "Phase",
    "ServingSummary",
    "StackBehaviour",
    "StackUse",
    "TracePoint",
    "TraceSummary",
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


class ServingSummary(_Out, frozen=True, kw_only=True):
    """A serving engine's own numbers for the deployment (``llm_serving`` workloads), per GPU of
    one engine replica; how each is computed is in docs/COMPONENTS.md (*Serving engines*)."""

    engine: str
    engine_version: str
    calibration: str
    """What the version's accounting subtracts, and where its constants come from."""
    gpu_memory_utilization: float
    requested_memory_bytes: int
    """ceil(total x gpu_memory_utilization): the memory the engine's accounting may use."""
    available_kv_cache_bytes: int
    """requested - weights - activation peak - non-torch increase, on the most constrained
    pipeline stage ("Available KV cache memory")."""
    kv_cache_pool_bytes: int
    """The KV tensors allocated on that GPU: num_gpu_blocks x page x layers per group."""
    num_gpu_blocks: int
    block_size: int
    num_kv_cache_groups: int
    kv_cache_bytes_per_token: int
    """K+V bytes of one token over the layers of the most loaded stage (windows not applied)."""
    kv_cache_tokens: int
    """"GPU KV cache size: N tokens" (block-aligned)."""
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_concurrency: float
    """"Maximum concurrency for max_model_len tokens per request" of one replica."""
    data_parallel: int
    max_concurrency_all_replicas: float
    would_start: bool
    reason: str | None = None
    """Why the engine would refuse to start (null when it starts)."""
    remedies: tuple[str, ...] = ()
    """Concrete changes that would make it start (or hold more sequences)."""


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
    free_bytes: int
    free_percent: float
    limiting_component: Component
    warnings: tuple[str, ...] = ()
    maxima: Maxima


class GPUFit(msgspec.Struct, frozen=True, kw_only=True):
    gpu_id: str | None
    name: str
    memory_total_bytes: int
    layouts: tuple[LayoutFit, ...]
    min_device_count: int | None
    """Smallest device count (up to max_device_count) at which the workload fits; null if none."""
    warnings: tuple[str, ...] = ()


class Cheapest(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU type whose smallest fitting device count costs least (``llm_serving``)."""

    gpu_id: str | None
    name: str
    device_count: int
    basis: Literal["price", "total_memory"]
    """`price`: price x device_count from the request's prices; `total_memory`: no prices
    given, ranked by device_count x memory_total_bytes (the catalog has no prices)."""
    cost: float | None
    total_memory_bytes: int


class FitResponse(msgspec.Struct, frozen=True, kw_only=True):
    gpus: tuple[GPUFit, ...]
    cheapest: Cheapest | None = None
    """``llm_serving`` workloads with `device_count` solved: the cheapest GPU type that fits."""
    warnings: tuple[str, ...] = ()
    """About the workload itself (its deployed format against the checkpoint's)."""
