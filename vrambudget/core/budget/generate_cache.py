"""The caching allocator's reading for transformers ``generate`` (``DeviceBudget.allocator_cache``):
the replay of :mod:`vrambudget.core.allocator.generate` put next to the budget's own lines.

The budget's allocator-overhead line is what the run *needs* beyond its tensors; the replay says
what the allocator will *hold* while the KV cache grows by ``torch.cat``. Expected readings:

    reserved    = budget total - headroom - context - communication - fragmentation line part
                  + replay cached bytes, at most (device memory - context - communication)
    nvidia-smi  = reserved + context + communication
"""

from __future__ import annotations

from ..allocator.generate import MAX_EVENTS, GenerateShape, events_of, replay_generate
from ..components import Component
from ..dtypes import bytes_of
from ..formulas.allocator_overhead import ROUNDING_PART
from ..overheads import Overheads
from ..resolve import resolve_model
from ..result import AllocatorCache, DeviceBudget
from ..spec import InferenceWorkload
from ..spec.precision import BitsAndBytes4bit
from ..stack import SDPA_NATIVE_GQA_TORCH, version_tuple
from ..statics import statics_for
from .inference import runtime_attention
from .views import outside_allocator_bytes

__all__ = ["METHOD", "SOURCE", "allocator_cache", "generate_shape"]

METHOD = (
    "greedy generate replayed through the caching-allocator model "
    "(vrambudget.core.allocator.generate): the large pool's requests, one per kernel output "
    "of Llama's modelling code (quantized kernels' own temporaries: bitsandbytes 4-bit only)"
)
SOURCE = (
    "c10/cuda/CUDACachingAllocator.cpp; transformers 4.35.2 modeling_llama.py and "
    "generation/utils.py, 4.42.0 / 5.x cache_utils.py (the cache's torch.cat); checked against "
    "published max_memory_reserved (optimum-benchmark running-llamas, transformers 4.35.2, "
    "A100-80GB, Llama-2 7B/13B fp16, batch 1-8: -0.7% .. +3.4%) and our H100/H200 campaigns "
    "(transformers 5.23: -4.9% .. +1.1% with SDPA, -0.9% with eager at batch 4 x 2048; "
    "docs/ACCURACY.md)"
)


def generate_shape(w: InferenceWorkload, ov: Overheads) -> GenerateShape | None:
    """The replay's shape for ``w`` (deployed: :func:`vrambudget.core.deployed.deploy_all`), or
    None where the replay does not apply. It follows
    Llama's modelling code, so it applies to a dense, full-attention, RMSNorm decoder (sliding
    windows longer than the context count as full; not Gemma, whose releases 4.42-4.55 used a
    static hybrid cache) generating one batch on one device with a ``torch.cat`` cache in the
    compute dtype, in at most :data:`~vrambudget.core.allocator.generate.MAX_EVENTS` large-pool
    requests. Of the quantized kernels, bitsandbytes 4-bit's dequantized weights are replayed;
    the others' own temporaries (GPTQ, AWQ, int8, fp8) are not (their outputs are). Concurrent
    requests are separate ``generate`` calls on their own streams, whose blocks the allocator
    pools apart."""
    p = w.parallelism
    if p.tensor != 1 or p.pipeline != 1 or not ov.stack.cache_concat:
        return None
    arch = resolve_model(w.model)
    (st,) = statics_for(w, arch, ov.stack)
    if (
        arch.kind != "decoder"
        or arch.norm != "rmsnorm"
        or arch.sandwich_norms
        or arch.model_type.startswith("gemma")
        or w.precision.kv_cache not in ("auto", w.precision.compute)
        or arch.moe is not None
        or arch.mla is not None
        or any(window < w.context_tokens for window, _ in st.kv_sliding)
        or st.state_elems
        or 2 * arch.num_kv_heads * arch.head_dim * arch.num_layers
        != st.kv_full_elems + sum(elems for _, elems in st.kv_sliding)
        or w.generated_tokens < 1
        or w.concurrent_requests != 1
        or w.prefill_chunk_tokens is not None
        or w.instances != 1
    ):
        return None
    attention = runtime_attention(w, arch, ov)[0]
    if attention == "math":  # the replay follows transformers' eager and fused paths only
        return None
    eager = attention == "eager"
    shape = GenerateShape(
        layers=arch.num_layers,
        hidden=arch.hidden_size,
        heads=arch.num_heads,
        kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        intermediate=arch.intermediate_size,
        vocab=arch.vocab_size,
        elem=bytes_of(w.precision.compute),
        batch=w.batch_size,
        prompt=w.prompt_tokens,
        generated=w.generated_tokens,
        keep_old_cache=ov.stack.cache_copy_all,
        all_prompt_logits=ov.stack.prefill_logits == "all_fp32" or w.logits == "all",
        eager=eager,
        repeat_kv=arch.num_kv_heads < arch.num_heads and (eager or _sdpa_repeats(w, ov)),
        gated=arch.mlp == "gated",
        dequantize=isinstance(w.precision.quantization, BitsAndBytes4bit),
        softmax_copy=eager and w.precision.compute == "bf16",
    )
    return shape if events_of(shape) <= MAX_EVENTS else None


def _sdpa_repeats(w: InferenceWorkload, ov: Overheads) -> bool:
    """SDPA expands grouped K/V (``repeat_kv``) in transformers' releases before 4.54; since,
    ``sdpa_attention_forward`` passes them as they are (``enable_gqa``) with torch >= 2.5 when
    generate's mask is None, as it is for unpadded batches (4.54.0
    ``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa``; 4.53.0 always repeats). Flash
    attention never expands them."""
    if w.attention != "sdpa":
        return False
    st = ov.stack
    if st.transformers_version is None:  # no release named: only torch's enable_gqa decides
        return version_tuple(st.torch_version) < SDPA_NATIVE_GQA_TORCH
    return not st.sdpa_native_gqa


def allocator_cache(
    w: InferenceWorkload, ov: Overheads, device: DeviceBudget, capacity: int | None
) -> AllocatorCache | None:
    """What the allocator will hold on ``device`` (``capacity``: the device's memory, None
    when no device was named), or None where the replay does not apply."""
    shape = generate_shape(w, ov)
    if shape is None:
        return None
    expandable = replay_generate(shape, expandable_segments=True)
    # The stack's own allocator setting decides what it will hold (axolotl, or the request).
    replay = expandable if ov.stack.expandable_segments else replay_generate(shape)
    lines = {ln.component: ln for ln in device.lines}
    outside = outside_allocator_bytes(device)
    overhead = lines[Component.ALLOCATOR_OVERHEAD]
    rounding = sum(p.bytes for p in overhead.parts if p.name == ROUNDING_PART)
    allocated = (
        device.total_bytes - lines[Component.HEADROOM].bytes - outside - overhead.bytes + rounding
    )
    uncapped = allocated + replay.cached_bytes
    # The allocator releases its cache when cudaMalloc fails; a budget that does not fit at all
    # runs out of memory instead, so its readings are not capped.
    room = None if capacity is None or capacity - outside < allocated else capacity - outside
    reserved = uncapped if room is None else min(uncapped, room)
    return AllocatorCache(
        cached_bytes=reserved - allocated,
        reserved_bytes=reserved,
        device_used_bytes=reserved + outside,
        releases_cache=room is not None and uncapped > room,
        expandable_segments_cached_bytes=expandable.cached_bytes,
        method=METHOD,
        source=SOURCE,
    )
