"""Inference budgets, per pipeline stage: persistent weights, metadata, KV cache and overheads,
and per phase (prefill or forward, decode) the activations and logits; the peak phase's total."""

from __future__ import annotations

from ..arch import Arch, attention_run
from ..components import Component
from ..dtypes import bytes_of
from ..formulas import communication_buffers
from ..formulas.activations import inference_activations
from ..formulas.allocator_overhead import overhead as allocator_bytes
from ..formulas.allocator_overhead import parts as overhead_parts
from ..formulas.kv_cache import cache_bytes, elem_bytes, state_bytes
from ..formulas.logits import inference_logits
from ..formulas.runtime_workspace import BLAS_PART, KERNEL_SCRATCH_PART
from ..overheads import Overheads
from ..spec import InferenceWorkload
from ..statics import StageStatic
from .stage import StageNumbers, counted_bytes, peak, times

__all__ = [
    "fragmentation_ppm",
    "inference_stage",
    "inference_terms",
    "inference_total",
    "runtime_attention",
]

C = Component


def inference_terms(
    w: InferenceWorkload,
    arch: Arch,
    st: StageStatic,
    ov: Overheads,
    runtime: tuple[str, bool],
) -> tuple[dict[Component, int], list[tuple[str, int, int]]]:
    """Persistent bytes by component, and per phase (name, activations, logits): the one place
    the inference formulas are combined, used both for the explained budget and the solver."""
    e = bytes_of(w.precision.compute)
    n_seq = w.num_sequences
    k = w.instances
    # Only the last stage of a decoder computes logits.
    head = st.stage.last and arch.kind == "decoder"
    vocab, vocab_full = st.dims.vocab, st.dims.vocab_full
    kv = (
        cache_bytes(st.kv_full_elems, st.kv_sliding, n_seq, w.context_tokens, elem_bytes(w))
        + state_bytes(st.state_elems, st.state_bytes, n_seq, e)
        if arch.kind == "decoder"
        else 0
    )
    persistent = {
        C.WEIGHTS: st.weights_bytes * k,
        C.QUANTIZATION_METADATA: st.metadata_bytes * k,
        C.KV_CACHE: kv * k,
        C.CUDA_CONTEXT: ov.process_context_bytes("inference") * k,
        C.RUNTIME_WORKSPACE: (ov.workspace_bytes + st.kernel_scratch_bytes) * k,
        C.COMMUNICATION_BUFFERS: (
            st.comm_bytes if ov.nccl_communicator_bytes is None else _communication(st, ov)[0]
        )
        * k,
    }
    chunk = w.prefill_chunk_tokens
    prompt_total = w.prompt_tokens * n_seq
    attention, masked_math = runtime  # runtime_attention, decided once by the caller
    if chunk is not None and chunk < prompt_total:
        # Chunked prefill (vLLM): every step carries `chunk` tokens, packing whole and partial
        # prompts; a query may attend to its whole prompt (the last chunk of a prompt). Logits
        # of the last position: at most one per sequence in the step.
        acts = inference_activations(
            st.layer_kinds,
            arch,
            st.dims,
            1,
            chunk,
            w.prompt_tokens,
            e,
            attention,
            masked_math,
        )
        rows = chunk if w.logits == "all" else min(n_seq, chunk)
    else:
        acts = inference_activations(
            st.layer_kinds,
            arch,
            st.dims,
            n_seq,
            w.prompt_tokens,
            w.prompt_tokens,
            e,
            attention,
            masked_math,
        )
        # transformers before 4.45 returns (and upcasts) every prompt position's logits.
        every = w.logits == "all" or ov.stack.prefill_logits == "all_fp32"
        rows = prompt_total if every else n_seq
    phases = [
        (
            "prefill" if arch.kind == "decoder" else "forward",
            acts * k,
            (inference_logits(rows, vocab, vocab_full, e) * k if head else 0),
        )
    ]
    if arch.kind == "decoder" and w.generated_tokens > 0:
        acts = inference_activations(
            st.layer_kinds,
            arch,
            st.dims,
            n_seq,
            1,
            w.context_tokens,
            e,
            attention,
            masked_math,
        )
        # (Chunked prefill is an engine's: its KV blocks are preallocated, nothing copied.)
        if chunk is None and ov.stack.cache_copy_all:
            # transformers < 4.42: the legacy cache round trip keeps every layer's old cache.
            acts += cache_bytes(
                st.kv_full_elems, st.kv_sliding, n_seq, w.context_tokens - 1, elem_bytes(w)
            )
        elif chunk is None and ov.stack.cache_concat:
            # generate's torch.cat: one layer's old and new cache live together.
            acts += st.kv_layer_elems * w.context_tokens * n_seq * elem_bytes(w)
        phases.append(
            ("decode", acts * k, (inference_logits(n_seq, vocab, vocab_full, e) * k if head else 0))
        )
    return persistent, phases


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
    runtime = runtime_attention(w, arch, ov)
    persistent, terms = inference_terms(w, arch, st, ov, runtime)
    rounding = st.weights_rounding_bytes * w.instances
    transient = max([a + lg for _, a, lg in terms])
    fraction = ov.inference_fragmentation(runtime[0])
    overhead = allocator_bytes(rounding, transient, fraction)
    # Phases differ only in activations and logits: their totals without a dict per phase.
    base = sum(persistent.values()) + overhead
    totals = tuple([(name, base + a + lg) for name, a, lg in terms])
    name, acts, logits = terms[peak(totals)]
    values = persistent  # a fresh dict per call
    values[C.ACTIVATIONS] = acts
    values[C.LOGITS] = logits
    values[C.ALLOCATOR_OVERHEAD] = overhead
    parts = {
        C.COMMUNICATION_BUFFERS: times(
            st.comm_parts if ov.nccl_communicator_bytes is None else _communication(st, ov)[1],
            w.instances,
        ),
        C.ALLOCATOR_OVERHEAD: overhead_parts(rounding, transient, fraction),
        C.CUDA_CONTEXT: ov.context_parts("inference", w.instances),
    }
    if st.kernel_scratch_bytes:
        parts[C.RUNTIME_WORKSPACE] = times(
            (
                (BLAS_PART, ov.workspace_bytes),
                (KERNEL_SCRATCH_PART, st.kernel_scratch_bytes),
            ),
            w.instances,
        )
    return StageNumbers(
        st.stage.index,
        w.parallelism.tensor * w.parallelism.data,
        name,
        values,
        parts,
        totals,
        transient,
        counted_bytes(values),
    )


def inference_total(w: InferenceWorkload, arch: Arch, st: StageStatic, ov: Overheads) -> int:
    """The peak-phase total of ``inference_stage`` without building its dictionaries."""
    runtime = runtime_attention(w, arch, ov)
    persistent, terms = inference_terms(w, arch, st, ov, runtime)
    rounding = st.weights_rounding_bytes * w.instances
    base = sum(persistent.values())
    transient = max(a + lg for _, a, lg in terms)
    fraction = ov.inference_fragmentation(runtime[0])
    return base + transient + allocator_bytes(rounding, transient, fraction)


def _communication(st: StageStatic, ov: Overheads) -> tuple[int, tuple[tuple[str, int], ...]]:
    return communication_buffers.calibrated(
        st.comm_bytes, st.comm_parts, ov.nccl_communicator_bytes
    )
