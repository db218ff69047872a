"""The workload side of an analytic budget's words: the inputs each line names, the workload's
inputs and warnings, and its summary."""

from __future__ import annotations

from typing import Any

from ..arch import (
    ALL_LINEAR,
    Arch,
    Role,
    attention_run,
    lora_target_names,
    lora_targeted,
    module_name,
    projection_names,
    saved_by,
)
from ..components import Component, Members
from ..deployed import deployed_format
from ..device import DeviceContext
from ..dtypes import bytes_of
from ..overheads import Overheads
from ..resolve import model_name, model_origin
from ..result import WorkloadSummary
from ..spec import (
    AnalyticWorkload,
    BitsAndBytes4bit,
    EncoderWorkload,
    FullFineTune,
    GenericWorkload,
    InferenceWorkload,
    LoRA,
    QLoRA,
    TrainingWorkload,
    VisionWorkload,
)
from ..stack import Stack, resolve_stack
from ..statics import (
    EMBEDDING_LAYER_NAMES,
    effective_precision,
    statics_for,
    tied_head_module,
    tied_saving,
    training_plan,
)
from .inference import fragmentation_ppm, runtime_attention

__all__ = [
    "INPUT_NAMES",
    "inference_input_parts",
    "inputs",
    "kind",
    "scaled_inputs",
    "shape_warnings",
    "size_warnings",
    "summary",
    "warnings",
]

C = Members  # the members as plain attributes (Component's read through a descriptor)

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
            "attention_runs",
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
            "attention_runs",
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
_ENCODE: dict[Component, tuple[str, ...]] = {
    C.WEIGHTS: ("weights_dtype", "quantization", "tensor_parallel", "instances"),
    C.QUANTIZATION_METADATA: ("quantization", "tensor_parallel", "instances"),
    C.KV_CACHE: ("sequences", "encoder_positions", "generated_tokens", "kv_cache_dtype"),
    C.ACTIVATIONS: ("sequences", "encoder_positions", "attention", "compute_dtype"),
    C.LOGITS: ("sequences", "compute_dtype"),
    C.CUDA_CONTEXT: ("instances",),
    C.RUNTIME_WORKSPACE: ("instances",),
    C.COMMUNICATION_BUFFERS: ("tensor_parallel",),
    C.ALLOCATOR_OVERHEAD: ("fragmentation_fraction", "largest_transient_bytes"),
}
for _kind in ("vision", "seq2seq", "speech_to_text"):
    INPUT_NAMES[_kind] = dict(_ENCODE)
for _names in INPUT_NAMES.values():
    _names[C.HEADROOM] = ("headroom_fraction", "headroom_min_bytes", "subtotal_bytes")
del _names


def kind(w: AnalyticWorkload) -> str:
    return w.__struct_config__.tag  # type: ignore[return-value]


_SCALING = ("sequences", "context_tokens", "prompt_tokens")  # an inference budget's own
_AFTER = ("attention", "attention_runs", "kv_cache_dtype", "logits")  # in this order after them


def inference_input_parts(
    w: InferenceWorkload, arch: Arch, ov: Overheads
) -> tuple[dict[str, Any], dict[str, Any]]:
    """An inference workload's inputs other than its sequences and tokens (they depend on its
    model, precision, layout, instances, attention, logits and chunking): those before them
    and those after, in the answer's order (:func:`scaled_inputs` puts them together)."""
    whole = inputs(w, arch, ov)
    before = {k: v for k, v in whole.items() if k not in _SCALING and k not in _AFTER}
    return before, {k: whole[k] for k in _AFTER}


