"""vLLM speculative decoding: what a drafter adds to the engine's budget on the last pipeline
stage -- its weights, its attention layers' KV cache in the target's pool, its CUDA graphs.

What the releases do (read in the wheels of 0.10.1, 0.15.0, 0.26.0 and 0.34.0):

- ``v1/worker/gpu_model_runner.py`` builds the drafter on the last pipeline rank only ("we put
  the entire draft model on the last PP rank": ``NgramProposer``, ``EagleProposer``, from 0.15
  ``DraftModelProposer``) and loads it inside the ``DeviceMemoryProfiler`` block that logs
  "Model loading took" (0.10.1 lines 1986-2005): its weights are part of the weights memory;
- ``NgramProposer`` matches n-grams of the prompt on the CPU: no device memory (a published
  A/B pair on vLLM 0.18.0 logs the same weights, KV memory and tokens with and without it);
- ``EagleProposer.load_model`` shares the target's embedding (when the head's has the same
  shape, or it has none) and, for EAGLE-1, the target's LM head; the head's own modules are
  its decoder layers (``model_executor/models/llama_eagle.py``: ``LlamaDecoderLayer`` per
  ``num_hidden_layers``, tensor-parallel like the target's, the first without its input norm)
  and ``fc``, a replicated ``2 x hidden -> hidden`` linear without bias;
- ``DraftModelProposer`` (``v1/spec_decode/draft_model.py``, from 0.15) loads a whole model,
  sharing nothing (``_maybe_share_embeddings`` / ``_maybe_share_lm_head`` do nothing), with the
  target's tensor-parallel size (it raises otherwise);
- every drafter attention layer registers in the forward context, so ``get_kv_cache_spec``
  gives it a KV cache in the same pool as the target's (``EagleProposer.
  validate_same_kv_cache_group``: the same group): each block holds one more page per draft
  layer;
- ``capture_model`` runs the drafter's ``dummy_run`` for every size it captures: the drafter's
  piecewise graphs, one per captured size, counted here with the same per-graph fit as the
  target's (``cuda_graph_bytes``) on the drafter's layers;
- the profile run's drafter forward (``dummy_run``, no logits) runs after the target's and
  holds one draft layer's activations: below the target's peak, not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arch import Arch
from ..errors import InvalidWorkload
from ..layout import kv_heads_per_device, per_device_shape
from ..resolve import needs_resolution, resolve_model
from ..spec import LLMServingWorkload, SpeculativeOptions
from ..stack import version_tuple
from ..statics import device_params
from .kv import LayerSpec, layer_specs

__all__ = [
    "DRAFT_MODEL_SINCE",
    "MTP_BLOCK_PART",
    "NO_DRAFTER",
    "Drafter",
    "drafter",
    "launch_json",
]

DRAFT_MODEL_SINCE = (0, 15)
"""The first release whose V1 engine has ``DraftModelProposer`` (``v1/spec_decode/
draft_model.py`` is in the 0.15.0 wheel, not in 0.14.0's)."""


@dataclass(frozen=True, slots=True)
class Drafter:
    method: str
    weights_bytes: int
    """The drafter's parameters on one GPU of the last stage, in the model dtype."""
    kv_layers: tuple[LayerSpec, ...]
    """Its attention layers' KV specs on one GPU (added to the target's pool)."""
    layers: int
    """Its decoder layers (the per-layer term of its CUDA graphs)."""
    parts: tuple[tuple[str, int], ...]
    """Its weights by part."""


NGRAM = Drafter("ngram", 0, (), 0, ())
NO_DRAFTER = Drafter("none", 0, (), 0, ())
"""What a stage without the drafter holds of it (every stage but the last)."""


def drafter(
    w: LLMServingWorkload,
    target: Arch,
    release: str,
    tensor: int,
    pipeline: int,
    e: int,
    kv_bytes: int,
) -> Drafter | None:
    """The drafter of ``w`` on one GPU of the last stage (None: no speculative decoding).
    Raises ``InvalidWorkload`` (field relative to the workload) for what the release does not
    run or this model does not express."""
    spec = w.speculative
    if spec is None:
        return None
    if spec.method == "ngram":
        return NGRAM
    if spec.method == "mtp":
        return _mtp(target, tensor, pipeline, e, kv_bytes)
    if spec.model is None:
        raise InvalidWorkload(
            "speculative.model", f"method {spec.method!r} needs the drafter's model"
        )
    if spec.method == "draft_model" and version_tuple(release)[:2] < DRAFT_MODEL_SINCE:
        raise InvalidWorkload(
            "speculative.method",
            f"vLLM {release}'s V1 engine has no separate draft model (DraftModelProposer, "
            "from 0.15); use 'eagle' or 'ngram', or engine_version >= 0.15",
        )
    if needs_resolution(spec.model):  # the service and the CLI resolve it first
        raise InvalidWorkload(
            "speculative.model",
            "the drafter needs resolving (a Hub repository, a checkpoint header or a family "
            "without a closed form), which the service and the CLI do before the budget",
        )
    draft = resolve_model(spec.model)
    if draft.kind != "decoder" or draft.mla is not None:
        raise InvalidWorkload("speculative.model", "the drafter must be a decoder without MLA")
    if draft.num_kv_heads % tensor and tensor % draft.num_kv_heads:
        raise InvalidWorkload(
            "speculative.model",
            f"the drafter's {draft.num_kv_heads} KV heads do not split over {tensor} GPUs",
        )
    kv_layers = tuple(layer_specs(draft, tensor, kv_bytes))
    _check_kv_layout(target, kv_layers, tensor, kv_bytes)
    layers = sum(n for _, n in draft.layer_runs)
    body = _layer_bytes(draft, tensor, e)
    # An EAGLE head shares the target's embedding on one pipeline stage only
    # (EagleProposer.load_model / _maybe_share_embeddings: get_pp_group().world_size == 1)
    own_embedding = (
        (
            (
                "EAGLE head: its own embedding (pipeline parallel: not shared)",
                _vocab_bytes(draft.vocab_size, draft.hidden_size, tensor, e),
            ),
        )
        if pipeline > 1
        else ()
    )
    if spec.method == "eagle":
        # llama_eagle.py: the first layer's input_layernorm is replaced by nn.Identity
        # (disable_input_layernorm for i == 0); fc is a ReplicatedLinear without bias
        body -= draft.hidden_size * e
        fc = 2 * draft.hidden_size * draft.hidden_size * e
        parts = (
            ("EAGLE head: decoder layers (no input norm on the first)", body),
            ("EAGLE head: fc (2 x hidden -> hidden)", fc),
            *own_embedding,
        )
        return Drafter("eagle", sum(b for _, b in parts), kv_layers, layers, parts)
    if spec.method == "eagle3":
        return _eagle3(spec, draft, target, tensor, e, kv_layers, body, own_embedding)
    top = _top_bytes(draft, tensor, e)
    parts = (("draft model: decoder layers", body), ("draft model: embedding and head", top))
    return Drafter("draft_model", body + top, kv_layers, layers, parts)


def _eagle3(
    spec: SpeculativeOptions,
    draft: Arch,
    target: Arch,
    t: int,
    e: int,
    kv_layers: tuple[LayerSpec, ...],
    body: int,
    own_embedding: tuple[tuple[str, int], ...],
) -> Drafter:
    """An EAGLE-3 head (``llama_eagle3.py``, 0.10.1 and 0.34.0): its layer's ``qkv_proj`` reads
    ``2 x hidden`` (the embedding and the hidden state side by side) and adds a ``hidden_norm``;
    ``fc`` maps three of the target's hidden states (``3 x target hidden``) to the head's width;
    a final ``norm``; its own ``ParallelLMHead`` over ``draft_vocab_size`` tokens (padded to 64,
    split over the tensor-parallel GPUs) and, when that differs from the target's vocabulary,
    ``draft_id_to_target_id`` (int64 per draft token; 0.10 allocates it always)."""
    if sum(n for _, n in draft.layer_runs) != 1:
        raise InvalidWorkload(
            "speculative.model", "an EAGLE-3 head with more than one layer is not modelled"
        )
    h = draft.hidden_size
    qkv_rows = (-(-draft.num_heads // t) + 2 * kv_heads_per_device(draft, t)) * draft.head_dim
    layer = body + qkv_rows * h * e + h * e  # the wider qkv input, hidden_norm
    fc = 3 * target.hidden_size * h * e
    vocab = spec.draft_vocab_size or draft.vocab_size
    head = _vocab_bytes(vocab, h, t, e)
    d2t = 8 * vocab if vocab != target.vocab_size else 0
    parts = (
        ("EAGLE-3 head: decoder layer (qkv over 2 x hidden, hidden_norm)", layer),
        ("EAGLE-3 head: fc (3 x target hidden -> hidden)", fc),
        ("EAGLE-3 head: final norm", h * e),
        (f"EAGLE-3 head: its LM head ({vocab:,} tokens)", head),
        ("EAGLE-3 head: draft-to-target token map (int64)", d2t),
        *own_embedding,
    )
    return Drafter("eagle3", sum(b for _, b in parts), kv_layers, 1, parts)


MTP_BLOCK_PART = "MTP module: its decoder layer (MoE, quantized as the target's)"
"""The part whose bytes the account adds from the target's statics (the layer is quantized and
split like the target's own last layer)."""


def _mtp(target: Arch, t: int, pipeline: int, e: int, kv_bytes: int) -> Drafter:
    """DeepSeek-V3's multi-token-prediction module(s) (``deepseek_mtp.py``, read in 0.10.1 and
    0.34.0): per module ``enorm`` and ``hnorm`` (hidden each), ``eh_proj`` (an ``nn.Linear``
    ``2 x hidden -> hidden``, replicated, unquantized), ``shared_head`` (a norm and its own
    ``ParallelLMHead``, unquantized) and ``mtp_block``, a full decoder layer of the target's
    last kind whose bytes the account adds (:data:`MTP_BLOCK_PART`); the embedding is the
    target's (``shared_weight_names``, one pipeline stage), the MLA attention caches in the
    target's pool. Method ``deepseek_mtp`` in 0.10; 0.34 maps it to ``mtp``."""
    if target.mtp_layers < 1:
        raise InvalidWorkload(
            "speculative.method",
            "method 'mtp' needs a model whose checkpoint carries multi-token-prediction modules "
            "(modelled: DeepSeek-V3's num_nextn_predict_layers)",
        )
    n = target.mtp_layers
    h = target.hidden_size
    last = layer_specs(target, t, kv_bytes)[-1]
    own_embedding = _vocab_bytes(target.vocab_size, h, t, e) if pipeline > 1 else 0
    parts = (
        ("MTP module: enorm, hnorm, shared_head norm", n * 3 * h * e),
        ("MTP module: eh_proj (2 x hidden -> hidden)", n * 2 * h * h * e),
        ("MTP module: shared_head LM head", n * _vocab_bytes(target.vocab_size, h, t, e)),
        ("MTP module: its own embedding (pipeline parallel: not shared)", own_embedding),
    )
    return Drafter("mtp", sum(b for _, b in parts), (last,) * n, n, parts)


def _vocab_bytes(vocab: int, hidden: int, t: int, e: int) -> int:
    """A vocab-parallel embedding or LM head on one GPU: the vocabulary padded to a multiple of
    64 (``vocab_parallel_embedding.py`` ``DEFAULT_VOCAB_PADDING_SIZE``), split over ``t``."""
    padded = -(-vocab // 64) * 64
    return -(-padded // t) * hidden * e


def _check_kv_layout(
    target: Arch, kv_layers: tuple[LayerSpec, ...], tensor: int, kv_bytes: int
) -> None:
    full = [s for s in layer_specs(target, tensor, kv_bytes) if s.window is None]
    want = full[0] if full else None
    for s in kv_layers:
        if want is None or (s.heads, s.head_size) != (want.heads, want.head_size):
            have = f"{s.heads} KV heads x {s.head_size}"
            need = f"{want.heads} x {want.head_size}" if want else "no full-attention layer"
            raise InvalidWorkload(
                "speculative.model",
                f"the drafter's attention layers ({have} per GPU) differ from the target's "
                f"({need}): vLLM keeps them in the target's KV-cache group; other layouts "
                "are not modelled",
            )


def _layer_bytes(a: Arch, t: int, e: int) -> int:
    """The parameters of ``a``'s layers on one of ``t`` tensor-parallel GPUs (buffers, which
    vLLM does not keep, left out), in ``e`` bytes each."""
    return sum(device_params(layer, a, t, 1) * n for layer, n in a.layer_runs) * e


def _top_bytes(a: Arch, t: int, e: int) -> int:
    groups = (*a.embeddings, *a.extras, *a.head)
    total = 0
    for g in groups:
        if not g.buffer:
            rows, cols, count = per_device_shape(g, a, t, 1)
            total += rows * cols * count * e
    return total


def launch_json(spec: SpeculativeOptions, model_word: str | None) -> str:
    """``--speculative-config``'s JSON as the budget assumed it (MTP as ``deepseek_mtp``, which
    every modelled release accepts: 0.34 maps it to ``mtp``, 0.10 knows no other name)."""
    method = "deepseek_mtp" if spec.method == "mtp" else spec.method
    items = [f'"method": "{method}"']
    if model_word is not None:
        items.append(f'"model": "{model_word}"')
    items.append(f'"num_speculative_tokens": {spec.num_speculative_tokens}')
    return "{" + ", ".join(items) + "}"
