"""The analytic tier: model workloads (inference, training) and generic ones in, a
component-wise budget per device out.

``device_totals`` is the numeric core (integers only, no strings) that the fit solver calls many
times; ``analytic_budget`` adds each line's formula, inputs and source for the answer. Both share
the same stage functions, so an explained number and a solved number cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET

from ..arch import Arch
from ..bands import BandRule, band_rule, resolve_headroom, workload_class
from ..calibration import ProfileSet
from ..components import Component
from ..deployed import bnb_4bit, bnb_loaded
from ..device import DeviceContext, resolve_device
from ..errors import InvalidWorkload
from ..formulas.headroom import headroom_bytes
from ..host import DEFAULT_DISK, host_and_disk, persistent_key
from ..memo import BoundedCache
from ..overheads import DEFAULT_OVERHEADS, Overheads, with_software
from ..quantization import stored_as_buffers
from ..resolve import resolve_model
from ..result import (
    Budget,
    CalibrationUse,
    DeviceBudget,
    DeviceSummary,
    DiskBudget,
    HostBudget,
    StackUse,
    WorkloadSummary,
)
from ..spec import (
    AnalyticWorkload,
    DeviceRef,
    DiskOptions,
    EncoderWorkload,
    GenericWorkload,
    Headroom,
    InferenceWorkload,
    LoRA,
    QLoRA,
    Software,
    TrainingWorkload,
)
from ..stack import Stack
from ..statics import statics_for
from .encoders import encoder_info, encoder_stage, proxy
from .explain import NO_NAMES, calibration_use, device_budget
from .generate_cache import allocator_cache
from .generic import generic_stage
from .inference import Plan, inference_stage, inference_total, plan_of, plan_stage
from .inputs import (
    INPUT_NAMES,
    inference_input_parts,
    inputs,
    kind,
    scaled_inputs,
    shape_warnings,
    size_warnings,
    summary,
)
from .inputs import warnings as workload_warnings
from .stage import StageNumbers, counted_bytes, top_stage
from .training import training_stage, zero3_quantized_init_applies

__all__ = [
    "analytic_budget",
    "device_counted",
    "device_subtotal",
    "device_totals",
    "workload_stages",
]


def workload_stages(w: AnalyticWorkload, ov: Overheads, index: int = 0) -> tuple[StageNumbers, ...]:
    """Per pipeline stage of one deployed workload (:func:`vrambudget.core.deployed.deploy_all`):
    its peak-phase component bytes (headroom excluded). Errors name the field as
    ``workloads[index].<path>``."""
    if isinstance(w, GenericWorkload):
        return (generic_stage(w, ov),)
    if isinstance(w, EncoderWorkload):
        info = encoder_info(w, f"workloads[{index}]")
        try:
            arch = resolve_model(w.model)
            (st,) = statics_for(proxy(w), arch)
        except InvalidWorkload as exc:
            raise InvalidWorkload(f"workloads[{index}].{exc.field}", exc.message) from None
        return (encoder_stage(w, arch, st, ov, info),)
    try:
        arch = resolve_model(w.model)
        statics = statics_for(w, arch, ov.stack)
    except InvalidWorkload as exc:
        raise InvalidWorkload(f"workloads[{index}].{exc.field}", exc.message) from None
    if isinstance(w, InferenceWorkload):
        return tuple([inference_stage(w, arch, st, ov) for st in statics])
    return tuple([training_stage(w, arch, st, ov) for st in statics])


def device_subtotal(workloads: tuple[AnalyticWorkload, ...], device: DeviceContext | None) -> int:
    """Bytes of the most loaded device, headroom excluded (the workloads deployed)."""
    ov = device.overheads if device else DEFAULT_OVERHEADS
    subtotal = 0
    for i, w in enumerate(workloads):
        if isinstance(w, InferenceWorkload):  # the solver's hot path
            try:
                arch = resolve_model(w.model)
                statics = statics_for(w, arch, ov.stack)
            except InvalidWorkload as exc:
                raise InvalidWorkload(f"workloads[{i}].{exc.field}", exc.message) from None
            subtotal += max(inference_total(w, arch, st, ov) for st in statics)
        else:
            subtotal += max(sum(s.values.values()) for s in workload_stages(w, ov, i))
    return subtotal


def device_counted(workloads: tuple[AnalyticWorkload, ...], device: DeviceContext | None) -> int:
    """The floor under the layout's worst device (:attr:`StageNumbers.counted`): one
    workload's largest over its pipeline stages (each stage's device holds its own), co-located
    ones' sum over the peak phases of their most loaded stages, the phases the co-located
    subtotal adds up (their largest-holding phases need not coincide)."""
    ov = device.overheads if device else DEFAULT_OVERHEADS
    per = [workload_stages(w, ov, i) for i, w in enumerate(workloads)]
    if len(per) == 1:
        return max([s.counted for s in per[0]])
    return colocated_counted(per)


def colocated_counted(per_workload: list[tuple[StageNumbers, ...]]) -> int:
    """Co-located workloads' floor: the counted bytes of each one's most loaded stage at its
    peak phase, summed as the co-located subtotal sums those phases."""
    return sum([counted_bytes(top_stage(stages).values) for stages in per_workload])


def device_totals(
    workloads: tuple[AnalyticWorkload, ...], device: DeviceContext | None, headroom: Headroom
) -> int:
    """Total bytes of the most loaded device, headroom included: the solver's objective (the
    workloads deployed; the headroom resolved, :func:`vrambudget.core.bands.resolve_headroom`)."""
    subtotal = device_subtotal(workloads, device)
    if headroom.fraction is None:  # the default: the band's high end
        stack = (device.overheads if device else DEFAULT_OVERHEADS).stack
        headroom = resolve_headroom(
            headroom, band_rule(tuple(workload_class(w) for w in workloads), stack)
        )
    return subtotal + headroom_bytes(subtotal, headroom)


@dataclass(slots=True)
class _Static:
    """What a budget's answer takes from its request other than the workloads' batch, context
    and concurrency (:func:`vrambudget.core.host.persistent_key`): built once per request
    shape (:func:`_static_and_stages`), so budgets that differ only in those resolve nothing
    again."""

    profiles: ProfileSet | None
    ctx: DeviceContext | None
    ov: Overheads
    band: BandRule
    stack_use: StackUse
    headroom: Headroom
    archs: list[Arch | None]
    summaries: tuple[WorkloadSummary, ...]
    host_ram: HostBudget
    disk: DiskBudget
    device: DeviceSummary | None
    calibration: CalibrationUse
    plans: list[tuple[Plan, ...] | None]
    """An inference workload's plan per pipeline stage (None for other kinds)."""
    warnings: list[tuple[str, ...] | None]
    """An inference workload's shape warnings (None for other kinds)."""
    inputs: tuple[dict[str, Any], dict[str, Any]] | None
    """A single inference workload's inputs other than its sequences and tokens."""


