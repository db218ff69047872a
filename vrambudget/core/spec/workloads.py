"""The model workloads (inference, training) and generic ones."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from . import rules
from .limits import MAX_TOKENS, Batch, Bytes, Name, Tokens, TokensOrZero, Wire
from .model import ModelSource
from .parallelism import Parallelism
from .precision import BitsAndBytes4bit, Precision

__all__ = [
    "SGD",
    "Adafactor",
    "AdamW",
    "AdamW8bit",
    "AdapterDType",
    "Attention",
    "CacheItem",
    "FullFineTune",
    "GenericWorkload",
    "Implementation",
    "InferenceWorkload",
    "LoRA",
    "LoRATarget",
    "Method",
    "Optimizer",
    "QLoRA",
    "SizedItem",
    "TrainingWorkload",
]


Attention = Annotated[
    Literal["sdpa", "flash", "eager"],
    Meta(
        description="`eager` materializes the attention scores (s^2 per head); `flash` and "
        "`sdpa` (memory-efficient kernels) keep O(s) state."
    ),
]


AdapterDType = Literal["fp32", "bf16", "fp16"]
"""A LoRA adapter's dtype."""


class _ModelWorkload(Wire, frozen=True, kw_only=True):
    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the model's name.")
    ] = None
    model: Annotated[
        ModelSource,
        Meta(description="The model: a preset id, an inline `config.json`, or its dimensions."),
    ]
    precision: Annotated[
        Precision, Meta(description="Dtypes of weights, compute and KV cache; quantization.")
    ] = Precision()
    parallelism: Annotated[
        Parallelism, Meta(description="Layout across devices; default: a single device.")
    ] = Parallelism()
    instances: Annotated[
        int,
        Meta(
            ge=1,
            le=256,
            description="Identical co-located instances (each its own process and CUDA context).",
        ),
    ] = 1


class InferenceWorkload(
    _ModelWorkload, tag="inference", tag_field="kind", frozen=True, kw_only=True
):
    """Autoregressive generation (or an encoder forward pass)."""

    batch_size: Annotated[Batch, Meta(description="Sequences per request.")] = 1
    prompt_tokens: Annotated[Tokens, Meta(description="Prompt length per sequence, tokens.")] = 1024
    generated_tokens: Annotated[
        TokensOrZero,
        Meta(
            description="Tokens generated per sequence (the KV cache holds "
            "prompt + generated); 0: prefill only."
        ),
    ] = 256
    concurrent_requests: Annotated[Batch, Meta(description="Requests in flight at once.")] = 1
    attention: Attention = "sdpa"
    logits: Annotated[
        Literal["last", "all"], Meta(description="Keep logits for the last position or all.")
    ] = "last"
    prefill_chunk_tokens: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None,
        Meta(
            description="Chunked prefill: tokens per forward pass "
            "(default: whole prompts of all sequences at once)."
        ),
    ] = None

    @property
    def num_sequences(self) -> int:
        return self.batch_size * self.concurrent_requests

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens


Implementation = Annotated[
    Literal["fused", "foreach", "for_loop"],
    Meta(
        description="torch.optim implementation of the step: `fused` (one kernel, no "
        "temporaries), `foreach` (the default on CUDA: multi-tensor ops with "
        "parameter-sized temporaries), `for_loop` (one parameter at a time)."
    ),
]


class AdamW(Wire, tag="adamw", tag_field="name", frozen=True, kw_only=True):
    """Adam/AdamW: two moments per trainable parameter."""

    implementation: Implementation = "foreach"


class AdamW8bit(Wire, tag="adamw_8bit", tag_field="name", frozen=True, kw_only=True):
    """bitsandbytes 8-bit AdamW: blockwise-quantized uint8 moments."""


class SGD(Wire, tag="sgd", tag_field="name", frozen=True, kw_only=True):
    momentum: Annotated[
        float,
        Meta(
            ge=0.0,
            le=1.0,
            description="Momentum factor; > 0 keeps one momentum buffer "
            "per trainable parameter, 0 keeps no state.",
        ),
    ] = 0.9
    implementation: Implementation = "foreach"


class Adafactor(Wire, tag="adafactor", tag_field="name", frozen=True, kw_only=True):
    """Adafactor (Shazeer & Stern 2018): factored second moment for matrices."""

    beta1: Annotated[float | None, Meta(description="First moment when set (default none).")] = None
    implementation: Annotated[
        Literal["foreach", "for_loop"],
        Meta(description="torch.optim.Adafactor implementation (it has no fused kernel)."),
    ] = "foreach"


Optimizer = AdamW | AdamW8bit | SGD | Adafactor


