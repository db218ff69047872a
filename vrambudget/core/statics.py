"""Per-stage facts of a model workload that do not depend on batch or context: what each device
of a pipeline stage holds (weights, quantization metadata, adapters, gradients, optimizer state,
master weights, communication buffers) and the per-token KV width. Computed once per distinct
(model, precision, layout, training method) and cached, so solving for the largest batch only
re-evaluates the few terms that scale.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import msgspec

from .arch import (
    Arch,
    LayerType,
    Role,
    Split,
    TensorGroup,
    lora_targeted,
    module_name,
    saved_by,
    saved_count,
    saved_names,
)
from .deployed import adapter_dtype_of, deployed_quantization
from .dtypes import bytes_of
from .errors import InvalidWorkload
from .formulas import communication_buffers, gradients, master_weights, optimizer_state
from .formulas.activations import DeviceDims, device_dims
from .formulas.adapters import lora_params
from .formulas.allocator_overhead import block_rounding
from .formulas.kv_cache import elems_per_token
from .formulas.optimizer_state import Optimizer, state_bytes, step_temporaries
from .formulas.runtime_workspace import exllama_scratch
from .formulas.weights import stored_bytes
from .layout import Stage, check_layout, kv_heads_per_device, per_device_shape, stages
from .quantization import quantized_roles, stored_as_buffers
from .spec import (
    FP8,
    AdamW,
    BitsAndBytes4bit,
    EncoderWorkload,
    InferenceWorkload,
    LoRA,
    ModelWorkload,
    Parallelism,
    Precision,
    QLoRA,
    TrainingWorkload,
)
from .stack import Stack, resolve_stack
from .units import ceil_div

__all__ = [
    "StageStatic",
    "TrainingPlan",
    "device_params",
    "effective_precision",
    "fixed_bytes",
    "head_groups",
    "quantizable",
    "stage_statics",
    "statics_for",
    "tied_head_module",
    "tied_saving",
    "training_plan",
]


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    """The hashable part of a training workload that fixes its persistent memory."""

    method: str  # full | lora | qlora
    lora_rank: int
    lora_targets: tuple[str, ...]
    adapter_bytes: int
    optimizer: Optimizer
    mixed_precision: str
    kbit_upcast: bool = True
    """QLoRA: the parameters left unquantized are cast to fp32 (PEFT's
    ``prepare_model_for_kbit_training``); false: they keep the weights' dtype (torchtune)."""
    fsdp: bool = False
    """ZeRO-3 runs under FSDP (not DeepSpeed): what it keeps unsharded is units of whole blocks
    and the root (:func:`~.formulas.communication_buffers.stage_parts`)."""
    lora_experts: bool = True
    """LoRA target names reach routed experts (:attr:`Stack.lora_reaches_experts`)."""
    modules_to_save: tuple[str, ...] = ()
    """PEFT's ``modules_to_save``: modules trained whole, as a trainable copy of each."""
    foreach_intermediates: int = 1
    """State-sized intermediates of torch's foreach AdamW step (:attr:`Stack.foreach_
    intermediates`)."""
    tie_saved_head: bool = False
    """PEFT's ``ensure_weight_tying``: a tied LM head shares the embedding's saved copy."""
    saved_fp16_to_fp32: bool = False
    """An fp16 ``modules_to_save`` copy is trained in fp32 (:attr:`Stack.saved_fp16_to_fp32`)."""
    metadata_sharded: bool = True
    """ZeRO-3 / FSDP shard the quantization metadata with the weights (and CPU offload moves
    it with them). False for bitsandbytes' 4-bit state, which every rank keeps whole on its GPU
    (the stack's ``quantization_state_sharding`` behaviour: QLoRA outside torchtune, and any
    LoRA over a ``bnb_4bit`` base)."""


def _kbit_upcast(w: TrainingWorkload, stack: Stack | None) -> bool:
    """Whether QLoRA's unquantized parameters are cast to fp32: the stack's rule, except for
    sharded QLoRA (ZeRO-3 / FSDP over several replicas), whose flattened parameters must share
    one dtype: the 4-bit storage and every other parameter stay in the model's dtype (TRL <
    0.22 skips prepare_model_for_kbit_training for it; PEFT's FSDP and DeepSpeed QLoRA guides
    set bnb_4bit_quant_storage to it)."""
    if not isinstance(w.method, QLoRA):
        return True
    par = w.parallelism
    if par.zero_stage >= 3 and par.data > 1:
        return False
    return stack.qlora_upcast if stack is not None else True


