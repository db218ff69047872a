"""Budgets of models whose inputs are not a text prompt: an image model's forward pass, an
encoder-decoder's generation, a speech model's transcription.

The weights are the framework inventory's (every tensor, exact); the rest follows the
framework's ``generate`` for encoder-decoders (transformers ``generation/utils.py``: the
encoder runs once, its ``last_hidden_state`` is kept in ``model_kwargs["encoder_outputs"]``
for the whole generation, and ``EncoderDecoderCache`` holds the decoder's self-attention cache,
which grows per token, beside the cross-attention cache, one K and V per decoder layer over the
encoder's positions, computed at the first decoder step):

* **encode**: one encoder layer's working set (:func:`~vrambudget.core.formulas.activations.
  inference_working_set` over the encoder's own widths) over ``batch x positions`` tokens;
  Whisper adds its convolutional stem (``WhisperEncoder``: ``conv1`` and GELU over the mel
  frames, ``conv2`` with stride 2), a vision model its patch embedding;
* **decode**: the decoder layer's working set for one token, the logits, with the encoder
  output, the cross-attention cache and the self-attention cache live.

Positions: an image of side ``s`` is ``(s / patch)^2`` patches plus the model's extra tokens
(a class token); audio is ``100 x seconds`` log-mel frames per 30 s window (Whisper's feature
extractor pads every clip to the window; longer audio is more windows in the batch), halved by
the stride-2 convolution: 1,500 positions per window.
"""

from __future__ import annotations

from ..arch import Arch, AttentionKind, LayerType, attention_run
from ..components import Component, Members
from ..dtypes import bytes_of
from ..errors import InvalidWorkload
from ..formulas.activations import DeviceDims, inference_activations, inference_working_set
from ..formulas.allocator_overhead import overhead as allocator_bytes
from ..formulas.allocator_overhead import parts as overhead_parts
from ..formulas.kv_cache import cache_bytes, state_bytes
from ..formulas.logits import inference_logits
from ..inventory import EncoderInfo
from ..overheads import Overheads
from ..resolved import ResolvedModel
from ..spec import (
    EncoderWorkload,
    InferenceWorkload,
    Seq2SeqWorkload,
    SpeechToTextWorkload,
    VisionWorkload,
)
from ..statics import StageStatic
from .stage import StageNumbers, finish, times

__all__ = ["encoder_info", "encoder_positions", "encoder_stage", "proxy"]

C = Members  # the members as plain attributes (Component's read through a descriptor)
_DENSE = LayerType(AttentionKind.FULL, None, False, ())


def proxy(w: EncoderWorkload) -> InferenceWorkload:
    """An inference workload with ``w``'s model, precision and layout: what the statics
    (weights, metadata, KV widths, communication) of the whole model are computed from."""
    return InferenceWorkload(
        model=w.model,
        precision=w.precision,
        parallelism=w.parallelism,
        instances=w.instances,
    )


def encoder_info(w: EncoderWorkload, field: str) -> EncoderInfo:
    """The model's encoder as the framework reports it; refused when the model has none of the
    kind the workload needs."""
    m = w.model
    info = m.inventory.encoder if isinstance(m, ResolvedModel) and m.inventory else None
    need = {VisionWorkload: "vision", SpeechToTextWorkload: "audio"}.get(type(w))
    if info is None or (need is not None and info.modality != need):
        what = {"vision": "a vision tower", "audio": "an audio encoder"}.get(
            need or "", "an encoder-decoder"
        )
        raise InvalidWorkload(
            f"{field}.model", f"a {w.__struct_config__.tag} workload needs a model with {what}"
        )
    if isinstance(w, Seq2SeqWorkload) and info.cross_kv_elems == 0:
        raise InvalidWorkload(f"{field}.model", "a seq2seq workload needs an encoder-decoder")
    if w.parallelism.pipeline > 1:
        raise InvalidWorkload(f"{field}.parallelism.pipeline", "must be 1 for this workload")
    return info