class FullFineTune(Wire, tag="full", tag_field="kind", frozen=True, kw_only=True):
    """Every parameter is trainable."""


LoRATarget = Annotated[
    str,
    Meta(
        pattern=r"^(all-linear|[A-Za-z_][A-Za-z0-9_]{0,63})$",
        description="A module name as the model's modelling code calls it, matched against "
        "the last component of each linear layer's name (PEFT's rule): `q_proj`, `k_proj`, "
        "`v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj` (Llama-style), `qkv_proj`, "
        "`gate_up_proj` (Phi-3), `query_key_value`, `dense` (GPT-NeoX, Falcon), `c_attn`, "
        "`c_proj`, `c_fc` (GPT-2), `query`, `key`, `value` (BERT), `fc1`, `fc2` ...; or, "
        'alone, `all-linear` (PEFT\'s `target_modules="all-linear"`): every projection of '
        "the layers, the LM head excluded.",
    ),
]
"""A LoRA target: any module name (models built by the framework have their own names)."""

ModuleName = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$",
        description="A module's own name as the model's modelling code calls it (`embed_tokens`, "
        "`lm_head`, `wte`, `norm`, `input_layernorm`, `q_proj` ...), matched against the end of "
        "each module's name as PEFT's modules_to_save does (`norm` reaches every `*_layernorm` "
        "too); a dotted path to one module (`model.layers.0.mlp`) is not taken.",
    ),
]
"""A module PEFT trains whole (``modules_to_save``)."""


class LoRA(Wire, tag="lora", tag_field="kind", frozen=True, kw_only=True):
    """Frozen base, low-rank adapters (Hu et al. 2021) on the named projections."""

    rank: Annotated[
        int,
        Meta(
            ge=1,
            le=1 << 16,
            description="Adapter rank r: A (r x in) and B (out x r) per targeted projection.",
        ),
    ] = 16
    target_modules: Annotated[
        tuple[LoRATarget, ...],
        Meta(min_length=1, max_length=64, description="Projections that get adapters."),
    ] = ("q_proj", "k_proj", "v_proj", "o_proj")
    adapter_dtype: Annotated[
        AdapterDType | None,
        Meta(
            description="The adapters' dtype (and their gradients' and optimizer state's). "
            "Null: as the stack's PEFT leaves them (`software.libraries.peft`, default the "
            "current release): fp32 before 0.7 (never cast) and from 0.12 "
            "(`autocast_adapter_dtype`), the base weights' dtype where it is 16-bit in 0.7 - "
            "0.11; fp32 over a quantized base and under LitGPT's and torchtune's own LoRA. The "
            "answer's `stack.behaviours` says which."
        ),
    ] = None
    modules_to_save: Annotated[
        tuple[ModuleName, ...],
        Meta(
            max_length=64,
            description="PEFT's `modules_to_save`: modules trained whole beside the adapters "
            "(`embed_tokens` and `lm_head` to learn new tokens, a norm, a projection). PEFT "
            "wraps each in a ModulesToSaveWrapper that keeps the frozen original and a "
            "trainable deep copy, so each adds its own bytes, gradients and optimizer state "
            "in the original's dtype. A name may not also be a LoRA target.",
        ),
    ] = ()
    ensure_weight_tying: Annotated[
        bool,
        Meta(
            description="PEFT's `ensure_weight_tying`: on a model that ties its LM head to its "
            "embedding, with the embedding in modules_to_save, the head shares the "
            "embedding's trainable copy (one copy); false (PEFT's default): naming both trains "
            "two diverging copies.",
        ),
    ] = False
    dropout: Annotated[
        float,
        Meta(
            ge=0.0,
            lt=1.0,
            description="`lora_dropout`: above 0, each adapted projection's input is dropped "
            "out into a new tensor saved for lora_A's backward, with a 1-byte mask (PEFT and "
            "LitGPT apply it per adapter). Default 0, PEFT's default (LitGPT's is 0.05).",
        ),
    ] = 0.0


class QLoRA(LoRA, tag="qlora", tag_field="kind", frozen=True, kw_only=True):
    """LoRA on a base quantized to 4-bit with bitsandbytes (Dettmers et al. 2023): NF4 with
    double quantization by default."""

    quant_type: Annotated[
        Literal["nf4", "fp4"],
        Meta(description="4-bit code of the frozen base; both store the same bytes."),
    ] = "nf4"
    block_size: Annotated[
        Literal[32, 64, 128, 256, 512, 1024, 2048, 4096],
        Meta(description="Elements per absmax block of the base weights."),
    ] = 64
    double_quant: Annotated[
        bool,
        Meta(
            description="Quantize the absmax values to uint8 (nested blocks of 256 with "
            "fp32 scales); false: fp32 absmax."
        ),
    ] = True

    @property
    def base_quantization(self) -> BitsAndBytes4bit:
        return BitsAndBytes4bit(
            quant_type=self.quant_type, block_size=self.block_size, double_quant=self.double_quant
        )