def training_plan(w: TrainingWorkload, stack: Stack | None = None) -> TrainingPlan:
    m = w.method
    par = w.parallelism
    fsdp = par.zero_stage >= 3 and par.data > 1 and not (stack is not None and stack.deepspeed)
    if isinstance(m, LoRA):  # QLoRA is a LoRA
        resolved = stack or resolve_stack(None)
        return TrainingPlan(
            "qlora" if isinstance(m, QLoRA) else "lora",
            m.rank,
            tuple(m.target_modules),
            bytes_of(adapter_dtype_of(w, resolved)),
            w.optimizer,
            w.mixed_precision,
            _kbit_upcast(w, stack),
            fsdp,
            resolved.lora_reaches_experts,
            tuple(m.modules_to_save),
            resolved.foreach_intermediates,
            m.ensure_weight_tying,
            resolved.saved_fp16_to_fp32,
            metadata_sharded=not isinstance(w.precision.quantization, BitsAndBytes4bit)
            and not (isinstance(m, QLoRA) and not resolved.quantized_state_sharded),
        )
    return TrainingPlan(
        "full",
        0,
        (),
        0,
        w.optimizer,
        w.mixed_precision,
        fsdp=fsdp,
        foreach_intermediates=(stack or resolve_stack(None)).foreach_intermediates,
    )


def residual_bytes(w: TrainingWorkload, stack: Stack | None = None) -> int:
    """Bytes per element of the residual stream between layers (what full recomputation keeps
    of each layer): fp32 under autocast, and for QLoRA as PEFT prepares it (fp32 embeddings and
    norms make every layer input fp32); else the compute dtype's."""
    e = bytes_of(w.precision.compute)
    kbit_fp32 = isinstance(w.method, QLoRA) and training_plan(w, stack).kbit_upcast
    return max(4 if kbit_fp32 or w.mixed_precision == "autocast" else e, e)


@dataclass(frozen=True, slots=True)
class StageStatic:
    stage: Stage
    dims: DeviceDims
    layer_kinds: tuple[tuple[LayerType, int], ...]
    num_params: int
    weights_bytes: int
    metadata_bytes: int
    weights_rounding_bytes: int
    adapter_params: int
    adapter_bytes: int
    trainable_params: int
    gradient_bytes: int
    optimizer_bytes: int
    master_bytes: int
    host_optimizer_bytes: int
    host_master_bytes: int
    host_param_bytes: int
    host_gradient_bytes: int
    """With the optimizer offloaded, the rank's gradient partition after its reduce(-scatter),
    which lives in host memory (0 otherwise)."""
    comm_bytes: int
    comm_parts: tuple[tuple[str, int], ...]
    largest_layer_params: int
    largest_linear_params: int
    kv_full_elems: int
    """K+V elements per token per sequence over this stage's full-attention layers."""
    kv_sliding: tuple[tuple[int, int], ...]
    """(window, elements per token) over its sliding-window layers."""
    kv_layer_elems: int = 0
    """K+V elements per token per sequence of its largest full-attention layer (what
    ``generate``'s ``torch.cat`` copies for one layer at a time)."""
    state_elems: int = 0
    """Per-sequence state elements in the compute dtype over its layers (Mamba /
    linear-attention conv and recurrent states), whatever the context length."""
    state_bytes: int = 0
    """Per-sequence state bytes kept in a fixed dtype (fp32 recurrent states)."""
    step_gradient_bytes: int = 0
    """Gradients during the optimizer step: fp32 when the step runs on fp32 masters."""
    step_upcast_bytes: int = 0
    """The low-precision gradient of the largest tensor, live while its fp32 copy is made."""
    step_temporary_bytes: int = 0
    """The optimizer implementation's temporaries at its peak (foreach: a state-sized tensor
    per parameter; for-loop: two of the largest; fused: none)."""
    unsharded_gradient_bytes: int = 0
    """The trainable parameters' gradients on this device before any ZeRO / FSDP sharding
    (what ``no_sync`` accumulates)."""
    kernel_scratch_bytes: int = 0
    """The quantized kernel's fixed scratch on this device (AutoGPTQ exllama v1/v2 buffers
    kept from loading on: :func:`exllama_scratch`)."""
    block_gradient_bytes: int = 0
    """LoRA only: the gradient of every layer parameter (frozen weights and adapters) in the
    weights' gradient dtype, before sharding: what FSDP1 allocates when a FlatParameter
    mixes frozen and trainable parameters (``Stack.frozen_gradients``)."""

    saved_parts: tuple[tuple[str, int], ...] = ()
    """With PEFT ``modules_to_save``: the adapters component itemized (the LoRA adapters and
    each module's trainable copy); empty otherwise."""
    saved_head_gradient_bytes: int = 0
    """The weight gradient of a ``modules_to_save`` LM head copy (written in the head's
    backward, before the layers')."""
    saved_tied_accumulate_bytes: int = 0
    """With the LM head sharing the embedding's ``modules_to_save`` copy: the embedding's own
    gradient, live beside the head's while it is added into it (the backward's end)."""
    saved_largest_state_bytes: int = 0
    """One optimizer-state tensor of the largest ``modules_to_save`` copy (what the first step
    allocates for it, lazily, after the backward)."""

    @property
    def saved_copy_bytes(self) -> int:
        """The ``modules_to_save`` copies' bytes (in :attr:`adapter_bytes`): what PEFT's
        ``get_peft_model`` adds, after any model-init phase."""
        return sum(b for _, b in self.saved_parts[1:])

    @property
    def host_step_bytes(self) -> int:
        """What an offloaded optimizer keeps in host RAM for this rank: its state, the master
        weights and the gradient partition."""
        return self.host_optimizer_bytes + self.host_master_bytes + self.host_gradient_bytes


