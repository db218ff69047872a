"""The probe agent's wire types: what a caller asks the agent to run, and what it reports.

A probe's workload is the same spec the service accepts (so an estimate and a measurement are
about the same thing), or the name of an entry point that the *agent's own configuration* lists:
requests never carry code. Every limit is in the schema with its range.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .comparison import Comparison
from .errors import InvalidWorkload
from .probe_engine import EngineLoad, EngineReport
from .probe_quality import QualityCheck, QualityReport
from .result import Budget
from .spec import InferenceWorkload, LLMServingWorkload, TrainingWorkload, rules

__all__ = [
    "Callback",
    "CustomWorkload",
    "DeviceView",
    "Iteration",
    "ObservedHeadroom",
    "OverlapMember",
    "OverlapWorkload",
    "ProbeRequest",
    "ProbeResource",
    "ProbeResult",
    "ProbeStatus",
    "ProbeWorkload",
    "SnapshotInfo",
    "TorchView",
    "WeightsSource",
    "measured_torch",
]

ProbeStatus = Literal[
    "queued",
    "running",
    "succeeded",
    "oom",
    "timeout",
    "failed",
    "cancelled",
    "interrupted",
    "unreliable",
]


# msgspec passes frozen=True on to subclasses, type checkers do not: each subclass repeats it.
class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CustomWorkload(_Wire, frozen=True, tag="custom", tag_field="kind", kw_only=True):
    """An entry point from the agent's configuration (``VRAMBUDGET_AGENT_ENTRY_POINTS``),
    called with ``arguments``; it returns the program to run."""

    entry_point: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=64,
            pattern=r"^[A-Za-z0-9_.-]+$",
            description="Name of a configured entry point.",
        ),
    ]
    arguments: Annotated[
        dict[str, int | float | str | bool],
        Meta(max_length=64, description="Keyword arguments for the entry point (at most 64)."),
    ] = {}


ProbeWorkload = InferenceWorkload | TrainingWorkload | LLMServingWorkload | CustomWorkload
OverlapWorkload = InferenceWorkload | TrainingWorkload | CustomWorkload


class Callback(_Wire, frozen=True, kw_only=True):
    url: Annotated[
        str,
        Meta(
            min_length=8,
            max_length=2048,
            pattern=r"^https?://",
            description="Where the signed result is POSTed; must match the "
            "agent's allow-list (default: callbacks off).",
        ),
    ]


class ProbeRequest(_Wire, frozen=True, kw_only=True):
    workload: Annotated[
        ProbeWorkload,
        Meta(
            description="What to run: the service's workload spec (inference or training: "
            "run in a child process with PyTorch; llm_serving: the engine started from the "
            "host's configured launcher and driven through its OpenAI-compatible API) or a "
            "configured entry point."
        ),
    ]
    device: Annotated[
        Annotated[int, Meta(ge=0, le=255)] | Annotated[str, Meta(min_length=1, max_length=96)],
        Meta(
            description="GPU index or UUID (``GPU-...``); ignored on a host without CUDA "
            "(the probe runs on the CPU and says so)."
        ),
    ] = 0
    warmup_iterations: Annotated[
        int, Meta(ge=0, le=100, description="Iterations run before the peaks are reset (0 .. 100).")
    ] = 1
    code: Annotated[
        Literal["framework", "builtin"],
        Meta(
            description="`framework` (default): the model built by transformers from its "
            "config.json and run as generate / Trainer with PEFT do -- the code path of the trace "
            "tier's default; `builtin`: the service's own builders (used anyway where the "
            "framework program cannot run: explicit dimensions, tensor parallelism)."
        ),
    ] = "framework"
    weights: Annotated[
        Literal["auto", "checkpoint", "synthetic"],
        Meta(
            description="`auto` (default): the real checkpoint when the host has it (the "
            "model's repository -- a `hub` model's id, a preset's source repository -- in a "
            "directory of `VRAMBUDGET_AGENT_MODEL_DIRS` or in the host's Hugging Face cache; "
            "gated files with the agent's own token), synthetic weights of the real shapes "
            "otherwise; `checkpoint`: the real weights or fail; `synthetic`: never load them. "
            "The result says which was used."
        ),
    ] = "auto"
    iterations: Annotated[
        int, Meta(ge=1, le=10_000, description="Measured iterations (1 .. 10,000).")
    ] = 3
    duration_s: Annotated[
        Annotated[float, Meta(ge=0.1, le=3600.0)] | None,
        Meta(
            description="Measure for this long instead (0.1 .. 3600 s); iterations then is a "
            "minimum."
        ),
    ] = None
    concurrency: Annotated[
        int,
        Meta(
            ge=1,
            le=64,
            description="Parallel request streams in the load phase (inference only; 1 .. 64).",
        ),
    ] = 1
    time_limit_s: Annotated[
        float,
        Meta(
            ge=1.0,
            le=86_400.0,
            description="The probe's child process is killed after this long (status timeout).",
        ),
    ] = 600.0
    memory_limit_bytes: Annotated[
        Annotated[int, Meta(ge=1 << 20, le=1 << 50)] | None,
        Meta(
            description="Cap the allocator (CUDA: per-process memory fraction; CPU: the "
            "tracker), 1 MiB .. 1 PiB; exceeding it is an OOM result."
        ),
    ] = None
    engine: Annotated[
        EngineLoad | None,
        Meta(description="The load of an llm_serving probe; default (null): `EngineLoad`'s."),
    ] = None
    recipe_gpu: Annotated[
        Annotated[str, Meta(min_length=1, max_length=64)] | None,
        Meta(
            description="llm_serving: the catalog GPU whose recipe fills the engine command "
            "when NVML does not identify the device (default: the catalog GPU NVML's name "
            "matches)."
        ),
    ] = None
    quality: Annotated[
        QualityCheck | None,
        Meta(
            description="After the measurement: compare the output of a reference precision "
            "with candidates on an evaluation set (inference workloads)."
        ),
    ] = None
    overlap: Annotated[
        tuple[OverlapWorkload, ...],
        Meta(
            max_length=7,
            description="Workloads run at the same time on the same device, each in its own "
            "process with this probe's iteration settings (at most 7): the realistic overlap "
            "of jobs. The result reports each one's peak and the device's.",
        ),
    ] = ()
    memory_snapshot: Annotated[
        bool,
        Meta(
            description="Record PyTorch's memory history around the measured phase (and an "
            "out-of-memory), kept privately in the agent's data directory and served only by "
            "`GET /v1/probes/{id}/snapshot` (never in callbacks); off by default."
        ),
    ] = False
    expandable_segments: Annotated[
        bool | None,
        Meta(
            description="Run the workload's process with "
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (`false`: `:False`; both "
            "`PYTORCH_CUDA_ALLOC_CONF` and torch 2.9's `PYTORCH_ALLOC_CONF` are set, any other "
            "setting of theirs replaced). Null (default): the agent's own environment; null "
            "only for an llm_serving probe, whose engine keeps its launcher's. The result says "
            "which ran (`result.expandable_segments`), and the comparison's estimate follows "
            "it."
        ),
    ] = None
    callback: Annotated[Callback | None, Meta(description="Signed webhook on completion.")] = None
    service_url: Annotated[
        Annotated[str, Meta(max_length=2048, pattern=r"^https?://")] | None,
        Meta(description="The calculation service, for the estimate-vs-measured comparison."),
    ] = None

    def __post_init__(self) -> None:
        rules.check(self)


class TorchView(_Wire, frozen=True, kw_only=True):
    """PyTorch's own counters (``torch.cuda.memory_stats``; on the CPU: the tracker)."""

    allocated_peak_bytes: int
    reserved_peak_bytes: int | None
    num_alloc_retries: int | None
    num_ooms: int | None
    inactive_split_peak_bytes: int | None
    weights_bytes: int
    """Allocated after the model was built, before any iteration."""
    kv_cache_bytes: int | None
    """The KV cache's bytes (inference): on the CPU the tracker's largest live KV-cache bytes;
    on CUDA the cache tensors' allocation, rounded up to the allocator's 512-byte blocks."""
    workspace_bytes: int | None = None
    """CUDA: what the first GEMM's cuBLAS/cuBLASLt workspaces added to allocated memory,
    measured on a tiny matmul before the model is built (null on the CPU)."""
    iteration_peak_bytes: tuple[int, ...] = ()
    """Allocated peak of each measured iteration, in order (concurrency 1; empty otherwise:
    overlapping streams have no per-iteration peak)."""