def _build_static(
    workloads: tuple[AnalyticWorkload, ...],
    profiles: ProfileSet | None,
    ctx: DeviceContext | None,
    ov: Overheads,
    tags: tuple[BandRule, StackUse],
    headroom: Headroom,
    disk: DiskOptions,
) -> _Static:
    archs = [None if isinstance(w, GenericWorkload) else resolve_model(w.model) for w in workloads]
    pairs = tuple(zip(workloads, archs, strict=True))
    host_ram, disk_budget = host_and_disk(pairs, disk, ov.stack)
    plans: list[tuple[Plan, ...] | None] = []
    warnings: list[tuple[str, ...] | None] = []
    for w, arch in pairs:
        if type(w) is InferenceWorkload and arch is not None:
            plans.append(tuple(plan_of(w, arch, st, ov) for st in statics_for(w, arch, ov.stack)))
            warnings.append(tuple(shape_warnings(w, arch, ov.stack)))
        else:
            plans.append(None)
            warnings.append(None)
    w, arch = workloads[0], archs[0]
    parts = (
        inference_input_parts(w, arch, ov)
        if len(workloads) == 1 and type(w) is InferenceWorkload and arch is not None
        else None
    )
    return _Static(
        profiles,
        ctx,
        ov,
        tags[0],
        tags[1],
        headroom,
        archs,
        tuple(summary(w, a) for w, a in pairs),
        host_ram,
        disk_budget,
        ctx.summary() if ctx is not None else None,
        calibration_use(ov),
        plans,
        warnings,
        parts,
    )


# By request shape: the workloads' persistent keys, the device, headroom, profiles (by
# identity, checked on a hit), software and disk options.
_STATIC: BoundedCache[tuple[object, ...], _Static] = BoundedCache(1024)