def _last_trainable(
    arch: Arch, stage: Stage, plan: TrainingPlan, t: int, ep: int, p: int, untied: bool
) -> int:
    """Elements of the last trainable tensor in module order (embeddings, layers, head,
    extras): gradients are upcast to the fp32 masters in that order, each low-precision one
    freed after its copy, so the peak is all fp32 gradients plus the last low-precision one."""
    if plan.method == "full":
        if stage.first and arch.extras:
            g = arch.extras[-1]
        elif stage.last:
            g = head_groups(arch, p, untied)[-1]
        else:
            g = stage.layer_runs[-1][0].tensors[-1]
        rows, cols, count = per_device_shape(g, arch, t, ep)
        stacked = g.role is Role.EXPERT or (count > 1 and g.role is not Role.NORM)
        return rows * cols * (count if stacked else 1)
    layer = stage.layer_runs[-1][0]
    targeted = [g for g in layer.tensors if lora_targeted(g, plan.lora_targets, plan.lora_experts)]
    if not targeted:
        return 0
    g = targeted[-1]
    rows, _, count = per_device_shape(g, arch, t, ep)
    return rows * plan.lora_rank * (count if g.role is Role.EXPERT else 1)


def _check_saved(g: TensorGroup, targeted: bool, quantized: bool) -> None:
    """What PEFT refuses in ``modules_to_save``: a module that LoRA adapts (a
    ModulesToSaveWrapper "cannot be applied to modules of type" a LoraLayer: peft 0.21.2
    ``utils/other.py`` ``check_module``, lines 355-360) and a 4-bit one (its uint8 storage
    cannot require gradients)."""
    name = module_name(g)
    if targeted:
        raise InvalidWorkload(
            "method.modules_to_save",
            f"{name} is also a LoRA target (method.target_modules): PEFT cannot train a copy "
            "of an adapted module ('modules_to_save cannot be applied to modules of type "
            "LoraLayer'); name it in one list only",
        )
    if quantized:
        raise InvalidWorkload(
            "method.modules_to_save",
            f"{name} is quantized here: a copy of a 4-bit module cannot be trained (its uint8 "
            "storage cannot require gradients); name an unquantized module (embed_tokens, "
            "lm_head, a norm)",
        )


EMBEDDING_LAYER_NAMES = ("embed_tokens", "lm_head")
"""The names with which PEFT's ``ensure_weight_tying`` ties a saved embedding and head
(peft 0.21.2 ``utils/constants.py`` ``EMBEDDING_LAYER_NAMES``)."""


def tied_saving(
    arch: Arch, names: tuple[str, ...], ensure: bool, p: int = 1, untied: bool = False
) -> tuple[tuple[str, ...], bool]:
    """``modules_to_save`` as PEFT applies it, and whether the LM head shares the embedding's
    copy: with ``ensure_weight_tying`` on a model that ties its head, a name that is exactly
    ``embed_tokens`` or ``lm_head`` saves the input embedding and ties the head to its copy,
    ``lm_head`` leaving the list (peft 0.21.2 ``tuners_utils.py`` ``_check_tied_modules``,
    ``lora/model.py`` ``_add_modules_to_save_to_tie``); else the names as given (GPT-2's
    ``wte`` does not tie: PEFT warns)."""
    if not ensure or tied_head_module(arch, p, untied) is None:
        return names, False
    if not any(n in EMBEDDING_LAYER_NAMES for n in names):
        return names, False
    embedding = module_name(arch.embeddings[0])
    kept = tuple(n for n in names if n != "lm_head")
    if not any(embedding.endswith(n) for n in kept):
        kept += (embedding,)
    return kept, True


def _copy_bytes(g: TensorGroup, plain_dtype: str, unquantized: int, plan: TrainingPlan) -> int:
    """Bytes per element of a ``modules_to_save`` copy: the original's as the model holds it
    (``unquantized``: after any QLoRA fp32 upcast), an fp16 one promoted to fp32 where the
    stack trains it so (:attr:`TrainingPlan.saved_fp16_to_fp32`)."""
    copy = fixed_bytes(g, plain_dtype) or unquantized
    if copy == 2 and plain_dtype == "fp16" and plan.saved_fp16_to_fp32:
        return 4
    return copy


