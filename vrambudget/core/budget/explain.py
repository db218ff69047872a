"""The words of an analytic budget: each line's formula, inputs and source (read from its
component's formula module), the workload's inputs and warnings, and the assembled device
budget with its headroom and phases."""

from __future__ import annotations

from typing import Any

from ..arch import Arch
from ..components import Component
from ..device import DeviceContext
from ..dtypes import native_dtype_name
from ..formulas import TEXTS, allocator_overhead, communication_buffers
from ..formulas.headroom import headroom as headroom_of
from ..memo import BoundedCache
from ..overheads import Overheads
from ..resolve import model_name
from ..result import (
    CalibrationUse,
    DeviceBudget,
    Line,
    OverheadOrigin,
    Part,
    Phase,
    WorkloadSummary,
)
from ..spec import (
    AnalyticWorkload,
    FullFineTune,
    GenericWorkload,
    Headroom,
    InferenceWorkload,
    TrainingWorkload,
)
from ..statics import effective_precision, statics_for

__all__ = [
    "INPUT_NAMES",
    "NO_NAMES",
    "calibration_use",
    "device_budget",
    "dtype_warnings",
    "inputs",
    "kind",
    "summary",
    "warnings",
]

C = Component
ORDER: tuple[Component, ...] = tuple(Component)
_INDEX: dict[Component, int] = {c: i for i, c in enumerate(ORDER)}  # a line's place

_PAR = ("tensor_parallel", "pipeline_parallel", "data_parallel")
INPUT_NAMES: dict[str, dict[Component, tuple[str, ...]]] = {
    "inference": {
        C.WEIGHTS: (
            "weights_dtype",
            "quantization",
            "num_layers",
            "hidden_size",
            *_PAR[:2],
            "instances",
        ),
        C.QUANTIZATION_METADATA: ("quantization", *_PAR[:2], "instances"),
        C.KV_CACHE: (
            "sequences",
            "context_tokens",
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "kv_cache_dtype",
            "tensor_parallel",
            "instances",
        ),
        C.ACTIVATIONS: (
            "sequences",
            "prompt_tokens",
            "context_tokens",
            "attention",
            "hidden_size",
            "compute_dtype",
            "tensor_parallel",
            "instances",
        ),
        C.LOGITS: ("sequences", "prompt_tokens", "logits", "compute_dtype", "tensor_parallel"),
        C.CUDA_CONTEXT: ("instances",),
        C.RUNTIME_WORKSPACE: ("instances",),
        C.COMMUNICATION_BUFFERS: _PAR[:2],
        C.ALLOCATOR_OVERHEAD: ("fragmentation_fraction", "largest_transient_bytes"),
    },
    "training": {
        C.WEIGHTS: (
            "weights_dtype",
            "quantization",
            "num_layers",
            "hidden_size",
            *_PAR,
            "zero_stage",
        ),
        C.QUANTIZATION_METADATA: ("quantization", *_PAR),
        C.ADAPTERS: ("method",),
        C.ACTIVATIONS: (
            "micro_batch_size",
            "sequence_length",
            "checkpointing",
            "attention",
            "hidden_size",
            "num_layers",
            "compute_dtype",
            "tensor_parallel",
            "pipeline_parallel",
        ),
        C.LOGITS: ("micro_batch_size", "sequence_length", "compute_dtype", "tensor_parallel"),
        C.GRADIENTS: ("method", "mixed_precision", "zero_stage", "data_parallel"),
        C.OPTIMIZER_STATE: ("optimizer", "mixed_precision", "zero_stage", "data_parallel"),
        C.MASTER_WEIGHTS: ("mixed_precision", "zero_stage", "data_parallel"),
        C.CUDA_CONTEXT: ("instances",),
        C.RUNTIME_WORKSPACE: ("instances", "method", "mixed_precision"),
        C.COMMUNICATION_BUFFERS: (*_PAR, "zero_stage"),
        C.ALLOCATOR_OVERHEAD: ("fragmentation_fraction", "largest_transient_bytes"),
    },
    "generic": {
        C.WEIGHTS: ("instances",),
        C.ACTIVATIONS: ("batch_size", "instances"),
        C.KV_CACHE: ("instances",),
        C.RUNTIME_WORKSPACE: ("instances",),
        C.CUDA_CONTEXT: ("instances",),
        C.ALLOCATOR_OVERHEAD: ("fragmentation_fraction", "largest_transient_bytes"),
    },
}
for _names in INPUT_NAMES.values():
    _names[C.HEADROOM] = ("headroom_fraction", "headroom_min_bytes", "subtotal_bytes")
del _names


def kind(w: AnalyticWorkload) -> str:
    return w.__struct_config__.tag  # type: ignore[return-value]