def scaled_inputs(
    w: InferenceWorkload, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    """An inference workload's inputs from :func:`inference_input_parts` and its own
    sequences and tokens."""
    return {
        **before,
        "sequences": w.batch_size * w.concurrent_requests,
        "context_tokens": w.prompt_tokens + w.generated_tokens,
        "prompt_tokens": w.prompt_tokens,
        **after,
    }


def inputs(w: AnalyticWorkload, arch: Arch | None, ov: Overheads) -> dict[str, Any]:
    """The inputs a budget of ``w`` names (its lines' ``inputs`` name keys of it); a single
    inference workload's are put together per request by :func:`scaled_inputs`."""
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
            ov.training_fragmentation(w.checkpointing)
            if isinstance(w, TrainingWorkload)
            else fragmentation_ppm(w, arch, ov)
            if isinstance(w, InferenceWorkload) and arch is not None
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
    if isinstance(w, EncoderWorkload):
        from .encoders import encoder_info, encoder_positions

        n, positions = encoder_positions(w, encoder_info(w, "workload"))
        common.update(
            sequences=n,
            encoder_positions=positions,
            generated_tokens=0 if isinstance(w, VisionWorkload) else w.generated_tokens,
            attention=w.attention,
            kv_cache_dtype=w.precision.kv_cache,
        )
    elif isinstance(w, InferenceWorkload):
        common.update(
            sequences=w.num_sequences,
            context_tokens=w.context_tokens,
            prompt_tokens=w.prompt_tokens,
            attention=w.attention,
            attention_runs=_runs(w, arch, ov),
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
            attention_runs=_runs(w, arch, ov),
            method=w.method.__struct_config__.tag,
        )
    return common


def _runs(w: InferenceWorkload | TrainingWorkload, arch: Arch | None, ov: Overheads) -> str:
    """The attention implementation that runs (:func:`vrambudget.core.arch.attention_run`):
    ``math`` where SDPA has no fused kernel on this device and stack, ``eager`` where a
    soft-capped model falls back to it; the requested one where the model is not known."""
    if arch is None:
        return w.attention
    if isinstance(w, InferenceWorkload):
        return runtime_attention(w, arch, ov)[0]
    return attention_run(w.attention, arch, ov.sdpa_math(arch, w.precision.compute))


def warnings(
    w: AnalyticWorkload,
    arch: Arch | None,
    device: DeviceContext | None,
    stack: Stack | None = None,
) -> list[str]:
    if isinstance(w, GenericWorkload) or arch is None:
        return []
    if isinstance(w, EncoderWorkload):
        return []
    stack = stack or resolve_stack(None)
    out = shape_warnings(w, arch, stack)
    if isinstance(w, InferenceWorkload):
        out += size_warnings(w, arch)
    else:
        if w.sequence_length > arch.max_positions:
            out.append(
                f"sequence_length {w.sequence_length} exceeds the model's "
                f"max_position_embeddings {arch.max_positions}"
            )
        if stack.framework == "unsloth" and w.checkpointing == "full":
            out.append(
                "checkpointing: `full` keeps each layer's input on the device, as Unsloth's "
                'use_gradient_checkpointing=True does; use_gradient_checkpointing="unsloth" (its '
                "notebooks' setting) keeps them in host RAM: say `offloaded` for that"
            )
        if not isinstance(w.method, FullFineTune):
            if not any(st.adapter_params for st in statics_for(w, arch, stack)):
                # peft 0.17.1 tuners/tuners_utils.py BaseTuner.inject_adapter lines 632-651:
                # an error when no name matched, nothing when some did.
                out.append(
                    "no LoRA target module matches this model's projections: "
                    "adapters, gradients and optimizer state are 0 (PEFT refuses such a "
                    "config: 'Target modules ... not found in the base model')"
                )
            else:
                names = projection_names(arch)
                targets = lora_target_names(w.method.target_modules, arch)
                missing = [t for t in targets if t not in names]
                if missing:
                    out.append(
                        f"LoRA target module(s) {', '.join(missing)} match no projection of "
                        f"this model and get no adapter (its projections: "
                        f"{', '.join(sorted(names))}); PEFT ignores such a name when another "
                        "one matches"
                    )
            out += _lora_notes(w.method.target_modules, arch, stack)
            if w.method.modules_to_save:
                out += _saved_notes(w, arch, stack)
    return out


def _saved_notes(w: TrainingWorkload, arch: Arch, stack: Stack) -> list[str]:
    """What the answer assumes of PEFT's ``modules_to_save`` copies, and names that reach
    nothing it counts."""
    assert isinstance(w.method, LoRA)
    names = w.method.modules_to_save
    out = []
    groups = [
        *(g for layer, _ in arch.layer_runs for g in layer.tensors),
        *arch.embeddings,
        *arch.extras,
        *arch.head,
    ]
    tied = arch.kind == "decoder" and arch.tie_word_embeddings
    tied_head = tied_head_module(arch)
    if tied_head is not None:
        groups.append(tied_head)
    missing = [n for n in names if not any(saved_by(g, (n,)) for g in groups)]
    if missing:
        out.append(
            f"modules_to_save {', '.join(missing)} match no module counted here (its "
            "embeddings, LM head, norms and projections) and add nothing"
        )
    if stack.framework in ("torchtune", "litgpt"):
        out.append(
            f"modules_to_save is PEFT's option; {stack.framework} has none: the copies are "
            "counted as PEFT makes them"
        )
    saved_head = any(saved_by(g, names) for g in groups if g.role is Role.LM_HEAD)
    saved_embedding = any(saved_by(g, names) for g in arch.embeddings[:1])
    if (
        tied
        and saved_head
        and saved_embedding
        and w.parallelism.pipeline == 1
        and not w.method.ensure_weight_tying
    ):
        out.append(
            "the model ties its LM head to its embedding, and modules_to_save names both: PEFT "
            "trains a copy of each (two diverging copies); method.ensure_weight_tying (PEFT's "
            "ensure_weight_tying=True) shares one"
        )
    kbit = isinstance(w.method, QLoRA) and training_plan(w, stack).kbit_upcast
    if w.method.ensure_weight_tying:
        applied, shared = tied_saving(arch, names, True, w.parallelism.pipeline, stack.untied_head)
        if shared:
            out.append(
                "ensure_weight_tying: the LM head shares the embedding's copy; the trace tier's "
                "replay of PEFT's code on Qwen2.5 0.5B reads up to 11% above this estimate at "
                "short sequences (the shared copy's two gradients and the cache they leave are "
                "not all counted)"
            )
        elif tied and w.parallelism.pipeline > 1:
            out.append(
                "ensure_weight_tying with pipeline stages: the last stage's LM head is a copy "
                "of its own, not tied to the first stage's embedding; counted as untied"
            )
        elif not tied:
            out.append(
                "ensure_weight_tying: this model does not tie its LM head to its embedding, so "
                "nothing is shared (PEFT warns so too)"
            )
        elif not any(n in EMBEDDING_LAYER_NAMES for n in names):
            out.append(
                "ensure_weight_tying ties only when modules_to_save names embed_tokens or "
                "lm_head (PEFT's EMBEDDING_LAYER_NAMES); these names are copied untied"
            )
        names = applied
    reached = any(saved_by(g, names) for g in groups)
    if (
        reached
        and w.mixed_precision == "master_fp32"
        and not kbit
        and bytes_of(w.precision.weights) < 4
    ):
        out.append(
            "mixed_precision master_fp32: the modules_to_save copies get fp32 master weights "
            "and fp32 optimizer state, as DeepSpeed and FSDP mixed precision keep them; "
            "transformers' Trainer on a model loaded in 16-bit keeps neither (torch's AdamW "
            "state is zeros_like the parameter): say mixed_precision 'pure' for that"
        )
    return out


def shape_warnings(w: InferenceWorkload | TrainingWorkload, arch: Arch, stack: Stack) -> list[str]:
    """The warnings that come first and depend on the workload's model, precision and
    attention only (not its batch or tokens)."""
    out: list[str] = []
    attention = w.attention
    if attention_run(attention, arch) != attention:
        out.append(
            "attention: this model soft-caps its attention logits, which SDPA cannot do; "
            "transformers and LitGPT run it eagerly (the scores are materialized), and so "
            "does this budget: `flash` (flash-attn caps inside its kernel) avoids them"
        )
    q = effective_precision(w, stack).quantization
    if arch.moe is not None and isinstance(q, BitsAndBytes4bit) and not q.quantize_experts:
        out.append(_unquantized_experts(w, stack))
    return out


def size_warnings(w: InferenceWorkload, arch: Arch) -> list[str]:
    """An inference workload's warnings after :func:`shape_warnings`: what its tokens say."""
    out = []
    if arch.kind == "encoder" and w.generated_tokens:
        out.append("encoder models do not generate: generated_tokens is ignored")
    context = w.prompt_tokens + w.generated_tokens
    if arch.kind == "decoder" and context > arch.max_positions:
        out.append(
            f"context {context} exceeds the model's max_position_embeddings {arch.max_positions}"
        )
    return out


def _unquantized_experts(w: InferenceWorkload | TrainingWorkload, stack: Stack) -> str:
    """Why bitsandbytes 4-bit left a mixture of experts' routed experts unquantized, and in
    what dtype."""
    qlora = isinstance(w, TrainingWorkload) and isinstance(w.method, QLoRA)
    upcast = (
        isinstance(w, TrainingWorkload)
        and isinstance(w.method, QLoRA)
        and training_plan(w, stack).kbit_upcast
    )
    dtype = "fp32 (prepare_model_for_kbit_training casts them)" if upcast else w.precision.weights
    if getattr(w.precision.quantization, "quantize_experts", None) is False:
        return f"bitsandbytes 4-bit leaves the routed experts unquantized, as requested: {dtype}"
    override = "" if qlora else " (or precision.quantization.quantize_experts: true)"
    return (
        "bitsandbytes 4-bit leaves the routed experts unquantized here: transformers "
        f"{stack.transformers_version} keeps them as fused 3-D parameters and bitsandbytes "
        "replaces nn.Linear modules only (bitsandbytes-foundation/bitsandbytes#1849), so they "
        f"stay in {dtype}; under transformers < 5 (software.libraries.transformers){override} "
        "they are 4-bit"
    )


def _lora_notes(targets: tuple[str, ...], arch: Arch, stack: Stack) -> list[str]:
    """What LoRA's targets reach that the answer does not count, or do not reach that they
    name: routed experts under transformers >= 5 (:attr:`Stack.lora_reaches_experts`), the
    router and a vision tower under PEFT's ``all-linear``, which adapts every ``nn.Linear`` the
    modelling code builds, LM head excepted (peft 0.21.2 ``_maybe_include_all_linear_layers``)."""
    out = []
    experts = [g for layer, _ in arch.layer_runs for g in layer.tensors if g.role is Role.EXPERT]
    named = sorted({module_name(g) for g in experts if lora_targeted(g, targets)})
    if named and not stack.lora_reaches_experts:
        out.append(
            f"LoRA on the routed experts ({', '.join(named)}): transformers "
            f"{stack.transformers_version} keeps them as fused 3-D parameters "
            "(5.0 modeling_mixtral.py MixtralExperts; every MoE family of 5.23), which "
            "target_modules do not reach, so they get no adapter here (PEFT adapts them only "
            "through target_parameters, not modelled); under transformers < 5 "
            "(software.libraries.transformers) each expert is adapted"
        )
    if (
        ALL_LINEAR in targets
        and arch.moe is not None
        and stack.transformers_version is not None
        and stack.lora_reaches_experts
    ):
        out.append(
            "target_modules all-linear under transformers < 5 also adapts the router (an "
            "nn.Linear there, hidden x experts per layer), which is not counted"
        )
    if ALL_LINEAR in targets and any(g.role is Role.VISION for g in arch.extras):
        out.append(
            "target_modules all-linear on a multimodal checkpoint: PEFT also adapts the vision "
            "tower's and projector's linear layers, which are not counted here (list the "
            "language model's projections to adapt those only)"
        )
    return out


def summary(w: AnalyticWorkload, arch: Arch | None) -> WorkloadSummary:
    if isinstance(w, GenericWorkload):
        return WorkloadSummary(
            name=w.name or "generic", kind="generic", devices_per_instance=1, instances=w.instances
        )
    assert arch is not None
    return WorkloadSummary(
        name=w.name or model_name(w.model),
        kind=kind(w),  # type: ignore[arg-type]
        model_type=arch.model_type,
        num_params=arch.num_params,
        num_layers=arch.num_layers,
        devices_per_instance=w.parallelism.devices,
        instances=w.instances,
        format=deployed_format(w),
        model=model_origin(w.model),
    )