def tied_head_module(arch: Arch, p: int = 1, untied: bool = False) -> TensorGroup | None:
    """The LM head module of a tied decoder where the head groups do not list it (its weight
    is the embedding's): what ``modules_to_save`` may name as ``lm_head``."""
    if arch.kind != "decoder" or not arch.tie_word_embeddings:
        return None
    if any(g.role is Role.LM_HEAD for g in head_groups(arch, p, untied)):
        return None
    emb = arch.embeddings[0]
    return TensorGroup("lm_head", emb.rows, emb.cols, Role.LM_HEAD, Split.VOCAB)


def _bucketed(
    arch: Arch, stage: Stage, p: int, untied: bool = False
) -> Iterator[tuple[TensorGroup, int, object, tuple[int, int] | None]]:
    """(tensor group, multiplicity, the bucket it belongs to: its run's index, or
    ``embeddings``, ``extras``, ``head``, and the bucket's (payload, metadata) bytes as the
    checkpoint stores them, if known)."""
    top = {name: (payload, meta) for name, payload, meta in arch.stored_top}
    for run, (layer, n) in enumerate(stage.layer_runs):
        for g in layer.tensors:
            yield g, n, run, layer.stored
    if stage.first:
        for g in arch.embeddings:
            yield g, 1, "embeddings", top.get("embeddings")
        for g in arch.extras:
            yield g, 1, "extras", top.get("extras")
    if stage.last:
        for g in head_groups(arch, p, untied):
            yield g, 1, "head", top.get("head")


TIED_COPY = "lm_head (tied copy)"


def head_groups(arch: Arch, p: int, untied: bool = False) -> tuple[TensorGroup, ...]:
    """The last stage's head: the final norm and LM head, and a copy of a tied head with ``p`` >
    1 stages (a tied head on another stage than the embedding needs its own copy: vLLM
    ParallelLMHead on the last rank, Megatron's output layer with shared weights) or where the
    framework unties it (``untied``: LitGPT's GPT has its own ``lm_head`` Linear, into which
    ``convert_hf_checkpoint`` copies the tied embedding)."""
    if (p > 1 or untied) and arch.tie_word_embeddings and arch.kind == "decoder":
        emb = arch.embeddings[0]
        return (
            *arch.head,
            TensorGroup(TIED_COPY, emb.rows, emb.cols, Role.LM_HEAD, Split.VOCAB, module="lm_head"),
        )
    return arch.head


def device_params(layer: LayerType, arch: Arch, t: int, ep: int) -> int:
    """Parameters (not buffers) of one ``layer`` on one device of a ``t`` x ``ep`` layout."""
    total = 0
    for g in layer.tensors:
        if not g.buffer:
            rows, cols, count = per_device_shape(g, arch, t, ep)
            total += rows * cols * count
    return total