def encoder_positions(w: EncoderWorkload, info: EncoderInfo) -> tuple[int, int]:
    """(sequences, encoder positions per sequence)."""
    if isinstance(w, VisionWorkload):
        side = w.image_size or info.image_size
        patches = (side // info.patch_size) ** 2
        return w.batch_size, patches + info.extra_tokens
    if isinstance(w, SpeechToTextWorkload):
        windows = w.windows
        return w.batch_size * windows, info.max_frames // info.stride
    return w.batch_size, w.input_tokens


def _encoder_dims(info: EncoderInfo, t: int) -> DeviceDims:
    d = info.dims
    return DeviceDims(
        h=d.hidden_size,
        heads=max(1, d.num_heads // t),
        kv_heads=max(1, d.num_kv_heads // t),
        qk_head_dim=d.head_dim,
        v_head_dim=d.head_dim,
        f=-(-d.intermediate_size // t),
        vocab=0,
        vocab_full=0,
        experts=0,
        top_k=0,
        f_expert=0,
        f_shared=0,
        ep=1,
        t=t,
    )


def _stem_bytes(w: EncoderWorkload, info: EncoderInfo, n: int, positions: int, e: int) -> int:
    """The input's own tensors at the encoder's first layer: Whisper's mel frames, ``conv1``
    output and its GELU (frames long), ``conv2``'s (positions long); an image's pixels and its
    patch embedding."""
    h = info.dims.hidden_size
    if isinstance(w, SpeechToTextWorkload):
        frames = info.max_frames
        return n * (info.num_mel_bins * frames + 2 * h * frames + h * positions) * e
    if isinstance(w, VisionWorkload):
        side = w.image_size or info.image_size
        return n * (info.num_channels * side * side + 2 * positions * h) * e
    return 0


def encoder_phases(
    w: EncoderWorkload, arch: Arch, st: StageStatic, ov: Overheads, info: EncoderInfo
) -> list[tuple[str, dict[Component, int]]]:
    """Each phase's bytes by component (headroom and allocator overhead excluded): the caches
    exist only from the first decoder step on."""
    e = bytes_of(w.precision.compute)
    kv_e = e if w.precision.kv_cache == "auto" else bytes_of(w.precision.kv_cache)
    k = w.instances
    t = w.parallelism.tensor
    n, positions = encoder_positions(w, info)
    # SDPA's math path where no fused kernel takes the call (bf16 below sm80): the encoder's
    # bidirectional attention has no causal mask
    attention = attention_run(w.attention, arch, ov.sdpa_math(arch, w.precision.compute))
    base = {
        C.WEIGHTS: st.weights_bytes * k,
        C.QUANTIZATION_METADATA: st.metadata_bytes * k,
        C.CUDA_CONTEXT: ov.process_context_bytes("inference") * k,
        C.RUNTIME_WORKSPACE: ov.workspace_bytes * k,
        C.COMMUNICATION_BUFFERS: st.comm_bytes * k,
    }
    encode = inference_working_set(
        _DENSE, arch, _encoder_dims(info, t), n, positions, positions, e, attention, causal=False
    ) + _stem_bytes(w, info, n, positions, e)
    first = "forward" if isinstance(w, VisionWorkload) else "encode"
    phases = [(first, {**base, C.KV_CACHE: 0, C.ACTIVATIONS: encode * k, C.LOGITS: 0})]
    if not isinstance(w, VisionWorkload) and w.generated_tokens > 0:
        generated = w.generated_tokens
        cross = n * positions * -(-info.cross_kv_elems // t) * kv_e
        kv = cross + cache_bytes(st.kv_full_elems, st.kv_sliding, n, generated, kv_e)
        kv += state_bytes(st.state_elems, st.state_bytes, n, e)
        kept = n * positions * info.dims.hidden_size * e  # encoder_outputs, for every step
        decode = kept + inference_activations(
            st.layer_kinds, arch, st.dims, n, 1, max(generated, positions), e, attention
        )
        logits = inference_logits(n, st.dims.vocab, st.dims.vocab_full, e)
        phases.append(
            (
                "decode",
                {**base, C.KV_CACHE: kv * k, C.ACTIVATIONS: decode * k, C.LOGITS: logits * k},
            )
        )
    return phases


def encoder_stage(
    w: EncoderWorkload, arch: Arch, st: StageStatic, ov: Overheads, info: EncoderInfo
) -> StageNumbers:
    phases = encoder_phases(w, arch, st, ov, info)
    rounding = st.weights_rounding_bytes * w.instances
    transient = max(v[C.ACTIVATIONS] + v[C.LOGITS] for _, v in phases)
    overhead = allocator_bytes(rounding, transient, ov.inference_fragmentation_ppm)
    for _, values in phases:
        values[C.ALLOCATOR_OVERHEAD] = overhead
    parts = {
        C.COMMUNICATION_BUFFERS: times(st.comm_parts, w.instances),
        C.ALLOCATOR_OVERHEAD: overhead_parts(rounding, transient, ov.inference_fragmentation_ppm),
        C.CUDA_CONTEXT: ov.context_parts("inference", w.instances),
    }
    return finish(
        st.stage.index, w.parallelism.tensor * w.parallelism.data, phases, parts, transient
    )
