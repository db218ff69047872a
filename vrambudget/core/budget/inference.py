"""Inference budgets, per pipeline stage: persistent weights, metadata, KV cache and overheads,
and per phase (prefill or forward, decode) the activations and logits; the peak phase's total."""

from __future__ import annotations

from dataclasses import dataclass

from ..arch import Arch, attention_run
from ..components import Component, Members
from ..dtypes import bytes_of
from ..formulas import communication_buffers
from ..formulas.activations import inference_activations
from ..formulas.allocator_overhead import overhead as allocator_bytes
from ..formulas.allocator_overhead import parts as overhead_parts
from ..formulas.kv_cache import cache_bytes, elem_bytes, state_bytes
from ..formulas.logits import inference_logits
from ..formulas.runtime_workspace import BLAS_PART, KERNEL_SCRATCH_PART
from ..memo import BoundedCache
from ..overheads import Overheads
from ..spec import InferenceWorkload
from ..statics import StageStatic
from .explain import constant_parts
from .stage import StageNumbers, peak, times

__all__ = [
    "Plan",
    "fragmentation_ppm",
    "inference_stage",
    "inference_terms",
    "inference_total",
    "plan_of",
    "plan_stage",
    "plan_total",
    "runtime_attention",
]

C = Members  # the members as plain attributes (Component's read through a descriptor)


@dataclass(slots=True)
class Plan:
    """What an inference stage's terms take from the workload that does not scale with its
    sequences, prompt or generated tokens (:func:`plan_of`): the persistent components other
    than the KV cache, the dtypes, the attention that runs, the fragmentation fraction and the
    constant parts. Built once per (stage statics, overheads, precision, instances, attention,
    logits, chunking); a budget or a solver's evaluation adds only what scales."""

    st: StageStatic
    ov: Overheads
    arch: Arch
    e: int
    kv_e: int
    k: int
    decoder: bool
    head: bool
    weights: int
    metadata: int
    context: int
    workspace: int
    communication: int
    fixed: int
    runtime: tuple[str, bool]
    fraction: int
    rounding: int
    logits_all: bool
    prefill_all: bool
    parts: dict[Component, tuple[tuple[str, int], ...]]


def _plan(w: InferenceWorkload, arch: Arch, st: StageStatic, ov: Overheads) -> Plan:
    k = w.instances
    runtime = runtime_attention(w, arch, ov)
    communication = (
        st.comm_bytes if ov.nccl_communicator_bytes is None else _communication(st, ov)[0]
    ) * k
    weights, metadata = st.weights_bytes * k, st.metadata_bytes * k
    context = ov.process_context_bytes("inference") * k
    workspace = (ov.workspace_bytes + st.kernel_scratch_bytes) * k
    parts: dict[Component, tuple[tuple[str, int], ...]] = {
        C.COMMUNICATION_BUFFERS: constant_parts(
            times(
                st.comm_parts if ov.nccl_communicator_bytes is None else _communication(st, ov)[1],
                k,
            )
        ),
        C.ALLOCATOR_OVERHEAD: (),  # per budget (plan_stage)
        C.CUDA_CONTEXT: constant_parts(ov.context_parts("inference", k)),
    }
    if st.kernel_scratch_bytes:
        parts[C.RUNTIME_WORKSPACE] = constant_parts(
            times(
                ((BLAS_PART, ov.workspace_bytes), (KERNEL_SCRATCH_PART, st.kernel_scratch_bytes)),
                k,
            )
        )
    return Plan(
        st=st,
        ov=ov,
        arch=arch,
        e=bytes_of(w.precision.compute),
        kv_e=elem_bytes(w),
        k=k,
        decoder=arch.kind == "decoder",
        # Only the last stage of a decoder computes logits.
        head=st.stage.last and arch.kind == "decoder",
        weights=weights,
        metadata=metadata,
        context=context,
        workspace=workspace,
        communication=communication,
        fixed=weights + metadata + context + workspace + communication,
        runtime=runtime,
        fraction=ov.inference_fragmentation(runtime[0]),
        rounding=st.weights_rounding_bytes * k,
        logits_all=w.logits == "all",
        # transformers before 4.45 returns (and upcasts) every prompt position's logits.
        prefill_all=w.logits == "all" or ov.stack.prefill_logits == "all_fp32",
        parts=parts,
    )


