"""The analytic tier: workload in, component-wise budget per device out.

``device_totals`` is the numeric core (integers only, no strings) that the fit solver calls many
times; ``estimate`` adds each line's formula, inputs and source for the answer. Both share the
same component functions, so an explained number and a solved number cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgspec

from .activations import (
    FULL_TRAINING,
    inference_working_set,
    lora_trainable,
    training_saved,
)
from .arch import Arch
from .calibration import ProfileSet, apply_profile
from .catalog import GPU, gpu
from .components import Component
from .dtypes import bytes_of, native_dtype_name
from .errors import InvalidWorkload
from .host import cached, host_and_disk, persistent_key
from .overheads import (
    ROUNDING_PART,
    Overheads,
    device_overheads,
)
from .resolve import model_name, resolve_model
from .result import (
    Budget,
    CalibrationUse,
    DeviceBudget,
    DeviceSummary,
    Line,
    OverheadOrigin,
    Part,
    Phase,
    WorkloadSummary,
)
from .spec import (
    CatalogDevice,
    CustomDevice,
    DeviceRef,
    FullFineTune,
    GenericWorkload,
    Headroom,
    InferenceWorkload,
    LLMServingWorkload,
    LoRA,
    QLoRA,
    Software,
    TrainingWorkload,
    Workload,
)
from .statics import StageStatic, stage_statics, training_plan
from .units import ceil_div

__all__ = [
    "DeviceContext",
    "StageNumbers",
    "device_totals",
    "dtype_warnings",
    "estimate",
    "headroom_bytes",
    "inference_total",
    "resolve_device",
    "statics_for",
    "workload_stages",
]

C = Component
ORDER: tuple[Component, ...] = tuple(Component)
_INDEX: dict[Component, int] = {c: i for i, c in enumerate(ORDER)}  # a line's place


@dataclass(frozen=True, slots=True)
class DeviceContext:
    name: str
    id: str | None
    memory_total_bytes: int
    architecture: str
    vendor: str
    native_dtypes: frozenset[str]
    overheads: Overheads


_DEFAULT_OVERHEADS = device_overheads(None, "nvidia", None)


def resolve_device(ref: DeviceRef | GPU | None, profiles: ProfileSet | None = None,
                   software: Software | None = None) -> DeviceContext | None:
    """The device's context; with ``profiles``, the overheads of the best-matching calibration
    profile replace the built-in ones."""
    match ref:
        case None:
            return None
        case CatalogDevice():
            ctx = _catalog_context(gpu(ref.id))
        case GPU():
            ctx = _catalog_context(ref)
        case CustomDevice():
            ctx = DeviceContext(ref.name, None, ref.memory_total_bytes, ref.architecture,
                                "nvidia", frozenset(ref.native_dtypes), _DEFAULT_OVERHEADS)
        case _:
            raise TypeError(ref)
    if profiles:
        profile, matched = profiles.best(ctx.id, ctx.name, software)
        if profile is not None:
            key = (ctx, profile.id, matched)
            hit = _CALIBRATED.get(key)
            if hit is None:
                hit = _CALIBRATED[key] = dataclasses.replace(
                    ctx, overheads=apply_profile(ctx.overheads, profile, matched))
            return hit
    return ctx


_CALIBRATED: dict[tuple[DeviceContext, str, tuple[str, ...]], DeviceContext] = {}


_CONTEXTS: dict[str, DeviceContext] = {}


def _catalog_context(g: GPU) -> DeviceContext:
    ctx = _CONTEXTS.get(g.id)
    if ctx is None:
        ctx = DeviceContext(g.name, g.id, g.memory_total_bytes, g.architecture, g.vendor,
                            frozenset(g.native_dtypes),
                            device_overheads(g.compute_capability, g.vendor, g.gfx_target))
        _CONTEXTS[g.id] = ctx
    return ctx


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 4x (one per budget)
class StageNumbers:
    """Component bytes of one stage's device at its peak phase, and every phase's total
    (treated as immutable)."""

    stage: int | None
    num_devices: int
    peak_phase: str
    values: dict[Component, int]
    parts: dict[Component, tuple[tuple[str, int], ...]]
    phases: tuple[tuple[str, int], ...]
    transient_bytes: int = 0
    """The largest transient bytes, which the fragmentation fraction multiplies."""


# ------------------------------------------------------------------------ shared pieces ----


def _effective_precision(w: InferenceWorkload | TrainingWorkload) -> Any:
    if isinstance(w, TrainingWorkload) and isinstance(w.method, QLoRA):
        return msgspec.structs.replace(w.precision, quantization=w.method.base_quantization)
    return w.precision


def statics_for(w: InferenceWorkload | TrainingWorkload, arch: Arch) -> tuple[StageStatic, ...]:
    plan = training_plan(w) if isinstance(w, TrainingWorkload) else None
    return stage_statics(arch, _effective_precision(w), w.parallelism, plan)


def _kv_bytes_per_elem(w: InferenceWorkload) -> int:
    kv = w.precision.kv_cache
    return bytes_of(w.precision.compute if kv == "auto" else kv)


def _kv_bytes(st: StageStatic, sequences: int, context: int, elem_bytes: int) -> int:
    per_sequence = st.kv_full_elems * context
    for window, elems in st.kv_sliding:
        per_sequence += elems * min(context, window)
    return per_sequence * sequences * elem_bytes


def _inference_activations(st: StageStatic, arch: Arch, sequences: int, query: int,
                           keys: int, e: int, attention: str) -> int:
    """The largest working set over the stage's layer kinds (layers run one at a time)."""
    peak = 0
    for layer, _ in st.layer_kinds:
        ws = inference_working_set(layer, arch, st.dims, sequences, query, keys, e, attention)
        if ws > peak:
            peak = ws
    return peak