class DeviceView(_Wire, frozen=True, kw_only=True):
    """What NVML saw on the device (absent on the CPU path)."""

    baseline_used_bytes: int
    """Device used before the workload: read by the probe's child before its CUDA context (an
    engine probe: before the engine started). The device peak minus this is what the workload
    made the device hold (weights, KV cache, context, allocator cache, other libraries)."""
    peak_used_bytes: int
    """Largest device used the agent's sampler saw during the load phase."""
    samples: int
    sample_interval_s: float
    max_sample_interval_s: float
    process_peak_used_bytes: int | None
    accounting_max_memory_bytes: int | None
    cuda_context_bytes: int
    """Device used after the CUDA context was created, minus the baseline."""
    others_changed_bytes: int
    """Largest change of other processes' device memory during the measurement."""
    others_visible: bool
    """Whether NVML told this process's memory apart from the others' on every poll (false in
    a PID namespace: then ``others_changed_bytes`` proves nothing)."""
    load_baseline_used_bytes: int | None = None
    """Device used when the load phase began (the sampler's first reading, after the model was
    built and warmed up; an engine probe: after the engine started). ``peak_used_bytes`` minus
    this is only what the load phase added. Null when the agent's sampler did not run."""


class Iteration(_Wire, frozen=True, kw_only=True):
    p50_s: float
    p95_s: float
    count: int
    throughput_per_s: float
    errors: int