@lru_cache(maxsize=4096)
def stage_statics(
    arch: Arch,
    precision: Precision,
    par: Parallelism,
    plan: TrainingPlan | None,
    untied_head: bool = False,
) -> tuple[StageStatic, ...]:
    """Per pipeline stage: the persistent bytes and the shapes the formulas read.
    ``untied_head``: the framework keeps its own LM head where the checkpoint ties it
    (LitGPT)."""
    check_layout(arch, par)
    t, ep, dp = par.tensor, par.expert, par.data
    dims = device_dims(arch, t, ep)
    quant = precision.quantization
    plain_dtype = precision.weights
    if plain_dtype == "fp8":
        quant, plain_dtype = FP8(), precision.compute
    quant = deployed_quantization(quant)
    plain_bytes = bytes_of(plain_dtype)
    roles = quantized_roles(quant) if quant is not None else frozenset()
    kernel = getattr(quant, "kernel", None)
    buffer_stored = stored_as_buffers(quant)
    # QLoRA as PEFT prepares it (peft/utils/other.py prepare_model_for_kbit_training, which
    # TRL's SFTTrainer calls for a 4-bit model): every 16-bit parameter that is not 4-bit is
    # cast to fp32 -- embeddings, LM head, norms, routers.
    upcast = plan is not None and plan.method == "qlora" and plan.kbit_upcast
    kbit_bytes = max(plain_bytes, 4) if upcast else plain_bytes
    training = plan is not None
    zero = par.zero_stage if training else 0
    result = []
    for stage in stages(arch, par.pipeline):
        weights = meta = rounding = params = 0
        # What ZeRO-3 and FSDP leave whole on every rank: buffers (they shard, gather and
        # offload parameters only), GPTQ's and AWQ's packed projections among them.
        whole_weights = whole_meta = 0
        # ... and, for buckets whose bytes the checkpoint's headers give, the formula's kept
        # and total (payload, metadata) bytes: the headers' bytes are split in that proportion.
        bucket_kept: dict[object, list[int]] = {}
        trainable_shapes: list[tuple[int, int, int]] = []
        adapter_params = 0
        largest_linear = 0
        largest_trainable = 0
        scratch_fixed = scratch_per_layer = 0  # exllama kernels (kernel_scratch_bytes)
        adapted_runs: set[object] = set()  # layer runs with an adapter (FSDP1 frozen gradients)
        # modules_to_save: the trainable copies' shapes and largest tensor by their dtype's
        # bytes, their names, and the LM head's copy (elements, bytes) -- the last trainable.
        saved: dict[int, list[tuple[int, int, int]]] = {}
        names, shared = (
            tied_saving(arch, plan.modules_to_save, plan.tie_saved_head, par.pipeline, untied_head)
            if plan is not None
            else ((), False)
        )
        saved_largest: dict[int, int] = {}
        copy_names: dict[str, int] = {}
        head_copy: tuple[int, int] | None = None
        other_copy: tuple[int, int] | None = None
        embedding_copy: tuple[int, int] | None = None
        # Stored bytes of one layer of each run, and of what no layer holds (FSDP's units).
        run_bytes: dict[object, int] = {}
        root_bytes = 0
        # Buckets whose bytes the checkpoint's headers give: (full, device) elements, per copy.
        shares: dict[object, tuple[tuple[int, int], int, list[int]]] = {}
        for g, mult, bucket, bucket_stored in _bucketed(arch, stage, par.pipeline, untied_head):
            rows, cols, count = per_device_shape(g, arch, t, ep)
            n = count * mult
            if not g.buffer:  # parameters only, as Arch.num_params counts them
                params += rows * cols * n
            quantized = quant is not None and g.role in roles and quantizable(g)
            payload, md = stored_bytes(
                rows,
                cols,
                fixed_bytes(g, plain_dtype) or (kbit_bytes if not quantized else plain_bytes),
                quant if quantized else None,
            )
            # GPTQ's and AWQ's QuantLinear keep a quantized projection's bias as a buffer too.
            kept_whole = g.buffer or (
                buffer_stored and (quantized or (g.role is Role.BIAS and Role.LINEAR in roles))
            )
            if not kept_whole:
                # what FSDP flattens into the unit: bitsandbytes' quant_state is not a parameter
                unit = payload + (md if plan is None or plan.metadata_sharded else 0)
                if isinstance(bucket, int):
                    run_bytes[bucket] = run_bytes.get(bucket, 0) + unit * count
                else:
                    root_bytes += unit * n
            copied = g.name == TIED_COPY  # not in the checkpoint: a pipeline stage's own copy
            stored = None if g.buffer or copied else bucket_stored
            if stored is not None:
                share = shares.setdefault(bucket, (stored, mult, [0, 0]))[2]
                share[0] += g.rows * g.cols * g.count
                share[1] += rows * cols * count
                split = bucket_kept.setdefault(bucket, [0, 0, 0, 0])
                split[2] += payload * count
                split[3] += md * count
                if kept_whole:
                    split[0] += payload * count
                    split[1] += md * count
            else:
                weights += payload * n
                meta += md * n
                if kept_whole:
                    whole_weights += payload * n
                    whole_meta += md * n
            rounding += block_rounding(payload) * n
            if md:
                rounding += block_rounding(md) * n
            if quantized and kernel is not None:
                fixed, per_layer = exllama_scratch(kernel, cols, rows)
                scratch_fixed = max(scratch_fixed, fixed)
                scratch_per_layer += per_layer * n
            if ((quantized or quant is None) and g.role in (Role.LINEAR, Role.EXPERT)) or (
                quantized and g.role is Role.LM_HEAD
            ):
                # What a 4-bit matmul dequantizes: a quantized projection (experts left 16-bit
                # are not), and a 4-bit LM head (LitGPT's QLoRA) too.
                largest_linear = max(largest_linear, rows * cols)
            if plan is None or g.buffer:
                continue
            # Routed experts are one stacked tensor per projection in the workload code.
            stacked = count if g.role is Role.EXPERT else 1
            if plan.method == "full":
                trainable_shapes.append((rows, cols, n))
                largest_trainable = max(largest_trainable, rows * cols * stacked)
                continue
            targeted = lora_targeted(g, plan.lora_targets, plan.lora_experts)
            reached = saved_count(g, names)
            if reached:
                _check_saved(g, targeted, quantized)
                copy = _copy_bytes(g, plain_dtype, kbit_bytes, plan)
                kept = reached if g.modules else count  # a layer's norms one by one
                elements = rows * cols * kept * mult
                # FSDP wraps the copy in its module's unit, beside the frozen original
                if isinstance(bucket, int):
                    run_bytes[bucket] = run_bytes.get(bucket, 0) + rows * cols * kept * copy
                else:
                    root_bytes += elements * copy
                saved.setdefault(copy, []).append((rows, cols, kept * mult))
                saved_largest[copy] = max(saved_largest.get(copy, 0), rows * cols * stacked)
                name = ", ".join(saved_names(g, names))
                copy_names[name] = copy_names.get(name, 0) + elements * copy
                if bucket == "head":
                    head_copy = (elements, copy)
                else:
                    other_copy = (elements, copy)
                if g is arch.embeddings[0]:
                    embedding_copy = (elements, copy)
            elif targeted:
                # lora_A (r x in) and lora_B (out x r) per adapted projection.
                adapter_params += lora_params(plan.lora_rank, rows, cols) * n
                adapted_runs.add(bucket)
                trainable_shapes.append((plan.lora_rank, cols, n))
                trainable_shapes.append((rows, plan.lora_rank, n))
                largest_trainable = max(
                    largest_trainable, plan.lora_rank * max(rows, cols) * stacked
                )
        tied_head = tied_head_module(arch, par.pipeline, untied_head) if stage.last else None
        if shared:
            tied_head = None  # it shares the embedding's copy (PEFT's ensure_weight_tying)
        if plan is not None and tied_head is not None and saved_by(tied_head, names):
            # The tied LM head is a module of its own in the modelling code (lm_head, its
            # weight the embedding's): its saved copy is a new tensor of the embedding's shape
            # and dtype (PEFT deep-copies the module; with ensure_weight_tying it shares the
            # embedding copy's: ``tied_saving``).
            rows, cols, count = per_device_shape(tied_head, arch, t, ep)
            emb = arch.embeddings[0]
            _check_saved(tied_head, False, quant is not None and emb.role in roles)
            copy = _copy_bytes(emb, plain_dtype, kbit_bytes, plan)
            root_bytes += rows * cols * count * copy
            saved.setdefault(copy, []).append((rows, cols, count))
            saved_largest[copy] = max(saved_largest.get(copy, 0), rows * cols)
            copy_names["lm_head"] = rows * cols * count * copy
            head_copy = (rows * cols * count, copy)
        for bucket, ((stored_payload, stored_meta), mult, (full, device)) in shares.items():
            # A device's share of the stored bytes: its share of the bucket's elements.
            share_payload = stored_payload * device // max(full, 1) * mult
            share_meta = stored_meta * device // max(full, 1) * mult
            weights += share_payload
            meta += share_meta
            kept_payload, kept_md, all_payload, all_md = bucket_kept[bucket]
            if kept_payload:
                whole_weights += share_payload * kept_payload // all_payload
            if kept_md:
                whole_meta += share_meta * kept_md // all_md
        largest_layer = max(
            (device_params(layer, arch, t, ep) for layer, _ in stage.layer_runs), default=0
        )
        full_layers = (
            [
                (_layer_kv_elems(layer, arch, t), n)
                for layer, n in stage.layer_runs
                if layer.window is None
            ]
            if arch.kind == "decoder"
            else []
        )
        kv_full = sum(elems * n for elems, n in full_layers)
        kv_layer = max((elems for elems, _ in full_layers), default=0)
        sliding: dict[int, int] = {}
        state_elems = state_fixed = 0
        if arch.kind == "decoder":
            for layer, n in stage.layer_runs:
                if layer.window is not None:
                    sliding[layer.window] = (
                        sliding.get(layer.window, 0) + _layer_kv_elems(layer, arch, t) * n
                    )
                for numel, dtype in layer.state:
                    if dtype is None:
                        state_elems += ceil_div(numel, t) * n
                    else:
                        state_fixed += ceil_div(numel, t) * bytes_of(dtype) * n
        gradient = unsharded_gradient = optimizer = master = host_opt = host_master = 0
        host_params = host_grads = 0
        step_gradient = step_upcast = step_temporary = 0
        adapter_bytes = 0
        trainable = 0
        grad_bytes = 0
        saved_parts: tuple[tuple[str, int], ...] = ()
        saved_head_gradient = saved_state = tied_accumulate = 0
        if plan is not None:
            full = plan.method == "full"
            mp = plan.mixed_precision
            # The trained tensors by their dtype's bytes: (bytes, shapes, elements, largest).
            sets: list[tuple[int, list[tuple[int, int, int]], int, int]]
            if full:
                trainable = params
                sets = [(plain_bytes, trainable_shapes, params, largest_trainable)]
            else:
                sets = [(plan.adapter_bytes, trainable_shapes, adapter_params, largest_trainable)]
                sets += [
                    (b, shapes, sum(r * c * k for r, c, k in shapes), saved_largest[b])
                    for b, shapes in saved.items()
                ]
                trainable = sum(numel for _, _, numel, _ in sets)
                adapter_bytes = sum(b * numel for b, _, numel, _ in sets)
                if saved:
                    saved_parts = (
                        ("LoRA adapters", adapter_params * plan.adapter_bytes),
                        *((f"{name} (modules_to_save copy)", b) for name, b in copy_names.items()),
                    )
            temporaries = []
            for pb, shapes, numel, largest in sets:
                gb = gradients.grad_dtype_bytes(full, mp, pb)
                state = optimizer_state.state_dtype_bytes(full, mp, pb)
                per = master_weights.master_bytes_per_param(mp, pb)
                grad_bytes = max(grad_bytes, gb)
                gradient += numel * gb
                optimizer += state_bytes(plan.optimizer, shapes, state)
                master += numel * per
                step_gradient += numel * (4 if per else gb)
                temporaries.append(
                    step_temporaries(
                        plan.optimizer, numel, largest, state, plan.foreach_intermediates
                    )
                )
                if not full and pb in saved:
                    saved_state = max(saved_state, saved_largest[pb] * state)
            unsharded_gradient = gradient
            # torch's foreach step runs dtype group after dtype group (_group_tensors_by_device
            # _and_dtype); counted as if all at once, an upper bound.
            foreach = (
                isinstance(plan.optimizer, AdamW) and plan.optimizer.implementation == "foreach"
            )
            step_temporary = sum(temporaries) if foreach else max(temporaries)
            # The last trainable tensor in module order: a saved LM head's copy, else the last
            # adapter, else another saved copy.
            last_adapter = _last_trainable(arch, stage, plan, t, ep, par.pipeline, untied_head)
            last = head_copy or (
                (last_adapter, plan.adapter_bytes if not full else plain_bytes)
                if last_adapter or other_copy is None
                else other_copy
            )
            if head_copy is not None:
                saved_head_gradient = head_copy[0] * gradients.grad_dtype_bytes(
                    full, mp, head_copy[1]
                )
            if shared and embedding_copy is not None:
                # One copy for the embedding and the head: its gradient is written by the
                # head's backward and the embedding's own, at the end, is added into it.
                tied_accumulate = embedding_copy[0] * gradients.grad_dtype_bytes(
                    full, mp, embedding_copy[1]
                )
                saved_head_gradient = tied_accumulate
            last_grad = gradients.grad_dtype_bytes(full, mp, last[1])
            step_upcast = (
                last[0] * last_grad if master_weights.master_bytes_per_param(mp, last[1]) else 0
            )
            if zero >= optimizer_state.SHARDED_FROM_ZERO_STAGE:
                optimizer = ceil_div(optimizer, dp)
                step_temporary = ceil_div(step_temporary, dp)
            if zero >= master_weights.SHARDED_FROM_ZERO_STAGE:
                master = ceil_div(master, dp)
            if zero >= gradients.SHARDED_FROM_ZERO_STAGE:
                gradient = ceil_div(gradient, dp)
                step_gradient = ceil_div(step_gradient, dp)
            # whole_*: the bytes of buffers (stored_as_buffers) no rank shards or offloads
            if zero >= 3:  # ZeRO-3 / FSDP FULL_SHARD shard frozen parameters too
                weights = ceil_div(weights - whole_weights, dp) + whole_weights
                if plan.metadata_sharded:
                    meta = ceil_div(meta - whole_meta, dp) + whole_meta
                if saved_parts:  # and the modules_to_save copies, parameters like the rest
                    saved_parts = (
                        saved_parts[0],
                        *((name, ceil_div(b, dp)) for name, b in saved_parts[1:]),
                    )
                    adapter_bytes = sum(b for _, b in saved_parts)
            if par.offload_optimizer:
                # The step runs on the host, and the gradient partition goes there as each bucket
                # is reduced: ZeRO-Offload "offloads gradients, optimizer states and optimizer
                # computation to CPU" (Ren et al. 2021 §4; DeepSpeed stage_1_and_2.py
                # async_accumulate_grad_in_cpu_via_gpu, stage3.py partition_grads into the pinned
                # grad_partitions_flat_buffer), and FSDP's CPUOffload(offload_params=True)
                # "offloads gradients to CPU as well" (FSDP2's CPUOffloadPolicy: "sharded
                # gradients are copied device-to-host in backward"). The device keeps the
                # buckets in flight (communication buffers) and, under no_sync accumulation,
                # the unsharded gradients. ZeRO-1 reduces the whole gradient after the backward,
                # so it stays on the device until the step copies it.
                host_opt, host_master, optimizer, master = optimizer, master, 0, 0
                step_gradient, step_upcast, step_temporary = gradient, 0, 0
                if zero >= gradients.SHARDED_FROM_ZERO_STAGE:
                    host_grads, gradient, step_gradient = gradient, 0, 0
            if par.offload_parameters:
                host_params, weights = weights - whole_weights, whole_weights
                if plan.metadata_sharded:  # moved with the shards (torchtune's NF4 scalers)
                    host_params, meta = host_params + meta - whole_meta, whole_meta
        block_gradient = 0
        if plan is not None and plan.method == "lora":
            # A FlatParameter with nothing trainable gets no gradient: adapted layers only.
            layer_params = sum(
                device_params(layer, arch, t, ep) * n
                for run, (layer, n) in enumerate(stage.layer_runs)
                if run in adapted_runs
            )
            block_gradient = (layer_params + adapter_params) * gradients.grad_dtype_bytes(
                True, plan.mixed_precision, plain_bytes
            )
        # FSDP's units: the root (what no block holds: embeddings, final norm, LM head) and the
        # largest block, in the bytes they are stored in.
        units = (root_bytes, max(run_bytes.values(), default=0))
        comm_parts = communication_buffers.stage_parts(
            t,
            par.pipeline,
            dp,
            zero,
            training,
            trainable,
            grad_bytes,
            largest_layer,
            params,
            plain_bytes,
            units if plan is not None and plan.fsdp else None,
        )
        result.append(
            StageStatic(
                stage=stage,
                dims=dims,
                layer_kinds=stage.layer_runs,
                num_params=params,
                weights_bytes=weights,
                metadata_bytes=meta,
                weights_rounding_bytes=rounding,
                adapter_params=adapter_params,
                adapter_bytes=adapter_bytes,
                trainable_params=trainable,
                gradient_bytes=gradient,
                optimizer_bytes=optimizer,
                master_bytes=master,
                host_optimizer_bytes=host_opt,
                host_master_bytes=host_master,
                host_param_bytes=host_params,
                host_gradient_bytes=host_grads,
                comm_bytes=sum(b for _, b in comm_parts),
                comm_parts=tuple(comm_parts),
                largest_layer_params=largest_layer,
                largest_linear_params=largest_linear,
                kv_full_elems=kv_full,
                kv_layer_elems=kv_layer,
                kv_sliding=tuple(sorted(sliding.items())),
                state_elems=state_elems,
                state_bytes=state_fixed,
                step_gradient_bytes=step_gradient,
                step_upcast_bytes=step_upcast,
                step_temporary_bytes=step_temporary,
                unsharded_gradient_bytes=unsharded_gradient,
                block_gradient_bytes=block_gradient,
                saved_parts=saved_parts,
                saved_head_gradient_bytes=saved_head_gradient,
                saved_largest_state_bytes=saved_state,
                saved_tied_accumulate_bytes=tied_accumulate,
                kernel_scratch_bytes=scratch_fixed + scratch_per_layer,
            )
        )
    return tuple(result)