_PLANS: BoundedCache[tuple[object, ...], Plan] = BoundedCache(4096)


def plan_of(w: InferenceWorkload, arch: Arch, st: StageStatic, ov: Overheads) -> Plan:
    """The :class:`Plan` of ``w``'s stage ``st`` under ``ov`` (cached; the statics and overheads
    by identity, checked on a hit, so a new object never meets a stale plan)."""
    key = (
        id(st),
        id(ov),
        w.precision,
        w.instances,
        w.attention,
        w.logits,
        w.prefill_chunk_tokens,
    )
    hit = _PLANS.get(key)
    if hit is not None and hit.st is st and hit.ov is ov:
        return hit
    return _PLANS.put(key, _plan(w, arch, st, ov))


def inference_terms(w: InferenceWorkload, plan: Plan) -> tuple[int, list[tuple[str, int, int]]]:
    """KV-cache bytes, and per phase (name, activations, logits): the one place the inference
    formulas are combined, used both for the explained budget and the solver (the persistent
    components other than the KV cache are the plan's)."""
    st, arch, e, k = plan.st, plan.arch, plan.e, plan.k
    n_seq = w.batch_size * w.concurrent_requests
    prompt = w.prompt_tokens
    context = prompt + w.generated_tokens
    vocab, vocab_full = st.dims.vocab, st.dims.vocab_full
    kv = (
        cache_bytes(st.kv_full_elems, st.kv_sliding, n_seq, context, plan.kv_e)
        + state_bytes(st.state_elems, st.state_bytes, n_seq, e)
        if plan.decoder
        else 0
    )
    chunk = w.prefill_chunk_tokens
    prompt_total = prompt * n_seq
    attention, masked_math = plan.runtime  # runtime_attention, decided once per plan
    if chunk is not None and chunk < prompt_total:
        # Chunked prefill (vLLM): every step carries `chunk` tokens, packing whole and partial
        # prompts; a query may attend to its whole prompt (the last chunk of a prompt). Logits
        # of the last position: at most one per sequence in the step.
        acts = inference_activations(
            st.layer_kinds, arch, st.dims, 1, chunk, prompt, e, attention, masked_math
        )
        rows = chunk if plan.logits_all else min(n_seq, chunk)
    else:
        acts = inference_activations(
            st.layer_kinds, arch, st.dims, n_seq, prompt, prompt, e, attention, masked_math
        )
        rows = prompt_total if plan.prefill_all else n_seq
    phases = [
        (
            "prefill" if plan.decoder else "forward",
            acts * k,
            (inference_logits(rows, vocab, vocab_full, e) * k if plan.head else 0),
        )
    ]
    if plan.decoder and w.generated_tokens > 0:
        acts = inference_activations(
            st.layer_kinds, arch, st.dims, n_seq, 1, context, e, attention, masked_math
        )
        # (Chunked prefill is an engine's: its KV blocks are preallocated, nothing copied.)
        stack = plan.ov.stack
        if chunk is None and stack.cache_copy_all:
            # transformers < 4.42: the legacy cache round trip keeps every layer's old cache.
            acts += cache_bytes(st.kv_full_elems, st.kv_sliding, n_seq, context - 1, plan.kv_e)
        elif chunk is None and stack.cache_concat:
            # generate's torch.cat: one layer's old and new cache live together.
            acts += st.kv_layer_elems * context * n_seq * plan.kv_e
        phases.append(
            (
                "decode",
                acts * k,
                (inference_logits(n_seq, vocab, vocab_full, e) * k if plan.head else 0),
            )
        )
    return kv * k, phases