def _inference_logits(st: StageStatic, arch: Arch, rows: int, e: int) -> int:
    """LM-head output in the compute dtype on this device's vocabulary slice, plus the fp32
    copy of the full vocabulary that sampling takes (vLLM gathers logits on the first rank)."""
    if not st.stage.last or arch.kind != "decoder":
        return 0
    return rows * (st.dims.vocab * e + st.dims.vocab_full * 4)


def _overhead_values(ov: Overheads, instances: int) -> tuple[int, int]:  # training, generic
    return ov.cuda_context_bytes * instances, ov.workspace_bytes * instances


def _fragmentation(transient: int, ppm: int) -> int:
    # Integer arithmetic: exact for any size (floats would round above 2^53 bytes).
    return -(-transient * ppm // 1_000_000)


def _allocator(rounding: int, transient: int, ppm: int) -> int:
    return rounding + -(-transient * ppm // 1_000_000)  # = rounding + _fragmentation(...)


def _allocator_parts(rounding: int, transient: int, ppm: int) -> tuple[tuple[str, int], ...]:
    return ((ROUNDING_PART, rounding), ("fragmentation of transient memory",
                                        _fragmentation(transient, ppm)))


def _communication(st: StageStatic, ov: Overheads) -> tuple[int, tuple[tuple[str, int], ...]]:
    """The stage's communication buffers; a calibrated NCCL communicator size replaces the
    built-in one in every NCCL part."""
    if ov.nccl_communicator_bytes is None:
        return st.comm_bytes, st.comm_parts
    parts = tuple((n, ov.nccl_communicator_bytes if n.startswith("NCCL") else b)
                  for n, b in st.comm_parts)
    return sum(b for _, b in parts), parts


def _times(parts: Any, k: int) -> tuple[tuple[str, int], ...]:
    """Parts of ``k`` identical instances (lines are per device, all instances included)."""
    return tuple(parts) if k == 1 else tuple((name, b * k) for name, b in parts)


def _finish(stage: int | None, num_devices: int, phases: list[tuple[str, dict[Component, int]]],
            parts: dict[Component, tuple[tuple[str, int], ...]], transient: int = 0
            ) -> StageNumbers:
    """The peak phase is the one with the largest device total (the first on a tie)."""
    totals = tuple([(n, sum(v.values())) for n, v in phases])
    best = _peak(totals)
    return StageNumbers(stage, num_devices, phases[best][0], phases[best][1], parts, totals,
                        transient)


def _peak(totals: tuple[tuple[str, int], ...]) -> int:
    """Index of the largest phase total, the first on a tie."""
    best = 0
    for i in range(1, len(totals)):
        if totals[i][1] > totals[best][1]:
            best = i
    return best


# ------------------------------------------------------------------------------ inference --


def _inference_terms(w: InferenceWorkload, arch: Arch, st: StageStatic, ov: Overheads
                     ) -> tuple[dict[Component, int], list[tuple[str, int, int]]]:
    """Persistent bytes by component, and per phase (name, activations, logits): the one place
    the inference formulas are combined, used both for the explained budget and the solver."""
    e = bytes_of(w.precision.compute)
    n_seq = w.num_sequences
    k = w.instances
    kv = _kv_bytes(st, n_seq, w.context_tokens, _kv_bytes_per_elem(w)) if (
        arch.kind == "decoder") else 0
    persistent = {
        C.WEIGHTS: st.weights_bytes * k,
        C.QUANTIZATION_METADATA: st.metadata_bytes * k,
        C.KV_CACHE: kv * k,
        C.CUDA_CONTEXT: ov.cuda_context_bytes * k,
        C.RUNTIME_WORKSPACE: ov.workspace_bytes * k,
        C.COMMUNICATION_BUFFERS: (st.comm_bytes if ov.nccl_communicator_bytes is None else
                                  _communication(st, ov)[0]) * k,
    }
    chunk = w.prefill_chunk_tokens
    prompt_total = w.prompt_tokens * n_seq
    if chunk is not None and chunk < prompt_total:
        # Chunked prefill (vLLM): every step carries `chunk` tokens, packing whole and partial
        # prompts; a query may attend to its whole prompt (the last chunk of a prompt). Logits
        # of the last position: at most one per sequence in the step.
        acts = _inference_activations(st, arch, 1, chunk, w.prompt_tokens, e, w.attention)
        rows = chunk if w.logits == "all" else min(n_seq, chunk)
    else:
        acts = _inference_activations(st, arch, n_seq, w.prompt_tokens, w.prompt_tokens, e,
                                      w.attention)
        rows = prompt_total if w.logits == "all" else n_seq
    phases = [("prefill" if arch.kind == "decoder" else "forward", acts * k,
               _inference_logits(st, arch, rows, e) * k)]
    if arch.kind == "decoder" and w.generated_tokens > 0:
        acts = _inference_activations(st, arch, n_seq, 1, w.context_tokens, e, w.attention)
        phases.append(("decode", acts * k, _inference_logits(st, arch, n_seq, e) * k))
    return persistent, phases


def _inference_stage(w: InferenceWorkload, arch: Arch, st: StageStatic, ov: Overheads
                     ) -> StageNumbers:
    persistent, terms = _inference_terms(w, arch, st, ov)
    rounding = st.weights_rounding_bytes * w.instances
    transient = max([a + lg for _, a, lg in terms])
    overhead = _allocator(rounding, transient, ov.inference_fragmentation_ppm)
    # Phases differ only in activations and logits: their totals without a dict per phase.
    base = sum(persistent.values()) + overhead
    totals = tuple([(name, base + a + lg) for name, a, lg in terms])
    name, acts, logits = terms[_peak(totals)]
    values = persistent  # a fresh dict per call
    values[C.ACTIVATIONS] = acts
    values[C.LOGITS] = logits
    values[C.ALLOCATOR_OVERHEAD] = overhead
    parts = {C.COMMUNICATION_BUFFERS: _times(_communication(st, ov)[1], w.instances),
             C.ALLOCATOR_OVERHEAD: _allocator_parts(rounding, transient,
                                                    ov.inference_fragmentation_ppm)}
    return StageNumbers(st.stage.index, w.parallelism.tensor * w.parallelism.data, name, values,
                        parts, totals, transient)


def inference_total(w: InferenceWorkload, arch: Arch, st: StageStatic, ov: Overheads) -> int:
    """The peak-phase total of ``_inference_stage`` without building its dictionaries."""
    persistent, terms = _inference_terms(w, arch, st, ov)
    rounding = st.weights_rounding_bytes * w.instances
    base = sum(persistent.values())
    transient = max(a + lg for _, a, lg in terms)
    return base + transient + _allocator(rounding, transient, ov.inference_fragmentation_ppm)


# ------------------------------------------------------------------------------- training --


def _in_flight(w: TrainingWorkload, stage: int) -> tuple[int, float]:
    """Micro-batches whose activations a pipeline stage holds at once, and the interleaving
    factor (Narayanan et al. 2021 §2.2; Korthikanti et al. 2022 §4.2.3)."""
    par = w.parallelism
    p, m = par.pipeline, w.gradient_accumulation_steps
    if p == 1:
        return 1, 1.0
    if par.pipeline_schedule == "gpipe":
        return m, 1.0
    count = min(p - stage, m)
    if par.pipeline_schedule == "interleaved_1f1b" and par.virtual_stages > 1:
        return count, 1.0 + (p - 1) / (p * par.virtual_stages)
    return count, 1.0


def training_activations(w: TrainingWorkload, arch: Arch, st: StageStatic
                         ) -> tuple[int, int, list[tuple[str, int]]]:
    """(all saved activations of the stage, one layer's saved activations, itemized parts)."""
    e = bytes_of(w.precision.compute)
    par = w.parallelism
    s, b = w.sequence_length, w.micro_batch_size
    ckpt = w.checkpointing
    per_layer_total = 0
    one_layer = 0
    items: dict[str, int] = {}
    m = w.method
    for layer, n in st.layer_kinds:
        tr = FULL_TRAINING
        if isinstance(m, LoRA):
            tr = lora_trainable(layer, arch, par.tensor, tuple(m.target_modules), m.rank,
                                bytes_of(m.adapter_dtype), e)
        saved = training_saved(layer, arch, st.dims, seq=s, batch=b, e=e, attention=w.attention,
                               dropout=w.dropout, sequence_parallel=par.sequence_parallel,
                               drop_scores=ckpt == "selective", trainable=tr)
        layer_bytes = sum(saved.values())
        one_layer = max(one_layer, sum(training_saved(
            layer, arch, st.dims, seq=s, batch=b, e=e, attention=w.attention, dropout=w.dropout,
            sequence_parallel=par.sequence_parallel, drop_scores=False, trainable=tr).values()))
        if ckpt == "full":
            kept = ceil_div(s * b * arch.hidden_size * e,
                            par.tensor if par.sequence_parallel else 1)
            per_layer_total += kept * n
            items["layer inputs (full recomputation)"] = (
                items.get("layer inputs (full recomputation)", 0) + kept * n)
        else:
            per_layer_total += layer_bytes * n
            for k, v in saved.items():
                items[k] = items.get(k, 0) + v * n
    count, factor = _in_flight(w, st.stage.index)
    total = int(per_layer_total * count * factor)
    parts = [(k, int(v * count * factor)) for k, v in items.items() if v]
    if ckpt == "full":
        total += one_layer  # the layer being recomputed during backward
        parts.append(("one layer recomputed in backward", one_layer))
    if st.stage.last and arch.kind == "decoder":
        head_inputs = 2 * s * b * arch.hidden_size * e  # final norm input, LM head input
        total += head_inputs
        parts.append(("final norm and LM-head inputs", head_inputs))
    if st.stage.first and w.dropout:
        mask = s * b * arch.hidden_size
        total += mask
        parts.append(("embedding dropout mask", mask))
    if count > 1 or factor != 1.0:
        parts.append((f"x {count} micro-batches in flight" + (
            f" x {factor:.4f} interleaving" if factor != 1.0 else ""), 0))
    return total, one_layer, parts


def _training_stage(w: TrainingWorkload, arch: Arch, st: StageStatic, ov: Overheads
                    ) -> StageNumbers:
    e = bytes_of(w.precision.compute)
    tokens = w.sequence_length * w.micro_batch_size
    acts, one_layer, act_parts = training_activations(w, arch, st)
    has_head = st.stage.last and arch.kind == "decoder"  # encoders here have no LM head
    # Forward: the LM-head output, its fp32 copy and the fp32 log-softmax are live together.
    # Backward start: the saved log-softmax, the loss's fp32 gradient and log-softmax's fp32
    # input gradient (the forward's low-precision logits and fp32 copy are freed by then: no
    # backward needs them).
    logits = tokens * st.dims.vocab * (e + 4 + 4) if has_head else 0
    logits_bwd = tokens * st.dims.vocab * (4 + 4 + 4) if has_head else 0
    context, workspace = _overhead_values(ov, w.instances)
    extra_ws: list[tuple[str, int]] = [("cuBLAS/cuBLASLt workspace", workspace)]
    if isinstance(w.method, QLoRA):
        dequant = st.largest_linear_params * e * w.instances
        extra_ws.append(("4-bit dequantized weight (largest projection)", dequant))
        workspace += dequant
    if w.mixed_precision == "autocast":
        cast = (st.num_params if isinstance(w.method, FullFineTune) else 0) * e
        if cast:
            extra_ws.append(("autocast low-precision weight cache", cast * w.instances))
            workspace += cast * w.instances
    k = w.instances
    grads_live = st.gradient_bytes if (w.gradient_accumulation_steps > 1) else 0
    base = {
        C.WEIGHTS: st.weights_bytes * k,
        C.QUANTIZATION_METADATA: st.metadata_bytes * k,
        C.ADAPTERS: st.adapter_bytes * k,
        C.OPTIMIZER_STATE: st.optimizer_bytes * k,
        C.MASTER_WEIGHTS: st.master_bytes * k,
        C.CUDA_CONTEXT: context,
        C.RUNTIME_WORKSPACE: workspace,
        C.COMMUNICATION_BUFFERS: _communication(st, ov)[0] * k,
    }
    rounding = st.weights_rounding_bytes * k

    transients: list[int] = []

    def phase(grads: int, a: int, lg: int, transient: int = 0) -> dict[Component, int]:
        v = dict(base)
        v[C.GRADIENTS] = grads * k
        v[C.ACTIVATIONS] = a * k
        v[C.LOGITS] = lg * k
        transients.append((a + lg + transient) * k)
        return v

    phases = [
        ("forward", phase(grads_live, acts, logits)),
        ("backward_start", phase(grads_live, acts, logits_bwd)),
        ("backward_end", phase(st.gradient_bytes, one_layer, 0)),
    ]
    # The optimizer step: gradients (fp32 when stepping fp32 masters; the largest tensor's
    # low-precision gradient still live while it is upcast) plus the implementation's
    # temporaries, whichever moment is larger.
    upcast_grads = st.step_gradient_bytes if st.master_bytes else 0  # allocated for the step
    step = phase(st.step_gradient_bytes, 0, 0, upcast_grads + max(st.step_upcast_bytes,
                                                                   st.step_temporary_bytes))
    if st.step_upcast_bytes >= st.step_temporary_bytes:
        step[C.GRADIENTS] += st.step_upcast_bytes * k
    else:
        step[C.OPTIMIZER_STATE] += st.step_temporary_bytes * k
    phases.append(("optimizer_step", step))
    transient = max(transients)
    overhead = _allocator(rounding, transient, ov.training_fragmentation_ppm)
    for _, v in phases:
        v[C.ALLOCATOR_OVERHEAD] = overhead
    parts = {
        C.ACTIVATIONS: _times(act_parts, k),
        C.COMMUNICATION_BUFFERS: _times(_communication(st, ov)[1], k),
        C.RUNTIME_WORKSPACE: tuple(extra_ws),
        C.ALLOCATOR_OVERHEAD: _allocator_parts(rounding, transient,
                                               ov.training_fragmentation_ppm),
    }
    par = w.parallelism
    numbers = _finish(st.stage.index, par.tensor * par.data, phases, parts, transient)
    # Parts describe the peak phase only.
    if numbers.peak_phase == "optimizer_step":
        parts[C.ACTIVATIONS] = ()
        extra = step[C.OPTIMIZER_STATE] - base[C.OPTIMIZER_STATE]
        if extra:
            parts[C.OPTIMIZER_STATE] = (("moments and statistics", base[C.OPTIMIZER_STATE]),
                                        ("optimizer step temporaries", extra))
        if st.step_upcast_bytes >= st.step_temporary_bytes and st.step_upcast_bytes:
            parts[C.GRADIENTS] = (("fp32 gradients of the masters", st.step_gradient_bytes * k),
                                  ("low-precision gradient being upcast",
                                   st.step_upcast_bytes * k))
    elif numbers.peak_phase == "backward_end":
        parts[C.ACTIVATIONS] = (("one layer's saved tensors (last gradients)", one_layer * k),)
    elif has_head:
        v = tokens * st.dims.vocab
        if numbers.peak_phase == "backward_start":
            logit_parts = [("log-softmax saved by cross-entropy (fp32)", v * 4),
                           ("loss gradient (fp32)", v * 4),
                           ("log-softmax input gradient (fp32)", v * 4)]
        else:
            logit_parts = [("lm_head output", v * e), ("fp32 upcast for the loss", v * 4),
                           ("log-softmax saved by cross-entropy", v * 4)]
        parts[C.LOGITS] = _times(logit_parts, k)
    return numbers


# -------------------------------------------------------------------------------- generic --


def _generic(w: GenericWorkload, ov: Overheads) -> StageNumbers:
    k = w.instances
    assets = sum(i.bytes for i in w.assets)
    per_item = sum(i.bytes for i in w.per_item) * w.batch_size
    caches = sum(c.bytes_per_unit * c.units for c in w.caches)
    workspaces = sum(i.bytes for i in w.workspaces)
    context = ov.cuda_context_bytes * k if w.uses_cuda_context else 0
    values = {c: 0 for c in ORDER}
    values[C.WEIGHTS] = assets * k
    values[C.ACTIVATIONS] = per_item * k
    values[C.KV_CACHE] = caches * k
    values[C.RUNTIME_WORKSPACE] = workspaces * k
    values[C.CUDA_CONTEXT] = context
    values[C.ALLOCATOR_OVERHEAD] = _allocator(0, per_item * k, ov.generic_fragmentation_ppm)
    values.pop(C.HEADROOM)
    parts = {
        C.WEIGHTS: tuple((i.name, i.bytes) for i in w.assets),
        C.ACTIVATIONS: tuple((i.name, i.bytes * w.batch_size) for i in w.per_item),
        C.KV_CACHE: tuple((c.name, c.bytes_per_unit * c.units) for c in w.caches),
        C.RUNTIME_WORKSPACE: tuple((i.name, i.bytes) for i in w.workspaces),
    }
    return _finish(None, 1, [("steady", values)], parts, per_item * k)


# ------------------------------------------------------------------------ numeric core -----


def workload_stages(w: Workload, ov: Overheads, index: int = 0) -> tuple[StageNumbers, ...]:
    """Per pipeline stage of one workload: its peak-phase component bytes (headroom excluded).
    Errors name the field as ``workloads[index].<path>``."""
    if isinstance(w, GenericWorkload):
        return (_generic(w, ov),)
    try:
        arch = resolve_model(w.model)
        statics = statics_for(w, arch)
    except InvalidWorkload as exc:
        raise InvalidWorkload(f"workloads[{index}].{exc.field}", exc.message) from None
    if isinstance(w, InferenceWorkload):
        return tuple([_inference_stage(w, arch, st, ov) for st in statics])
    return tuple([_training_stage(w, arch, st, ov) for st in statics])


def headroom_bytes(subtotal: int, headroom: Headroom) -> int:
    return _headroom(subtotal, round(headroom.fraction * 1_000_000), headroom.min_bytes)


def _headroom(subtotal: int, ppm: int, min_bytes: int) -> int:
    """The headroom with its fraction in millionths (exact integers)."""
    room = -(-subtotal * ppm // 1_000_000)
    return room if room > min_bytes else min_bytes


def device_totals(workloads: tuple[Workload, ...], device: DeviceContext | None,
                  headroom: Headroom) -> int:
    """Total bytes of the most loaded device, headroom included: the solver's objective."""
    ov = device.overheads if device else _DEFAULT_OVERHEADS
    subtotal = 0
    for i, w in enumerate(workloads):
        if isinstance(w, InferenceWorkload):  # the solver's hot path
            try:
                arch = resolve_model(w.model)
                statics = statics_for(w, arch)
            except InvalidWorkload as exc:
                raise InvalidWorkload(f"workloads[{i}].{exc.field}", exc.message) from None
            subtotal += max(inference_total(w, arch, st, ov) for st in statics)
        else:
            subtotal += max(sum(s.values.values()) for s in workload_stages(w, ov, i))
    return subtotal + headroom_bytes(subtotal, headroom)


# ------------------------------------------------------------------------- explanations ----

_FORMULAS: dict[Component, tuple[str, str]] = {
    C.WEIGHTS: ("sum over tensors on the device of rows x cols x bytes(dtype); quantized "
                "layers count their packed payload",
                "tensor inventory of transformers modeling_<family>.py; sharding per Megatron-LM "
                "(Shoeybi et al. 2019 §3) and vLLM"),
    C.QUANTIZATION_METADATA: ("sum over quantized tensors of scales + zero points + group "
                              "indices + codes",
                              "AutoGPTQ QuantLinear, AutoAWQ WQLinear_GEMM, bitsandbytes "
                              "functional.quantize_4bit / Int8Params, compressed-tensors fp8"),
    C.ADAPTERS: ("r x (in + out) x bytes(adapter) per adapted projection",
                 "Hu et al. 2021 (LoRA) §4.1; PEFT LoraLayer"),
    C.KV_CACHE: ("sequences x bytes(kv) x [sum_full_layers 2*kv_heads*head_dim x context + "
                 "sum_sliding_layers 2*kv_heads*head_dim x min(context, window)]; MLA: "
                 "(kv_lora_rank + qk_rope_head_dim) per layer",
                 "Pope et al. 2022 §2; DeepSeek-V2 §2.1.2 (MLA); vLLM kv_cache_interface.py"),
    C.ACTIVATIONS: ("training: tensors saved for backward per layer x layers x micro-batches "
                    "in flight; inference: residual + max(attention, MLP) working set of one "
                    "forward pass",
                    "Korthikanti et al. 2022 §4 (Table 2); Dao et al. 2022 §3 (flash attention)"),
    C.LOGITS: ("rows x vocab_per_device x bytes (training: + fp32 copy + fp32 log-softmax)",
               "transformers ForCausalLMLoss (logits.float()); torch cross_entropy"),
    C.GRADIENTS: ("trainable params x bytes(grad) (/ data-parallel size with ZeRO >= 2)",
                  "Rajbhandari et al. 2020 (ZeRO) §3, §5"),
    C.OPTIMIZER_STATE: ("per trainable tensor: Adam 2 x numel x bytes(state); 8-bit Adam "
                        "2 x numel + absmax per 256 (fp32 below 4096 elements); SGD momentum "
                        "numel; Adafactor rows + cols (/ data-parallel size with ZeRO >= 1)",
                        "Loshchilov & Hutter 2019; Dettmers et al. 2022 (8-bit optimizers); "
                        "Shazeer & Stern 2018; ZeRO §5"),
    C.MASTER_WEIGHTS: ("trainable params x 4 when parameters are low precision (/ data-parallel "
                       "size with ZeRO >= 1)", "Micikevicius et al. 2018 §3.1; ZeRO §3"),
    C.CUDA_CONTEXT: ("one context per process", "see source"),
    C.RUNTIME_WORKSPACE: ("cuBLAS + cuBLASLt workspace per process (+ QLoRA dequantization "
                          "buffer, autocast weight cache)", "see source"),
    C.COMMUNICATION_BUFFERS: ("NCCL communicators of the layout + DDP/ZeRO buckets",
                              "NVIDIA/nccl#964; torch DDP docs; DeepSpeed ZeRO config"),
    C.ALLOCATOR_OVERHEAD: ("512-byte rounding of every weight tensor + fragmentation_fraction x "
                           "the largest transient bytes (activations, logits, step temporaries)",
                           "c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize = 512); fraction: "
                           "median of the trace tier's allocator replay over its oracle grid "
                           "(docs/ACCURACY.md), until calibrated by probes"),
    C.HEADROOM: ("max(ceil(fraction x device subtotal), min_bytes)", "requested by the caller"),
}


_PAR = ("tensor_parallel", "pipeline_parallel", "data_parallel")
_INPUT_NAMES: dict[str, dict[Component, tuple[str, ...]]] = {
    "inference": {
        C.WEIGHTS: ("weights_dtype", "quantization", "num_layers", "hidden_size", *_PAR[:2],
                    "instances"),
        C.QUANTIZATION_METADATA: ("quantization", *_PAR[:2], "instances"),
        C.KV_CACHE: ("sequences", "context_tokens", "num_layers", "num_kv_heads", "head_dim",
                     "kv_cache_dtype", "tensor_parallel", "instances"),
        C.ACTIVATIONS: ("sequences", "prompt_tokens", "context_tokens", "attention",
                        "hidden_size", "compute_dtype", "tensor_parallel", "instances"),
        C.LOGITS: ("sequences", "prompt_tokens", "logits", "compute_dtype", "tensor_parallel"),
        C.CUDA_CONTEXT: ("instances",),
        C.RUNTIME_WORKSPACE: ("instances",),
        C.COMMUNICATION_BUFFERS: _PAR[:2],
        C.ALLOCATOR_OVERHEAD: ("fragmentation_fraction", "largest_transient_bytes"),
    },
    "training": {
        C.WEIGHTS: ("weights_dtype", "quantization", "num_layers", "hidden_size", *_PAR,
                    "zero_stage"),
        C.QUANTIZATION_METADATA: ("quantization", *_PAR),
        C.ADAPTERS: ("method",),
        C.ACTIVATIONS: ("micro_batch_size", "sequence_length", "checkpointing", "attention",
                        "hidden_size", "num_layers", "compute_dtype", "tensor_parallel",
                        "pipeline_parallel"),
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
for _names in _INPUT_NAMES.values():
    _names[C.HEADROOM] = ("headroom_fraction", "headroom_min_bytes", "subtotal_bytes")
del _names


def _kind(w: Workload) -> str:
    return w.__struct_config__.tag  # type: ignore[return-value]


def _inputs(w: Workload, arch: Arch | None, ov: Overheads) -> dict[str, Any]:
    if isinstance(w, GenericWorkload):
        return {"batch_size": w.batch_size, "instances": w.instances,
                "fragmentation_fraction": ov.generic_fragmentation_ppm / 1_000_000}
    par = w.parallelism
    q = _effective_precision(w).quantization
    common: dict[str, Any] = {
        "tensor_parallel": par.tensor, "pipeline_parallel": par.pipeline,
        "data_parallel": par.data, "weights_dtype": w.precision.weights,
        "compute_dtype": w.precision.compute, "instances": w.instances,
        "quantization": q.__struct_config__.tag if q is not None else None,
        "fragmentation_fraction": (ov.training_fragmentation_ppm if isinstance(
            w, TrainingWorkload) else ov.inference_fragmentation_ppm) / 1_000_000,
    }
    if arch is not None:
        common.update(num_layers=arch.num_layers, hidden_size=arch.hidden_size,
                      num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim)
    if isinstance(w, InferenceWorkload):
        common.update(sequences=w.num_sequences, context_tokens=w.context_tokens,
                      prompt_tokens=w.prompt_tokens, attention=w.attention,
                      kv_cache_dtype=w.precision.kv_cache, logits=w.logits)
    else:
        common.update(micro_batch_size=w.micro_batch_size, sequence_length=w.sequence_length,
                      checkpointing=w.checkpointing, zero_stage=par.zero_stage,
                      optimizer=w.optimizer.__struct_config__.tag,
                      mixed_precision=w.mixed_precision, attention=w.attention,
                      method=w.method.__struct_config__.tag)
    return common


def _warnings(w: Workload, arch: Arch | None, device: DeviceContext | None) -> list[str]:
    out: list[str] = []
    if isinstance(w, GenericWorkload) or arch is None:
        return out
    if isinstance(w, InferenceWorkload):
        if arch.kind == "encoder" and w.generated_tokens:
            out.append("encoder models do not generate: generated_tokens is ignored")
        if arch.kind == "decoder" and w.context_tokens > arch.max_positions:
            out.append(f"context {w.context_tokens} exceeds the model's max_position_embeddings "
                       f"{arch.max_positions}")
    else:
        if w.sequence_length > arch.max_positions:
            out.append(f"sequence_length {w.sequence_length} exceeds the model's "
                       f"max_position_embeddings {arch.max_positions}")
        if not isinstance(w.method, FullFineTune) and not any(
                st.adapter_params for st in statics_for(w, arch)):
            out.append("no LoRA target module matches this model's projections: "
                       "adapters, gradients and optimizer state are 0")
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


def _summary(w: Workload, arch: Arch | None) -> WorkloadSummary:
    if isinstance(w, GenericWorkload):
        return WorkloadSummary(name=w.name or "generic", kind="generic", devices_per_instance=1,
                               instances=w.instances)
    assert arch is not None
    kind = "inference" if isinstance(w, InferenceWorkload) else "training"
    return WorkloadSummary(name=w.name or model_name(w.model), kind=kind,
                           model_type=arch.model_type, num_params=arch.num_params,
                           num_layers=arch.num_layers,
                           devices_per_instance=w.parallelism.devices, instances=w.instances)


def _sources(ov: Overheads) -> tuple[tuple[Component, str, str], ...]:
    """(component, formula, source) in vocabulary order for one device type (cached). The
    overhead lines name their origin: a calibration profile, or the built-in default's
    public source."""
    key = _text_key(ov)
    hit = _SOURCES.get(key)
    if hit is None:
        rows = []
        for c in ORDER:
            formula, source = _FORMULAS[c]
            if c is C.CUDA_CONTEXT:
                source = ov.cuda_context_source
            elif c is C.RUNTIME_WORKSPACE:
                source = ov.workspace_source
            elif c is C.ALLOCATOR_OVERHEAD:
                source = f"{_ROUNDING_SOURCE}; fraction: {ov.fragmentation_source}"
            elif c is C.COMMUNICATION_BUFFERS:
                source = f"{ov.communication_source}; torch DDP docs; DeepSpeed ZeRO config"
            rows.append((c, formula, source))
        hit = _SOURCES[key] = tuple(rows)
    return hit


def _text_key(ov: Overheads) -> tuple[object, ...]:
    """What the explanation texts of ``ov`` depend on: a tuple of (interned) strings hashes in
    C, where hashing the dataclass would run Python code on every budget."""
    return (ov.cuda_context_source, ov.workspace_source, ov.fragmentation_source,
            ov.communication_source, ov.nccl_communicator_bytes is None, ov.profile,
            ov.profile_match)


_ROUNDING_SOURCE = "c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize = 512)"
_SOURCES: dict[tuple[object, ...], tuple[tuple[Component, str, str], ...]] = {}
_NO_NAMES: dict[Component, tuple[str, ...]] = {}  # co-located lines name no single workload
_ROWS: dict[tuple[object, ...], tuple[tuple[Component, str, str, tuple[str, ...]], ...]] = {}


def _rows(ov: Overheads, names: dict[Component, tuple[str, ...]]
          ) -> tuple[tuple[Component, str, str, tuple[str, ...]], ...]:
    """(component, formula, source, input names) per line, for one device type and workload
    kind (``names`` is one of the module-level ``_INPUT_NAMES`` tables, so its id is stable)."""
    key = (ov.cuda_context_source, ov.workspace_source, ov.fragmentation_source,
           ov.communication_source, id(names))
    hit = _ROWS.get(key)
    if hit is None:
        hit = _ROWS[key] = tuple((c, f, src, names.get(c, ())) for c, f, src in _sources(ov))
    return hit


def _device_budget(label: str, stage: int | None, num_devices: int, peak: str,
                   values: dict[Component, int], parts: dict[Component, Any],
                   phases: tuple[tuple[str, int], ...], inputs: dict[str, Any],
                   names: dict[Component, tuple[str, ...]], headroom: Headroom,
                   ov: Overheads, transient: int | None = None) -> DeviceBudget:
    subtotal = sum(values.values())
    ppm, floor = round(headroom.fraction * 1_000_000), headroom.min_bytes
    room = _headroom(subtotal, ppm, floor)
    inputs = {**inputs, "headroom_fraction": headroom.fraction,
              "headroom_min_bytes": floor, "subtotal_bytes": subtotal}
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
            lines[_INDEX[c]] = Line(c, get(c, 0), formula, used, source,
                                    tuple([Part(name=n, bytes=b) for n, b in p]))
    return DeviceBudget(label=label, pipeline_stage=stage, num_devices=num_devices,
                        peak_phase=peak, lines=tuple(lines), total_bytes=subtotal + room,
                        inputs=inputs,
                        phases=tuple([Phase(name=n, total_bytes=t + _headroom(t, ppm, floor))
                                      for n, t in phases]))


# Parts of the answer that do not depend on batch, context or concurrency, by workload key.
_PERSISTENT: dict[Any, Any] = {}


_OVERHEAD_LINES = (C.CUDA_CONTEXT, C.RUNTIME_WORKSPACE, C.COMMUNICATION_BUFFERS,
                   C.ALLOCATOR_OVERHEAD)


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
        hit = _USES[key] = CalibrationUse(
            profile=ov.profile, matched_on=ov.profile_match,
            overheads=tuple(OverheadOrigin(
                component=c, origin="profile" if from_profile[c] else "builtin",
                profile=ov.profile if from_profile[c] else None, source=sources[c])
                for c in _OVERHEAD_LINES))
    return hit


_USES: dict[tuple[object, ...], CalibrationUse] = {}


def estimate(workloads: tuple[Workload, ...], device: DeviceRef | None = None,
             headroom: Headroom | None = None, profiles: ProfileSet | None = None,
             software: Software | None = None) -> Budget:
    """The full answer for co-located workloads on one device type."""
    for w in workloads:
        if isinstance(w, LLMServingWorkload):
            from .serving.budget import serving_budget  # the engine's own accounting

            return serving_budget(workloads, device)
    headroom = headroom or Headroom()
    ctx = resolve_device(device, profiles, software)
    ov = ctx.overheads if ctx else _DEFAULT_OVERHEADS
    per_workload = [workload_stages(w, ov, i) for i, w in enumerate(workloads)]
    archs = [None if isinstance(w, GenericWorkload) else resolve_model(w.model)
             for w in workloads]
    warnings: list[str] = []
    for w, arch in zip(workloads, archs, strict=True):
        warnings += _warnings(w, arch, ctx)
    devices: list[DeviceBudget] = []
    if len(workloads) == 1:
        w, arch = workloads[0], archs[0]
        inputs = _inputs(w, arch, ov)
        for s in per_workload[0]:
            label = "every device" if s.stage is None or len(per_workload[0]) == 1 else (
                f"pipeline stage {s.stage}")
            devices.append(_device_budget(label, s.stage, s.num_devices, s.peak_phase, s.values,
                                          s.parts, s.phases, inputs, _INPUT_NAMES[_kind(w)],
                                          headroom, ov, s.transient_bytes))
    else:
        # Co-located: the most loaded stage of each workload shares one device.
        values: dict[Component, int] = {}
        parts: dict[Component, list[tuple[str, int]]] = {}
        peaks = []
        for w, stages_, arch in zip(workloads, per_workload, archs, strict=True):
            top = max(stages_, key=lambda s: sum(s.values.values()))
            name = _summary(w, arch).name
            peaks.append(f"{name}: {top.peak_phase}")
            for c, v in top.values.items():
                values[c] = values.get(c, 0) + v
                if v:  # a part per workload that holds bytes of this component
                    parts.setdefault(c, []).append((name, v))
        devices.append(_device_budget(
            "co-located (most loaded stage of each workload)", None, 1, "; ".join(peaks), values,
            {c: tuple(p) for c, p in parts.items()}, (("co-located peak", sum(values.values())),),
            {"workloads": len(workloads)}, _NO_NAMES, headroom, ov))
    most = 0 if len(devices) == 1 else max(range(len(devices)),
                                           key=lambda i: devices[i].total_bytes)
    summary_device = None
    if ctx is not None:
        summary_device = DeviceSummary(name=ctx.name, id=ctx.id,
                                       memory_total_bytes=ctx.memory_total_bytes,
                                       architecture=ctx.architecture)
    pairs = tuple(zip(workloads, archs, strict=True))
    summaries, host_ram, disk = cached(
        _PERSISTENT, tuple([persistent_key(w) for w in workloads]),
        lambda: (tuple(_summary(w, a) for w, a in pairs), *host_and_disk(pairs)))
    return Budget(
        workloads=summaries,
        device=summary_device,
        devices=tuple(devices),
        most_loaded=most,
        total_bytes=devices[most].total_bytes,
        host_ram=host_ram,
        disk=disk,
        warnings=tuple(warnings),
        calibration=calibration_use(ov),
    )