def fixed_bytes(g: TensorGroup, weights_dtype: str) -> int:
    """Bytes per element of a tensor that keeps its own dtype (0: it follows the weights)."""
    if g.dtype is not None:
        return bytes_of(g.dtype)
    if g.fp32_at_fp16 and weights_dtype == "fp16":
        return 4
    return 0


def quantizable(g: TensorGroup) -> bool:
    """Whether a quantization scheme may touch the tensor (not one that keeps its own dtype)."""
    return g.dtype is None and not g.fp32_at_fp16


def _layer_kv_elems(layer: LayerType, arch: Arch, t: int) -> int:
    """K + V elements per token of one layer on one of ``t`` devices: the framework cache's
    measured width (key/value heads divided as the layout divides them) or the formula's."""
    if layer.kv_elems is None:
        return elems_per_token(arch, t)
    return layer.kv_elems * kv_heads_per_device(arch, t) // arch.num_kv_heads


def effective_precision(w: ModelWorkload | EncoderWorkload, stack: Stack | None = None) -> Any:
    """The workload's precision, with QLoRA's base quantization as its weights' quantization
    (the LM head too where the framework quantizes it: ``Stack.qlora_head_quantized``), and
    bitsandbytes 4-bit's routed experts as ``stack`` (None: the default stack) quantizes them
    (``Stack.bnb_quantizes_experts``)."""
    p = w.precision
    if isinstance(w, TrainingWorkload) and isinstance(w.method, QLoRA):
        base = w.method.base_quantization
        if stack is not None and stack.qlora_head_quantized:
            base = msgspec.structs.replace(base, quantize_lm_head=True)
        p = msgspec.structs.replace(p, quantization=base)
    q = p.quantization
    if isinstance(q, BitsAndBytes4bit) and q.quantize_experts is None:
        # as the stack's modelling code and bitsandbytes do (Stack.bnb_quantizes_experts)
        experts = (stack or resolve_stack(None)).bnb_quantizes_experts
        p = msgspec.structs.replace(
            p, quantization=msgspec.structs.replace(q, quantize_experts=experts)
        )
    return p


def statics_for(
    w: InferenceWorkload | TrainingWorkload, arch: Arch, stack: Stack | None = None
) -> tuple[StageStatic, ...]:
    """The cached per-stage statics of a model workload, deployed
    (:func:`vrambudget.core.deployed.deploy`: its precision concrete), under ``stack`` (where
    the framework decides a persistent dtype: QLoRA's unquantized parameters)."""
    p = w.precision
    assert p.weights != "auto" and p.compute != "auto", "deploy() the workload first"
    plan = training_plan(w, stack) if isinstance(w, TrainingWorkload) else None
    untied = stack is not None and stack.untied_head
    return stage_statics(arch, effective_precision(w, stack), w.parallelism, plan, untied)