class WeightsSource(_Wire, frozen=True, kw_only=True):
    """Which weights the probe ran."""

    kind: Literal["checkpoint", "synthetic"]
    path: str | None = None
    """The checkpoint's directory on the host."""
    revision: str | None = None
    """The Hub commit of a cached checkpoint."""
    reason: str
    """Why these weights (e.g. "not in the hub cache: meta-llama/Llama-3.1-8B")."""


class SnapshotInfo(_Wire, frozen=True, kw_only=True):
    """A private memory-history snapshot kept by the agent (``GET /v1/probes/{id}/snapshot``)."""

    bytes: int
    entries: int
    """Allocation events recorded."""
    trigger: Literal["measured", "oom"]
    format: str
    """`torch.cuda.memory._snapshot` pickle (open it at https://pytorch.org/memory_viz)."""
    expires_at: float
    """When the agent deletes it (Unix time)."""


class OverlapMember(_Wire, frozen=True, kw_only=True):
    """One workload of ``overlap``, run in its own process at the same time as the probe's."""

    index: int
    """Its position in the request's ``overlap`` (0-based)."""
    status: str
    error: str | None = None
    result: ProbeResult | None = None


class ProbeResult(_Wire, frozen=True, kw_only=True):
    device: Literal["cuda", "cpu"]
    device_name: str
    torch_version: str | None
    """The probe child's torch (null for an engine probe: the engine runs its own)."""
    cuda_version: str | None
    driver_version: str | None
    torch: TorchView | None
    """PyTorch's counters in the probe's process (null for an engine probe)."""
    nvml: DeviceView | None
    host_peak_rss_bytes: int
    iterations: Iteration
    outputs_finite: bool
    message: str | None = None
    """The OOM or error message when the probe did not succeed."""
    memory_total_bytes: int | None = None
    """The device's total memory as the CUDA runtime reports it (null on the CPU)."""
    compute_capability: str | None = None
    weights: WeightsSource | None = None
    """Which weights ran (null for custom entry points and engine probes)."""
    engine: EngineReport | None = None
    """llm_serving: the engine's start, its own figures and the load's latencies."""
    quality: QualityReport | None = None
    overlap: tuple[OverlapMember, ...] = ()
    """The overlapping workloads' results; ``nvml.peak_used_bytes`` is the device's peak
    while all of them ran, ``nvml.baseline_used_bytes`` the smallest of the jobs' pre-workload
    readings."""
    snapshot: SnapshotInfo | None = None
    """The private memory snapshot (``memory_snapshot``); metadata only, the file is served by
    ``GET /v1/probes/{id}/snapshot``."""
    headroom: ObservedHeadroom | None = None
    """Headroom advised from the observed spread (set by the agent when the probe ends)."""
    snapshot_error: str | None = None
    """Why a requested snapshot is not kept (over the agent's size cap, not recorded, deleted
    by request)."""
    expandable_segments: bool | None = None
    """Whether the caching allocator ran with ``expandable_segments:True`` (from the
    process's ``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF``; null on the CPU and for
    engine probes)."""


def measured_torch(res: ProbeResult) -> TorchView:
    """The PyTorch view of a result, which every probe but an engine probe has."""
    if res.torch is None:
        raise InvalidWorkload(
            "result.torch",
            "an engine probe measures no PyTorch process of its own: compare its startup "
            "figures (result.engine)",
        )
    return res.torch


class ObservedHeadroom(_Wire, frozen=True, kw_only=True):
    """Headroom advised from what was observed: the spread of the measured iterations' peaks
    and of the peaks of earlier probes of the same workload on the same device."""

    advised_bytes: int
    advised_fraction: float
    """advised_bytes / the peak it is added to."""
    peak_bytes: int
    """The peak the headroom is added to (the largest observed)."""
    basis: str
    """Which peak (PyTorch allocated / reserved, NVML process used, NVML device used above
    the pre-workload baseline) and why this much."""
    iterations: int
    """Measured iterations this probe's spread rests on."""
    iteration_spread_bytes: int | None
    probes: int
    """Probes of the same workload on this device (this one included) the spread rests on."""
    probe_spread_bytes: int | None


class ProbeResource(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    status: ProbeStatus
    created_at: float
    updated_at: float
    request: ProbeRequest
    result: ProbeResult | None = None
    error: str | None = None
    estimate: Budget | None = None
    """The service's analytic estimate, fetched before the run (``service_url``)."""
    estimate_error: str | None = None
    comparison: Comparison | None = None
    """The service's estimate-vs-measured comparison of this result (``service_url``)."""
    comparison_error: str | None = None


SCHEMA_RULES = rules.schema_rules({"ProbeRequest": ProbeRequest})
"""The probe request's cross-field rules as JSON Schema (declared in ``spec/rules.py``)."""