def runtime_attention(w: InferenceWorkload, arch: Arch, ov: Overheads) -> tuple[str, bool]:
    """The attention that runs (:func:`vrambudget.core.arch.attention_run`: ``math`` where
    transformers' unmasked SDPA call has no fused kernel on this device and stack), and
    whether a sliding-window layer's masked call runs the math path too. Chunked prefill is
    an engine's (vLLM), whose attention kernels are its own: no math path."""
    if w.prefill_chunk_tokens is not None:
        return attention_run(w.attention, arch), False
    compute = w.precision.compute
    return (
        attention_run(w.attention, arch, ov.sdpa_math(arch, compute)),
        ov.sdpa_math(arch, compute, masked=True),
    )


def fragmentation_ppm(w: InferenceWorkload, arch: Arch, ov: Overheads) -> int:
    """The fragmentation fraction (millionths) of ``w``'s allocator-overhead line: the eager
    one where the attention that runs materializes the scores
    (:meth:`Overheads.inference_fragmentation`)."""
    return ov.inference_fragmentation(runtime_attention(w, arch, ov)[0])


def inference_stage(
    w: InferenceWorkload, arch: Arch, st: StageStatic, ov: Overheads
) -> StageNumbers:
    return plan_stage(w, plan_of(w, arch, st, ov))


def plan_stage(w: InferenceWorkload, plan: Plan) -> StageNumbers:
    """:func:`inference_stage` of ``w`` with its plan."""
    st = plan.st
    kv, terms = inference_terms(w, plan)
    transient = max([a + lg for _, a, lg in terms])
    overhead = allocator_bytes(plan.rounding, transient, plan.fraction)
    # Phases differ only in activations and logits: their totals without a dict per phase.
    base = plan.fixed + kv + overhead
    totals = tuple([(name, base + a + lg) for name, a, lg in terms])
    name, acts, logits = terms[peak(totals)]
    values = {  # a fresh dict per call, in the vocabulary's order
        C.WEIGHTS: plan.weights,
        C.QUANTIZATION_METADATA: plan.metadata,
        C.KV_CACHE: kv,
        C.CUDA_CONTEXT: plan.context,
        C.RUNTIME_WORKSPACE: plan.workspace,
        C.COMMUNICATION_BUFFERS: plan.communication,
        C.ACTIVATIONS: acts,
        C.LOGITS: logits,
        C.ALLOCATOR_OVERHEAD: overhead,
    }
    parts = plan.parts.copy()  # the allocator's (placed first, after the buffers') set here
    parts[C.ALLOCATOR_OVERHEAD] = overhead_parts(plan.rounding, transient, plan.fraction)
    return StageNumbers(
        st.stage.index,
        w.parallelism.tensor * w.parallelism.data,
        name,
        values,
        parts,
        totals,
        transient,
        plan.weights + plan.metadata,
    )


def inference_total(w: InferenceWorkload, arch: Arch, st: StageStatic, ov: Overheads) -> int:
    """The peak-phase total of ``inference_stage`` without building its dictionaries."""
    return plan_total(w, plan_of(w, arch, st, ov))


def plan_total(w: InferenceWorkload, plan: Plan) -> int:
    """:func:`inference_total` of ``w`` with its plan (the solver keeps one per objective)."""
    kv, terms = inference_terms(w, plan)
    transient = max([a + lg for _, a, lg in terms])
    return plan.fixed + kv + transient + allocator_bytes(plan.rounding, transient, plan.fraction)


def _communication(st: StageStatic, ov: Overheads) -> tuple[int, tuple[tuple[str, int], ...]]:
    return communication_buffers.calibrated(
        st.comm_bytes, st.comm_parts, ov.nccl_communicator_bytes
    )