def inputs(w: AnalyticWorkload, arch: Arch | None, ov: Overheads) -> dict[str, Any]:
    if isinstance(w, GenericWorkload):
        return {
            "batch_size": w.batch_size,
            "instances": w.instances,
            "fragmentation_fraction": ov.generic_fragmentation_ppm / 1_000_000,
        }
    par = w.parallelism
    q = effective_precision(w).quantization
    common: dict[str, Any] = {
        "tensor_parallel": par.tensor,
        "pipeline_parallel": par.pipeline,
        "data_parallel": par.data,
        "weights_dtype": w.precision.weights,
        "compute_dtype": w.precision.compute,
        "instances": w.instances,
        "quantization": q.__struct_config__.tag if q is not None else None,
        "fragmentation_fraction": (
            ov.training_fragmentation_ppm
            if isinstance(w, TrainingWorkload)
            else ov.inference_fragmentation_ppm
        )
        / 1_000_000,
    }
    if arch is not None:
        common.update(
            num_layers=arch.num_layers,
            hidden_size=arch.hidden_size,
            num_kv_heads=arch.num_kv_heads,
            head_dim=arch.head_dim,
        )
    if isinstance(w, InferenceWorkload):
        common.update(
            sequences=w.num_sequences,
            context_tokens=w.context_tokens,
            prompt_tokens=w.prompt_tokens,
            attention=w.attention,
            kv_cache_dtype=w.precision.kv_cache,
            logits=w.logits,
        )
    else:
        common.update(
            micro_batch_size=w.micro_batch_size,
            sequence_length=w.sequence_length,
            checkpointing=w.checkpointing,
            zero_stage=par.zero_stage,
            optimizer=w.optimizer.__struct_config__.tag,
            mixed_precision=w.mixed_precision,
            attention=w.attention,
            method=w.method.__struct_config__.tag,
        )
    return common


def warnings(w: AnalyticWorkload, arch: Arch | None, device: DeviceContext | None) -> list[str]:
    out: list[str] = []
    if isinstance(w, GenericWorkload) or arch is None:
        return out
    if isinstance(w, InferenceWorkload):
        if arch.kind == "encoder" and w.generated_tokens:
            out.append("encoder models do not generate: generated_tokens is ignored")
        if arch.kind == "decoder" and w.context_tokens > arch.max_positions:
            out.append(
                f"context {w.context_tokens} exceeds the model's max_position_embeddings "
                f"{arch.max_positions}"
            )
    else:
        if w.sequence_length > arch.max_positions:
            out.append(
                f"sequence_length {w.sequence_length} exceeds the model's "
                f"max_position_embeddings {arch.max_positions}"
            )
        if not isinstance(w.method, FullFineTune) and not any(
            st.adapter_params for st in statics_for(w, arch)
        ):
            out.append(
                "no LoRA target module matches this model's projections: "
                "adapters, gradients and optimizer state are 0"
            )
    if device is not None:
        out += dtype_warnings(w, device)
    return out


def dtype_warnings(w: InferenceWorkload | TrainingWorkload, device: DeviceContext) -> list[str]:
    """Weights or compute dtypes the device has no native (tensor-core) support for."""
    out = []
    for dtype in sorted({w.precision.compute, w.precision.weights}):
        native = native_dtype_name(dtype)
        if native and native not in device.native_dtypes:
            out.append(f"{device.name} has no native {dtype} support: kernels fall back or fail")
    return out


def summary(w: AnalyticWorkload, arch: Arch | None) -> WorkloadSummary:
    if isinstance(w, GenericWorkload):
        return WorkloadSummary(
            name=w.name or "generic", kind="generic", devices_per_instance=1, instances=w.instances
        )
    assert arch is not None
    return WorkloadSummary(
        name=w.name or model_name(w.model),
        kind="inference" if isinstance(w, InferenceWorkload) else "training",
        model_type=arch.model_type,
        num_params=arch.num_params,
        num_layers=arch.num_layers,
        devices_per_instance=w.parallelism.devices,
        instances=w.instances,
    )


def _sources(ov: Overheads) -> tuple[tuple[Component, str, str], ...]:
    """(component, formula, source) in vocabulary order for one device type (cached). The
    overhead lines name their origin: a calibration profile, or the built-in default's
    public source."""
    key = _text_key(ov)
    hit = _SOURCES.get(key)
    if hit is None:
        rows = []
        for c in ORDER:
            formula, source = TEXTS[c]
            if c is C.CUDA_CONTEXT:
                source = ov.cuda_context_source
            elif c is C.RUNTIME_WORKSPACE:
                source = ov.workspace_source
            elif c is C.ALLOCATOR_OVERHEAD:
                source = allocator_overhead.source(ov.fragmentation_source)
            elif c is C.COMMUNICATION_BUFFERS:
                source = communication_buffers.source(ov.communication_source)
            rows.append((c, formula, source))
        hit = _SOURCES.put(key, tuple(rows))
    return hit