Method = FullFineTune | LoRA | QLoRA


class TrainingWorkload(_ModelWorkload, tag="training", tag_field="kind", frozen=True, kw_only=True):
    """One optimizer step: forward, backward and update, per micro-batch."""

    micro_batch_size: Annotated[
        Batch, Meta(description="Sequences per micro-batch (per data-parallel replica).")
    ] = 1
    sequence_length: Annotated[Tokens, Meta(description="Tokens per training sequence.")] = 2048
    gradient_accumulation_steps: Annotated[
        int,
        Meta(
            ge=1,
            le=1 << 20,
            description="Micro-batches per optimizer step; > 1 keeps "
            "the gradients live between them, and bounds the micro-batches a pipeline "
            "stage holds.",
        ),
    ] = 1
    optimizer: Annotated[
        Optimizer, Meta(description="Optimizer; it sets the optimizer-state bytes.")
    ] = AdamW()
    mixed_precision: Annotated[
        Literal["master_fp32", "autocast", "pure"],
        Meta(
            description="`master_fp32`: low-precision params and grads, fp32 master weights "
            "and optimizer states (Megatron/DeepSpeed). `autocast`: fp32 params, grads and "
            "states, low-precision compute (torch.autocast). `pure`: everything in the "
            "weight dtype."
        ),
    ] = "master_fp32"
    checkpointing: Annotated[
        Literal["none", "selective", "full", "offloaded"],
        Meta(
            description="Activation recomputation (Korthikanti et al. 2022): `selective` "
            "recomputes the attention core, `full` every layer from its kept input, "
            "`offloaded` the same with each layer's input kept in host RAM instead of on the "
            'device (Unsloth\'s `use_gradient_checkpointing="unsloth"`, as its notebooks set '
            "it; torchtune's `enable_activation_offloading` with activation checkpointing)."
        ),
    ] = "none"
    method: Annotated[
        Method, Meta(description="What is trained: every parameter, or LoRA/QLoRA adapters.")
    ] = FullFineTune()
    attention: Attention = "sdpa"
    dropout: Annotated[bool, Meta(description="Dropout layers keep 1-byte masks.")] = False

    def __post_init__(self) -> None:
        rules.check(self)


class SizedItem(Wire, frozen=True, kw_only=True):
    name: Annotated[Name, Meta(description="Label of the item in the answer's breakdown.")]
    bytes: Annotated[Bytes, Meta(description="Device memory of the item, bytes.")]


class CacheItem(Wire, frozen=True, kw_only=True):
    name: Annotated[Name, Meta(description="Label of the cache in the answer's breakdown.")]
    bytes_per_unit: Annotated[Bytes, Meta(description="Bytes per cached unit.")]
    units: Annotated[
        int,
        Meta(
            ge=0,
            le=1 << 40,
            description="Units held; the cache takes bytes_per_unit x units bytes.",
        ),
    ]


class GenericWorkload(Wire, tag="generic", tag_field="kind", frozen=True, kw_only=True):
    """Any other GPU workload (rendering, image processing, an unsupported model), described by
    its memory: persistent assets, working memory per item x batch, caches and workspaces."""

    name: Annotated[Name | None, Meta(description="Label in the answer; default: `generic`.")] = (
        None
    )
    assets: Annotated[
        tuple[SizedItem, ...],
        Meta(
            description="Persistent buffers (models, textures), counted once per instance; "
            "reported as weights."
        ),
    ] = ()
    per_item: Annotated[
        tuple[SizedItem, ...],
        Meta(
            description="Working memory of one item, multiplied by batch_size; reported as "
            "activations."
        ),
    ] = ()
    batch_size: Annotated[
        Batch, Meta(description="Items processed at once (multiplies per_item).")
    ] = 1
    caches: Annotated[
        tuple[CacheItem, ...],
        Meta(description="Caches of bytes_per_unit x units; reported as KV cache."),
    ] = ()
    workspaces: Annotated[
        tuple[SizedItem, ...], Meta(description="Scratch buffers; reported as runtime workspace.")
    ] = ()
    uses_cuda_context: Annotated[
        bool, Meta(description="Counts a CUDA context for the process.")
    ] = True
    instances: Annotated[
        int,
        Meta(
            ge=1,
            le=256,
            description="Identical co-located instances; every component is multiplied by it.",
        ),
    ] = 1