def _static_and_stages(
    workloads: tuple[AnalyticWorkload, ...],
    device: DeviceRef | None,
    headroom: Headroom | None,
    profiles: ProfileSet | None,
    software: Software | None,
    disk: DiskOptions,
) -> tuple[_Static, list[tuple[StageNumbers, ...]]]:
    """The request shape's static parts (cached) and the workloads' stages; on a miss in the
    order whose first error the answer names: the device, then each workload."""
    keys = tuple([_shape_key(w) for w in workloads])
    key = (keys, device, headroom, id(profiles), software, disk)
    hit = _STATIC.get(key)
    if hit is not None and hit.profiles is profiles:
        return hit, [
            workload_stages(w, hit.ov, i)
            if plans is None
            else tuple([plan_stage(w, p) for p in plans])  # type: ignore[arg-type]
            for i, (w, plans) in enumerate(zip(workloads, hit.plans, strict=True))
        ]
    ctx = resolve_device(device, profiles, software)
    ov = ctx.overheads if ctx else with_software(DEFAULT_OVERHEADS, software)
    tags = _tags(workloads, ov.stack)
    resolved = resolve_headroom(headroom or Headroom(), tags[0])
    stages = [workload_stages(w, ov, i) for i, w in enumerate(workloads)]
    static = _build_static(workloads, profiles, ctx, ov, tags, resolved, disk)
    return _STATIC.put(key, static), stages


def _shape_key(w: AnalyticWorkload) -> object:
    """What a workload's static parts depend on: its persistent key, and an inference
    workload's attention, logits and chunking (its plan, inputs and warnings)."""
    if type(w) is InferenceWorkload:
        return (persistent_key(w), w.attention, w.logits, w.prefill_chunk_tokens)
    return persistent_key(w)


def _tags(workloads: tuple[AnalyticWorkload, ...], stack: Stack) -> tuple[BandRule, StackUse]:
    """The band of workloads (by their classes) and the stack's behaviours that apply to them."""
    classes = tuple(workload_class(w) for w in workloads)
    kinds = frozenset().union(
        *(stack_kinds(c) for c in classes),
        *(_layout_kinds(w) for w in workloads),
        *(_base_kinds(w) for w in workloads),
    )
    return band_rule(classes, stack), stack.use(kinds)


def _base_kinds(w: AnalyticWorkload) -> frozenset[str]:
    """``lora_bnb_base``: LoRA over a bitsandbytes-loaded base (QLoRA, ``bnb_4bit``, LLM.int8),
    whose adapters TRL's SFTTrainer treats apart."""
    if isinstance(w, TrainingWorkload) and isinstance(w.method, LoRA) and bnb_loaded(w):
        return frozenset({"lora_bnb_base"})
    return frozenset()


def _layout_kinds(w: AnalyticWorkload) -> frozenset[str]:
    """Kinds a training workload's data-parallel layout adds: ``sharded_data_parallel``
    (ZeRO >= 2 over several replicas: how gradients are synchronized matters),
    ``zero3_data_parallel`` (ZeRO-3: how the model reaches its partitions; with QLoRA also
    ``qlora_zero3_data_parallel`` (QLoRA or LoRA over ``bnb_4bit``): where its quantization
    state lives; with LoRA over GPTQ or AWQ ``buffer_quantized_zero3_data_parallel``: its
    packed base stays whole; over a bitsandbytes 4-bit, GPTQ or AWQ base, one instance and no
    tensor or pipeline parallelism, ``quantized_zero3_data_parallel``, and unquantized
    ``unquantized_zero3_data_parallel``: how the model reaches its partitions) and
    ``lora_data_parallel`` (LoRA over several replicas: how FSDP wraps frozen weights)."""
    if not isinstance(w, TrainingWorkload) or w.parallelism.data == 1:
        return frozenset()
    kinds = set()
    if w.parallelism.zero_stage >= 2:
        kinds.add("sharded_data_parallel")
    if w.parallelism.zero_stage >= 3:
        kinds.add("zero3_data_parallel")
        q = w.precision.quantization
        if bnb_4bit(w):
            kinds.add("qlora_zero3_data_parallel")
        elif isinstance(w.method, LoRA) and stored_as_buffers(q):
            kinds.add("buffer_quantized_zero3_data_parallel")
        if zero3_quantized_init_applies(w):
            kinds.add("quantized_zero3_data_parallel")
        elif not (bnb_4bit(w) or stored_as_buffers(q)) and (q is None or q is UNSET):
            kinds.add("unquantized_zero3_data_parallel")
    if isinstance(w.method, LoRA) and not isinstance(w.method, QLoRA):
        kinds.add("lora_data_parallel")
    return frozenset(kinds)