def _text_key(ov: Overheads) -> tuple[object, ...]:
    """What the explanation texts of ``ov`` depend on: a tuple of (interned) strings hashes in
    C, where hashing the dataclass would run Python code on every budget."""
    return (
        ov.cuda_context_source,
        ov.workspace_source,
        ov.fragmentation_source,
        ov.communication_source,
        ov.nccl_communicator_bytes is None,
        ov.profile,
        ov.profile_match,
    )


_SOURCES: BoundedCache[tuple[object, ...], tuple[tuple[Component, str, str], ...]] = BoundedCache(
    1024
)
NO_NAMES: dict[Component, tuple[str, ...]] = {}  # co-located lines name no single workload
_ROWS: BoundedCache[tuple[object, ...], tuple[tuple[Component, str, str, tuple[str, ...]], ...]] = (
    BoundedCache(1024)
)


def _rows(
    ov: Overheads, names: dict[Component, tuple[str, ...]]
) -> tuple[tuple[Component, str, str, tuple[str, ...]], ...]:
    """(component, formula, source, input names) per line, for one device type and workload
    kind (``names`` is one of the module-level ``INPUT_NAMES`` tables, so its id is stable)."""
    key = (
        ov.cuda_context_source,
        ov.workspace_source,
        ov.fragmentation_source,
        ov.communication_source,
        id(names),
    )
    hit = _ROWS.get(key)
    if hit is None:
        hit = _ROWS.put(key, tuple((c, f, src, names.get(c, ())) for c, f, src in _sources(ov)))
    return hit


def device_budget(
    label: str,
    stage: int | None,
    num_devices: int,
    peak: str,
    values: dict[Component, int],
    parts: dict[Component, Any],
    phases: tuple[tuple[str, int], ...],
    inputs: dict[str, Any],
    names: dict[Component, tuple[str, ...]],
    headroom: Headroom,
    ov: Overheads,
    transient: int | None = None,
) -> DeviceBudget:
    subtotal = sum(values.values())
    ppm, floor = round(headroom.fraction * 1_000_000), headroom.min_bytes
    room = headroom_of(subtotal, ppm, floor)
    inputs = {
        **inputs,
        "headroom_fraction": headroom.fraction,
        "headroom_min_bytes": floor,
        "subtotal_bytes": subtotal,
    }
    if transient is not None:
        inputs["largest_transient_bytes"] = transient
    get = values.get
    rows = _rows(ov, names)
    lines = [Line(c, get(c, 0), formula, used, source) for c, formula, source, used in rows]
    _, formula, source, used = rows[_INDEX[C.HEADROOM]]
    lines[_INDEX[C.HEADROOM]] = Line(C.HEADROOM, room, formula, used, source)
    for c, p in parts.items():  # the few lines with parts
        if p:
            _, formula, source, used = rows[_INDEX[c]]
            lines[_INDEX[c]] = Line(
                c, get(c, 0), formula, used, source, tuple([Part(name=n, bytes=b) for n, b in p])
            )
    return DeviceBudget(
        label=label,
        pipeline_stage=stage,
        num_devices=num_devices,
        peak_phase=peak,
        lines=tuple(lines),
        total_bytes=subtotal + room,
        inputs=inputs,
        phases=tuple(
            [Phase(name=n, total_bytes=t + headroom_of(t, ppm, floor)) for n, t in phases]
        ),
    )


_OVERHEAD_LINES = (
    C.CUDA_CONTEXT,
    C.RUNTIME_WORKSPACE,
    C.COMMUNICATION_BUFFERS,
    C.ALLOCATOR_OVERHEAD,
)


def calibration_use(ov: Overheads) -> CalibrationUse:
    """Which profile (or built-in default) each overhead line came from."""
    key = _text_key(ov)
    hit = _USES.get(key)
    if hit is None:
        from_profile = {
            C.CUDA_CONTEXT: ov.cuda_context_source.startswith("calibration profile"),
            C.RUNTIME_WORKSPACE: ov.workspace_source.startswith("calibration profile"),
            C.COMMUNICATION_BUFFERS: ov.nccl_communicator_bytes is not None,
            C.ALLOCATOR_OVERHEAD: "calibration profile" in ov.fragmentation_source,
        }
        sources = {c: src for c, _, src in _sources(ov)}
        hit = _USES.put(
            key,
            CalibrationUse(
                profile=ov.profile,
                matched_on=ov.profile_match,
                overheads=tuple(
                    OverheadOrigin(
                        component=c,
                        origin="profile" if from_profile[c] else "builtin",
                        profile=ov.profile if from_profile[c] else None,
                        source=sources[c],
                    )
                    for c in _OVERHEAD_LINES
                ),
            ),
        )
    return hit


_USES: BoundedCache[tuple[object, ...], CalibrationUse] = BoundedCache(1024)