def stack_kinds(workload_class: str) -> frozenset[str]:
    """The kinds of workload a stack behaviour may apply to, from the workload's class."""
    if workload_class.startswith("fine_tuning_qlora"):
        return frozenset({"training", "lora", "qlora"})
    if workload_class.startswith("fine_tuning_lora"):
        return frozenset({"training", "lora"})
    if workload_class.startswith(("training", "fine_tuning")):
        return frozenset({"training"})
    return frozenset({"inference" if workload_class.startswith("inference") else "other"})


def analytic_budget(
    workloads: tuple[AnalyticWorkload, ...],
    device: DeviceRef | None = None,
    headroom: Headroom | None = None,
    profiles: ProfileSet | None = None,
    software: Software | None = None,
    notes: tuple[str, ...] = (),
    disk: DiskOptions = DEFAULT_DISK,
    allocator_replay: bool = False,
) -> Budget:
    """The full answer for co-located inference, training and generic workloads on one device
    type (deployed: :func:`vrambudget.core.deployed.deploy_all`); ``notes`` lead the
    warnings; ``disk`` says which copies of the model files the disk counts;
    ``allocator_replay`` adds what the allocator will hold for transformers ``generate``
    (``DeviceBudget.allocator_cache``, up to a few seconds)."""
    static, per_workload = _static_and_stages(workloads, device, headroom, profiles, software, disk)
    ctx, ov, band, archs = static.ctx, static.ov, static.band, static.archs
    headroom = static.headroom
    warnings: list[str] = list(notes)
    for w, arch, shape in zip(workloads, archs, static.warnings, strict=True):
        if shape is None:
            warnings += workload_warnings(w, arch, ctx, ov.stack)
        else:  # an inference workload
            warnings += shape
            warnings += size_warnings(w, arch)  # type: ignore[arg-type]
    devices: list[DeviceBudget] = []
    if len(workloads) == 1:
        w, arch = workloads[0], archs[0]
        inputs_ = (
            inputs(w, arch, ov) if static.inputs is None else scaled_inputs(w, *static.inputs)  # type: ignore[arg-type]
        )
        for s in per_workload[0]:
            label = (
                "every device"
                if s.stage is None or len(per_workload[0]) == 1
                else (f"pipeline stage {s.stage}")
            )
            devices.append(
                device_budget(
                    label,
                    s.stage,
                    s.num_devices,
                    s.peak_phase,
                    s.values,
                    s.parts,
                    s.phases,
                    inputs_,
                    INPUT_NAMES[kind(w)],
                    headroom,
                    ov,
                    s.transient_bytes,
                    band,
                    s.counted,
                )
            )
        if allocator_replay and isinstance(w, InferenceWorkload) and len(devices) == 1:
            cache = allocator_cache(w, ov, devices[0], ctx.capacity_bytes if ctx else None)
            if cache is not None:
                devices[0] = msgspec.structs.replace(devices[0], allocator_cache=cache)
    else:
        # Co-located: the most loaded stage of each workload shares one device.
        values: dict[Component, int] = {}
        parts: dict[Component, list[tuple[str, int]]] = {}
        peaks = []
        for w, stages_, arch in zip(workloads, per_workload, archs, strict=True):
            top = top_stage(stages_)
            name = summary(w, arch).name
            peaks.append(f"{name}: {top.peak_phase}")
            for c, v in top.values.items():
                values[c] = values.get(c, 0) + v
                if not v:
                    continue
                own = top.parts.get(c) if c is Component.CUDA_CONTEXT else None
                if own:  # the context and its kernel images, per workload
                    parts.setdefault(c, []).extend((f"{name}: {n}", b) for n, b in own)
                else:  # a part per workload that holds bytes of this component
                    parts.setdefault(c, []).append((name, v))
        devices.append(
            device_budget(
                "co-located (most loaded stage of each workload)",
                None,
                1,
                "; ".join(peaks),
                values,
                {c: tuple(p) for c, p in parts.items()},
                (("co-located peak", sum(values.values())),),
                {"workloads": len(workloads)},
                NO_NAMES,
                headroom,
                ov,
                band=band,
                counted=colocated_counted(per_workload),
            )
        )
    most = (
        0 if len(devices) == 1 else max(range(len(devices)), key=lambda i: devices[i].total_bytes)
    )
    return Budget(
        workloads=static.summaries,
        device=static.device,
        devices=tuple(devices),
        most_loaded=most,
        total_bytes=devices[most].total_bytes,
        host_ram=static.host_ram,
        disk=static.disk,
        warnings=tuple(warnings),
        calibration=static.calibration,
        stack=static.stack_use,
    )
