"""The workload: what a caller asks about. Wire types (msgspec Structs) with their constraints.

Checks between fields that JSON Schema can state run in ``__post_init__`` (so they fail while
decoding, with the field's path) and are published in the schema too (``SCHEMA_RULES``): a
schema-valid request never fails validation. Checks that depend on the model (a tensor-parallel
degree that must divide its heads) are semantic: ``InvalidWorkload``, a documented 422 of type
``invalid-workload``.

Every object but an inline ``config.json`` forbids unknown fields (a misspelt ``batch_szie`` must
not be silently ignored by a tool whose answer decides a purchase); the published JSON schema
says ``additionalProperties: false`` for each of them. Cross-field checks run in
``__post_init__`` so that they fail while decoding, with the field's path.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .catalog import GPUId, ModelId
from .dtypes import ComputeDType, KVCacheDType, WeightDType
from .hf_config import HFConfig
from .serving.calibration import DEFAULT_ENGINE_VERSION, ENGINE_VERSIONS

__all__ = [
    "AWQ",
    "FP8",
    "GPTQ",
    "SGD",
    "Adafactor",
    "AdamW",
    "AdamW8bit",
    "BitsAndBytes4bit",
    "BudgetRequest",
    "CatalogDevice",
    "CustomDevice",
    "DeviceRef",
    "DimensionsModel",
    "FullFineTune",
    "GenericWorkload",
    "HFConfigModel",
    "Headroom",
    "InferenceWorkload",
    "Int8",
    "LLMServingWorkload",
    "LoRA",
    "MoESpec",
    "ModelSource",
    "Parallelism",
    "Precision",
    "PresetModel",
    "QLoRA",
    "Quantization",
    "ServingParallelism",
    "ServingQuantization",
    "SizedItem",
    "Software",
    "TraceOptions",
    "TrainingWorkload",
    "Workload",
]

# Limits: generous enough for any real workload, small enough that an absurd request is refused
# with the range instead of computed for minutes.
MAX_TOKENS = 1 << 40
Tokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS, description="Tokens (1 .. 2^40).")]
TokensOrZero = Annotated[int, Meta(ge=0, le=MAX_TOKENS, description="Tokens (0 .. 2^40).")]
Batch = Annotated[int, Meta(ge=1, le=1 << 24, description="A batch or request count (1 .. 2^24).")]
Degree = Annotated[int, Meta(ge=1, le=1 << 16, description="A parallel degree (1 .. 65536).")]
Bytes = Annotated[int, Meta(ge=0, le=1 << 62, description="Bytes (0 .. 2^62).")]
Fraction = Annotated[float, Meta(ge=0.0, le=0.9, description="A fraction (0 .. 0.9).")]
Name = Annotated[str, Meta(min_length=1, max_length=128)]
Dim = Annotated[int, Meta(ge=1, le=1 << 24, description="A model dimension (1 .. 2^24).")]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


# ------------------------------------------------------------------------------------ model --


class PresetModel(_Wire, tag="preset", tag_field="source", kw_only=True):
    """A model from the preset catalog (``GET /v1/models``)."""

    id: Annotated[ModelId, Meta(description="Preset id, e.g. `llama-3.1-8b`.")]


class HFConfigModel(_Wire, tag="hf_config", tag_field="source", kw_only=True):
    """An inline Hugging Face ``config.json``, pasted as published."""

    config: Annotated[HFConfig, Meta(description="The model's `config.json` as published.")]
    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the config's model_type.")
    ] = None


class MoESpec(_Wire, kw_only=True):
    """Mixture-of-experts MLPs."""

    num_experts: Annotated[int, Meta(ge=1, le=1 << 16, description="Routed experts per layer.")]
    experts_per_token: Annotated[int, Meta(ge=1, le=1 << 16, description="Top-k routing.")]
    expert_intermediate_size: Annotated[
        Dim, Meta(description="MLP width of each routed expert (gated, 3 matrices), elements.")
    ]
    shared_intermediate_size: Annotated[
        int, Meta(ge=0, le=1 << 24, description="Total width of always-on shared experts.")
    ] = 0
    num_dense_layers: Annotated[
        int, Meta(ge=0, le=1_000_000, description="Leading layers with a dense MLP instead.")
    ] = 0



class DimensionsModel(_Wire, tag="dimensions", tag_field="source", kw_only=True):
    """A transformer given by its dimensions (for a model with no preset or config)."""

    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: `custom`.")
    ] = None
    kind: Annotated[
        Literal["decoder", "encoder"],
        Meta(description="`decoder`: generates tokens, has an LM head and a KV cache; "
             "`encoder`: one forward pass, no LM head."),
    ] = "decoder"
    hidden_size: Annotated[Dim, Meta(description="Model width (d_model), elements.")]
    num_layers: Annotated[int, Meta(ge=1, le=1_000_000, description="Layers (1 .. 10^6).")]
    num_attention_heads: Annotated[Dim, Meta(description="Query heads per layer.")]
    num_key_value_heads: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 24)] | None,
        Meta(description="KV heads (GQA/MQA); must divide the query heads. Default (null): "
             "as many as query heads."),
    ] = None
    head_dim: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 24)] | None,
        Meta(description="Width of one attention head, elements. Default (null): "
             "hidden_size / num_attention_heads."),
    ] = None
    intermediate_size: Annotated[
        Dim, Meta(description="Width of the dense MLP, elements (also the dense layers of a "
                  "MoE model).")
    ]
    vocab_size: Annotated[int, Meta(ge=1, le=1 << 26, description="Vocabulary (1 .. 2^26).")]
    max_position_embeddings: Annotated[
        int, Meta(ge=1, le=MAX_TOKENS, description="Longest context the model supports, tokens: "
                  "longer requests warn, fits stop there; rows of a learned position table. "
                  "Default: 2^40 (no limit).")
    ] = 1 << 40
    mlp: Annotated[
        Literal["gated", "dense"],
        Meta(description="`gated`: SwiGLU/GeGLU, 3 matrices; `dense`: GELU, 2 matrices."),
    ] = "gated"
    norm: Annotated[
        Literal["rmsnorm", "layernorm"],
        Meta(description="`rmsnorm`: a weight per norm; `layernorm`: a weight and a bias."),
    ] = "rmsnorm"
    tie_word_embeddings: Annotated[
        bool, Meta(description="The LM head shares the token embedding (no separate lm_head).")
    ] = False
    attention_bias: Annotated[
        bool, Meta(description="q/k/v/o projections have biases.")
    ] = False
    mlp_bias: Annotated[bool, Meta(description="MLP projections have biases.")] = False
    learned_position_embeddings: Annotated[
        bool, Meta(description="A learned position table (GPT-2/BERT style).")
    ] = False
    sliding_window: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None,
        Meta(description="Window of the sliding-window layers, tokens (their KV cache holds at "
             "most this many). Required with num_sliding_window_layers; default: none."),
    ] = None
    num_sliding_window_layers: Annotated[
        int, Meta(ge=0, le=1_000_000, description="How many layers use the sliding window "
                  "(the last ones); 0: none.")
    ] = 0
    moe: Annotated[
        MoESpec | None, Meta(description="Mixture-of-experts MLPs; default (null): dense MLPs.")
    ] = None


ModelSource = PresetModel | HFConfigModel | DimensionsModel

# ----------------------------------------------------------------------------- quantization --


class _QuantBase(_Wire, kw_only=True):
    quantize_embeddings: Annotated[
        bool, Meta(description="Quantize the token embedding too (most schemes keep it).")
    ] = False
    quantize_lm_head: Annotated[
        bool, Meta(description="Quantize the LM head too (most schemes keep it).")
    ] = False


class Int8(_QuantBase, tag="int8", tag_field="scheme", kw_only=True):
    """8-bit integer weights with one scale per output channel (bitsandbytes LLM.int8 keeps an
    fp32 ``SCB`` per row; w8a16 checkpoints keep fp16/bf16 scales)."""

    scale_dtype: Annotated[
        Literal["fp32", "fp16", "bf16"],
        Meta(description="Dtype of the per-output-channel scales (4 or 2 bytes per row)."),
    ] = "fp32"


class FP8(_QuantBase, tag="fp8", tag_field="scheme", kw_only=True):
    """fp8 (e4m3) weights with fp32 scales per tensor, per output channel, or per 2-D block
    (DeepSeek-V3's 128x128 ``weight_scale_inv``)."""

    granularity: Annotated[
        Literal["tensor", "channel", "block"],
        Meta(description="One fp32 scale per tensor, per output channel, or per "
             "block_size x block_size block."),
    ] = "tensor"
    block_size: Annotated[
        int, Meta(ge=1, le=1 << 16, description="Side of a square scale block, elements (only "
                  "with granularity `block`).")
    ] = 128


class GPTQ(_QuantBase, tag="gptq", tag_field="scheme", kw_only=True):
    """GPTQ packed integers: ``qweight`` int32 (in*bits/32, out), ``qzeros`` int32
    (groups, out*bits/32), ``scales`` fp16 (groups, out), ``g_idx`` int32 (in,)."""

    bits: Annotated[Literal[2, 3, 4, 8], Meta(description="Bits per weight.")] = 4
    group_size: Annotated[
        int, Meta(ge=-1, le=1 << 16, description="Input features per group; -1: one group.")
    ] = 128

    def __post_init__(self) -> None:
        if self.group_size == 0:
            raise ValueError("group_size must be -1 or >= 1")


class AWQ(_QuantBase, tag="awq", tag_field="scheme", kw_only=True):
    """AWQ GEMM layout: ``qweight`` int32 (in, out*bits/32), ``qzeros`` int32
    (groups, out*bits/32), ``scales`` fp16 (groups, out)."""

    bits: Annotated[Literal[4], Meta(description="Bits per weight (AWQ GEMM: 4 only).")] = 4
    group_size: Annotated[
        int, Meta(ge=-1, le=1 << 16, description="Input features per group (one zero and one "
                  "scale per group and output feature); -1: one group.")
    ] = 128

    def __post_init__(self) -> None:
        if self.group_size == 0:
            raise ValueError("group_size must be -1 or >= 1")


class BitsAndBytes4bit(_QuantBase, tag="bnb_4bit", tag_field="scheme", kw_only=True):
    """bitsandbytes NF4/FP4: two values per byte, an fp32 absmax per block; with double
    quantization the absmax is itself quantized to uint8 with fp32 second-level scales."""

    quant_type: Annotated[
        Literal["nf4", "fp4"],
        Meta(description="4-bit code; both store the same bytes."),
    ] = "nf4"
    block_size: Annotated[
        Literal[32, 64, 128, 256, 512, 1024, 2048, 4096],
        Meta(description="Elements per absmax block."),
    ] = 64
    double_quant: Annotated[
        bool, Meta(description="Quantize the absmax values to uint8 (nested blocks of 256 with "
                   "fp32 scales) instead of keeping them fp32.")
    ] = False


Quantization = Int8 | FP8 | GPTQ | AWQ | BitsAndBytes4bit


class Precision(_Wire, kw_only=True):
    weights: Annotated[
        WeightDType,
        Meta(description="Storage dtype of unquantized weights. `fp8` stores the linear layers "
             "in fp8 with per-tensor scales (as `quantization: {scheme: fp8}`)."),
    ] = "bf16"
    compute: Annotated[ComputeDType, Meta(description="Activation/compute dtype.")] = "bf16"
    kv_cache: Annotated[KVCacheDType, Meta(description="`auto`: the compute dtype.")] = "auto"
    quantization: Annotated[
        Quantization | None,
        Meta(description="Quantization of the linear layers (and expert MLPs); default (null): "
             "none, all weights stored in `weights`."),
    ] = None

    def __post_init__(self) -> None:
        if self.weights == "fp8" and self.quantization is not None:
            raise ValueError("weights 'fp8' already implies fp8 quantization; "
                             "set weights to the dtype of the unquantized layers instead")


# ------------------------------------------------------------------------------ parallelism --


class Parallelism(_Wire, kw_only=True):
    """How the workload is laid out across devices. GPUs never pool memory: budgets are per
    device."""

    tensor: Annotated[
        Degree, Meta(description="Tensor-parallel degree: devices each layer is split over.")
    ] = 1
    sequence_parallel: Annotated[
        bool, Meta(description="Megatron sequence parallelism (training activations / tensor).")
    ] = False
    pipeline: Annotated[
        Degree, Meta(description="Pipeline-parallel degree: stages the layers are cut into.")
    ] = 1
    pipeline_schedule: Annotated[
        Literal["1f1b", "gpipe", "interleaved_1f1b"],
        Meta(description="Training schedule, which sets the micro-batches whose activations a "
             "stage holds: `gpipe` all of them, `1f1b` up to the stages after it, "
             "`interleaved_1f1b` as 1f1b plus the interleaving overhead."),
    ] = "1f1b"
    virtual_stages: Annotated[
        int, Meta(ge=1, le=1024, description="Model chunks per device (interleaved 1F1B).")
    ] = 1
    expert: Annotated[
        int, Meta(ge=1, le=1 << 16, description="Expert parallelism: routed experts sharded.")
    ] = 1
    data: Annotated[
        Degree, Meta(description="Data-parallel degree: model replicas (ZeRO shards over them).")
    ] = 1
    zero_stage: Annotated[
        Literal[0, 1, 2, 3],
        Meta(description="ZeRO stage over the data-parallel group (FSDP FULL_SHARD = 3, "
             "SHARD_GRAD_OP = 2)."),
    ] = 0
    offload_optimizer: Annotated[
        bool, Meta(description="Optimizer states and master weights in host RAM (ZeRO-Offload).")
    ] = False
    offload_parameters: Annotated[
        bool, Meta(description="Parameters in host RAM (ZeRO-Infinity; needs zero_stage 3).")
    ] = False

    def __post_init__(self) -> None:
        if self.offload_parameters and self.zero_stage != 3:
            raise ValueError("offload_parameters needs zero_stage 3")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage >= 1 (ZeRO-Offload)")
        if self.virtual_stages > 1 and self.pipeline_schedule != "interleaved_1f1b":
            raise ValueError("virtual_stages > 1 needs pipeline_schedule 'interleaved_1f1b'")

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data


# -------------------------------------------------------------------------------- workloads --

Attention = Annotated[
    Literal["sdpa", "flash", "eager"],
    Meta(description="`eager` materializes the attention scores (s^2 per head); `flash` and "
         "`sdpa` (memory-efficient kernels) keep O(s) state."),
]


class _ModelWorkload(_Wire, kw_only=True):
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
        int, Meta(ge=1, le=256, description="Identical co-located instances (each its own "
                  "process and CUDA context).")
    ] = 1


class InferenceWorkload(_ModelWorkload, tag="inference", tag_field="kind", kw_only=True):
    """Autoregressive generation (or an encoder forward pass)."""

    batch_size: Annotated[Batch, Meta(description="Sequences per request.")] = 1
    prompt_tokens: Annotated[Tokens, Meta(description="Prompt length per sequence, tokens.")] = (
        1024)
    generated_tokens: Annotated[
        TokensOrZero, Meta(description="Tokens generated per sequence (the KV cache holds "
                           "prompt + generated); 0: prefill only.")
    ] = 256
    concurrent_requests: Annotated[Batch, Meta(description="Requests in flight at once.")] = 1
    attention: Attention = "sdpa"
    logits: Annotated[
        Literal["last", "all"], Meta(description="Keep logits for the last position or all.")
    ] = "last"
    prefill_chunk_tokens: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None,
        Meta(description="Chunked prefill: tokens per forward pass "
             "(default: whole prompts of all sequences at once)."),
    ] = None

    @property
    def num_sequences(self) -> int:
        return self.batch_size * self.concurrent_requests

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens


Implementation = Annotated[
    Literal["fused", "foreach", "for_loop"],
    Meta(description="torch.optim implementation of the step: `fused` (one kernel, no "
         "temporaries), `foreach` (the default on CUDA: multi-tensor ops with "
         "parameter-sized temporaries), `for_loop` (one parameter at a time)."),
]


class AdamW(_Wire, tag="adamw", tag_field="name", kw_only=True):
    """Adam/AdamW: two moments per trainable parameter."""

    implementation: Implementation = "foreach"


class AdamW8bit(_Wire, tag="adamw_8bit", tag_field="name", kw_only=True):
    """bitsandbytes 8-bit AdamW: blockwise-quantized uint8 moments."""


class SGD(_Wire, tag="sgd", tag_field="name", kw_only=True):
    momentum: Annotated[
        float, Meta(ge=0.0, le=1.0, description="Momentum factor; > 0 keeps one momentum buffer "
                    "per trainable parameter, 0 keeps no state.")
    ] = 0.9
    implementation: Implementation = "foreach"


class Adafactor(_Wire, tag="adafactor", tag_field="name", kw_only=True):
    """Adafactor (Shazeer & Stern 2018): factored second moment for matrices."""

    beta1: Annotated[float | None, Meta(description="First moment when set (default none).")] = (
        None
    )
    implementation: Annotated[
        Literal["foreach", "for_loop"],
        Meta(description="torch.optim.Adafactor implementation (it has no fused kernel)."),
    ] = "foreach"


Optimizer = AdamW | AdamW8bit | SGD | Adafactor


class FullFineTune(_Wire, tag="full", tag_field="kind", kw_only=True):
    """Every parameter is trainable."""


# Projection names as the families' modelling code calls them (Llama-style, MLA, GPT-2, BERT,
# explicit-dimension dense MLPs).
LoRATarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
                     "c_attn", "c_proj", "c_fc", "query", "key", "value", "dense", "fc1", "fc2"]


class LoRA(_Wire, tag="lora", tag_field="kind", kw_only=True):
    """Frozen base, low-rank adapters (Hu et al. 2021) on the named projections."""

    rank: Annotated[
        int, Meta(ge=1, le=1 << 16, description="Adapter rank r: A (r x in) and B (out x r) per "
                  "targeted projection.")
    ] = 16
    target_modules: Annotated[
        tuple[LoRATarget, ...], Meta(min_length=1, description="Projections that get adapters.")
    ] = ("q_proj", "k_proj", "v_proj", "o_proj")
    adapter_dtype: Annotated[
        Literal["fp32", "bf16", "fp16"],
        Meta(description="PEFT keeps adapters in fp32 by default (autocast_adapter_dtype)."),
    ] = "fp32"


class QLoRA(LoRA, tag="qlora", tag_field="kind", kw_only=True):
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
        bool, Meta(description="Quantize the absmax values to uint8 (nested blocks of 256 with "
                   "fp32 scales); false: fp32 absmax.")
    ] = True

    @property
    def base_quantization(self) -> BitsAndBytes4bit:
        return BitsAndBytes4bit(quant_type=self.quant_type, block_size=self.block_size,
                                double_quant=self.double_quant)


Method = FullFineTune | LoRA | QLoRA


class TrainingWorkload(_ModelWorkload, tag="training", tag_field="kind", kw_only=True):
    """One optimizer step: forward, backward and update, per micro-batch."""

    micro_batch_size: Annotated[
        Batch, Meta(description="Sequences per micro-batch (per data-parallel replica).")
    ] = 1
    sequence_length: Annotated[Tokens, Meta(description="Tokens per training sequence.")] = 2048
    gradient_accumulation_steps: Annotated[
        int, Meta(ge=1, le=1 << 20, description="Micro-batches per optimizer step; > 1 keeps "
                  "the gradients live between them, and bounds the micro-batches a pipeline "
                  "stage holds.")
    ] = 1
    optimizer: Annotated[
        Optimizer, Meta(description="Optimizer; it sets the optimizer-state bytes.")
    ] = AdamW()
    mixed_precision: Annotated[
        Literal["master_fp32", "autocast", "pure"],
        Meta(description="`master_fp32`: low-precision params and grads, fp32 master weights "
             "and optimizer states (Megatron/DeepSpeed). `autocast`: fp32 params, grads and "
             "states, low-precision compute (torch.autocast). `pure`: everything in the "
             "weight dtype."),
    ] = "master_fp32"
    checkpointing: Annotated[
        Literal["none", "selective", "full"],
        Meta(description="Activation recomputation (Korthikanti et al. 2022)."),
    ] = "none"
    method: Annotated[
        Method, Meta(description="What is trained: every parameter, or LoRA/QLoRA adapters.")
    ] = FullFineTune()
    attention: Attention = "flash"
    dropout: Annotated[bool, Meta(description="Dropout layers keep 1-byte masks.")] = False

    def __post_init__(self) -> None:
        if self.mixed_precision == "autocast" and self.precision.weights != "fp32":
            raise ValueError("mixed_precision 'autocast' keeps fp32 parameters: set "
                             "precision.weights to 'fp32'")
        if isinstance(self.method, QLoRA) and self.precision.quantization is not None:
            raise ValueError("QLoRA sets the base quantization itself (method.quant_type, ...);"
                             " leave precision.quantization empty")


class SizedItem(_Wire, kw_only=True):
    name: Annotated[Name, Meta(description="Label of the item in the answer's breakdown.")]
    bytes: Annotated[Bytes, Meta(description="Device memory of the item, bytes.")]


class CacheItem(_Wire, kw_only=True):
    name: Annotated[Name, Meta(description="Label of the cache in the answer's breakdown.")]
    bytes_per_unit: Annotated[Bytes, Meta(description="Bytes per cached unit.")]
    units: Annotated[
        int, Meta(ge=0, le=1 << 40, description="Units held; the cache takes "
                  "bytes_per_unit x units bytes.")
    ]


class GenericWorkload(_Wire, tag="generic", tag_field="kind", kw_only=True):
    """Any other GPU workload (rendering, image processing, an unsupported model), described by
    its memory: persistent assets, working memory per item x batch, caches and workspaces."""

    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: `generic`.")
    ] = None
    assets: Annotated[
        tuple[SizedItem, ...],
        Meta(description="Persistent buffers (models, textures), counted once per instance; "
             "reported as weights."),
    ] = ()
    per_item: Annotated[
        tuple[SizedItem, ...],
        Meta(description="Working memory of one item, multiplied by batch_size; reported as "
             "activations."),
    ] = ()
    batch_size: Annotated[
        Batch, Meta(description="Items processed at once (multiplies per_item).")
    ] = 1
    caches: Annotated[
        tuple[CacheItem, ...], Meta(description="Caches of bytes_per_unit x units; reported as "
                                    "KV cache.")
    ] = ()
    workspaces: Annotated[
        tuple[SizedItem, ...], Meta(description="Scratch buffers; reported as runtime workspace.")
    ] = ()
    uses_cuda_context: Annotated[
        bool, Meta(description="Counts a CUDA context for the process.")
    ] = True
    instances: Annotated[
        int, Meta(ge=1, le=256, description="Identical co-located instances; every component "
                  "is multiplied by it.")
    ] = 1


# ------------------------------------------------------------------------- serving engine --

EngineVersion = Literal[ENGINE_VERSIONS]  # type: ignore[valid-type]


class ServingParallelism(_Wire, kw_only=True):
    """vLLM's ``--tensor-parallel-size``, ``--pipeline-parallel-size``,
    ``--data-parallel-size`` and ``--enable-expert-parallel``."""

    tensor: Annotated[
        Degree, Meta(description="Tensor-parallel size: GPUs each layer is split over.")
    ] = 1
    pipeline: Annotated[
        Degree, Meta(description="Pipeline-parallel size: stages the layers are cut into "
                     "(vLLM get_pp_indices).")
    ] = 1
    data: Annotated[
        Degree, Meta(description="Data-parallel size: independent engine replicas (each with "
                     "its own KV cache); budgets are per GPU of one replica.")
    ] = 1
    enable_expert_parallel: Annotated[
        bool, Meta(description="MoE experts sharded over tensor x data ranks instead of each "
                   "expert split by tensor parallelism.")
    ] = False

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data


class ServingQuantization(_Wire, kw_only=True):
    """Weight quantization as vLLM loads it: a quantized checkpoint (fp8, compressed-tensors
    w8a8 / w4a16, GPTQ, AWQ) or fp8 applied while loading (``--quantization fp8`` on a 16-bit
    checkpoint)."""

    method: Annotated[
        Literal["fp8", "fp8_channel", "fp8_block", "w8a8_int8", "w4a16", "gptq", "awq"],
        Meta(description="`fp8`: fp8 weights, one scale per tensor (also `--quantization fp8` "
             "at load); `fp8_channel`: per output channel (compressed-tensors fp8-dynamic); "
             "`fp8_block`: 128x128 blocks (DeepSeek-V3 style); `w8a8_int8`: int8 weights with "
             "per-channel scales (compressed-tensors w8a8); `w4a16`: 4-bit compressed-tensors "
             "pack-quantized; `gptq`, `awq`: 4-bit GPTQ/AWQ (also their Marlin kernels)."),
    ]
    group_size: Annotated[
        int, Meta(ge=-1, le=1 << 16, description="Input features per scale group of the 4-bit "
                  "methods (`w4a16`, `gptq`, `awq`); -1: one group per row.")
    ] = 128
    applied_at_load: Annotated[
        bool, Meta(description="The checkpoint is 16-bit and vLLM quantizes it while loading "
                   "(`--quantization fp8`; `method` must be `fp8`). The stored bytes are the "
                   "same as an fp8 checkpoint's.")
    ] = False

    def __post_init__(self) -> None:
        if self.group_size == 0:
            raise ValueError("group_size must be -1 or >= 1")
        if self.applied_at_load and self.method != "fp8":
            raise ValueError("applied_at_load needs method 'fp8' (vLLM quantizes only to fp8 "
                             "while loading)")


class LLMServingWorkload(_Wire, tag="llm_serving", tag_field="kind", kw_only=True):
    """An LLM served by an inference engine. The engine profiles a dummy forward pass and hands
    everything left of ``gpu_memory_utilization x total memory`` to a paged KV-cache pool; the
    answer follows the engine's own accounting (calibrated per engine version)."""

    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the model's name.")
    ] = None
    engine: Annotated[Literal["vllm"], Meta(description="The serving engine.")] = "vllm"
    engine_version: Annotated[
        EngineVersion,
        Meta(description="Engine version whose accounting and calibration are used "
             f"(default {DEFAULT_ENGINE_VERSION}; see docs/ACCURACY.md)."),
    ] = DEFAULT_ENGINE_VERSION
    model: Annotated[
        ModelSource,
        Meta(description="The model: a preset id, an inline `config.json`, or its dimensions."),
    ]
    parallelism: Annotated[
        ServingParallelism, Meta(description="Tensor / pipeline / data parallel sizes.")
    ] = ServingParallelism()
    gpu_memory_utilization: Annotated[
        float, Meta(gt=0.0, le=1.0, description="Fraction of each GPU's total memory the "
                    "engine may use (vLLM default 0.9).")
    ] = 0.9
    max_model_len: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None,
        Meta(description="Longest sequence (prompt + output), tokens; default (null): the "
             "model's max_position_embeddings."),
    ] = None
    max_num_seqs: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 20)] | None,
        Meta(description="Sequences per engine step; default (null): the engine's default for "
             "the GPU and entrypoint (vLLM: 1024 on >= 70 GiB GPUs other than A100, else 256)."),
    ] = None
    max_num_batched_tokens: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 24)] | None,
        Meta(description="Tokens per engine step (the profile run's batch); default (null): "
             "the engine's default (vLLM API server: 8192 on >= 70 GiB GPUs other than A100, "
             "else 2048; LLM class 16384 / 8192). Must be >= max_num_seqs."),
    ] = None
    entrypoint: Annotated[
        Literal["api_server", "llm_class"],
        Meta(description="`api_server` (`vllm serve`) or `llm_class` (offline `LLM(...)`): "
             "they have different batch defaults."),
    ] = "api_server"
    dtype: Annotated[
        Literal["auto", "bfloat16", "float16", "float32"],
        Meta(description="Model dtype; `auto`: the checkpoint's (float16 stays float16, "
             "everything else bfloat16)."),
    ] = "auto"
    kv_cache_dtype: Annotated[
        Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
        Meta(description="KV-cache dtype; `auto`: the model dtype; fp8: one byte per element."),
    ] = "auto"
    block_size: Annotated[
        Literal[1, 8, 16, 32, 64, 128] | None,
        Meta(description="Tokens per KV-cache block; default (null): the engine's (16)."),
    ] = None
    enforce_eager: Annotated[
        bool, Meta(description="No CUDA graphs (no graph memory).")
    ] = False
    disable_hybrid_kv_cache_manager: Annotated[
        bool, Meta(description="Cache sliding-window layers as full attention (vLLM "
                   "`--disable-hybrid-kv-cache-manager`).")
    ] = False
    quantization: Annotated[
        ServingQuantization | None,
        Meta(description="Weight quantization; default (null): none (weights in `dtype`)."),
    ] = None


Workload = InferenceWorkload | TrainingWorkload | GenericWorkload | LLMServingWorkload

# --------------------------------------------------------------------------------- devices --


class CatalogDevice(_Wire, tag="catalog", tag_field="source", kw_only=True):
    id: Annotated[GPUId, Meta(description="GPU id from `GET /v1/gpus`.")]


class CustomDevice(_Wire, tag="custom", tag_field="source", kw_only=True):
    """A device that is not in the catalog."""

    name: Annotated[Name, Meta(description="Label of the device in the answer and warnings.")] = (
        "custom")
    memory_total_bytes: Annotated[
        int, Meta(ge=1, le=1 << 50, description="Device memory capacity, bytes.")
    ]
    native_dtypes: Annotated[
        tuple[
            Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4",
                    "fp6", "fp4"], ...
        ],
        Meta(description="Dtypes with native (tensor-core) support; weights or compute in any "
             "other dtype get a warning."),
    ] = ("fp32", "fp16", "bf16")
    architecture: Annotated[
        Name, Meta(description="Architecture name, reported in the answer only (overheads use "
                   "generic defaults).")
    ] = "unknown"


DeviceRef = CatalogDevice | CustomDevice


class Headroom(_Wire, kw_only=True):
    """Safety margin kept free on top of the estimate."""

    fraction: Annotated[
        Fraction, Meta(description="Of the device subtotal (default 5%).")
    ] = 0.05
    min_bytes: Annotated[
        Bytes, Meta(description="Floor of the headroom, bytes: max(fraction x subtotal, "
                    "min_bytes).")
    ] = 0


class TraceOptions(_Wire, kw_only=True):
    """How the trace tier runs the workload (used with ``method: trace``)."""

    iterations: Annotated[
        int, Meta(ge=2, le=8, description="Training steps (or generation requests) traced, "
                  "2 .. 8: the first optimizer step creates the optimizer state lazily, so the "
                  "steady state is only seen from the second.")
    ] = 2
    expandable_segments: Annotated[
        bool, Meta(description="Replay with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
    ] = False


class Software(_Wire, kw_only=True):
    """The software a budget is for; a profile measured on other versions is not used."""

    torch_version: Annotated[
        Annotated[str, Meta(max_length=64)] | None,
        Meta(description="e.g. `2.13.0+cu130` (compared on major.minor)."),
    ] = None
    cuda_version: Annotated[
        Annotated[str, Meta(max_length=32)] | None,
        Meta(description="CUDA runtime of the torch build, e.g. `13.0` (major.minor)."),
    ] = None
    driver_version: Annotated[
        Annotated[str, Meta(max_length=32)] | None,
        Meta(description="NVIDIA driver, e.g. `580.82.07` (compared on the major)."),
    ] = None


class BudgetRequest(_Wire, kw_only=True):
    """Co-located workloads on one device type; each workload keeps its own parallel layout."""

    method: Annotated[
        Literal["analytic", "trace"],
        Meta(description="`analytic`: closed-form formulas (microseconds). `trace`: run the "
             "workload's PyTorch code on fake tensors and replay every allocation through a "
             "model of the CUDA caching allocator (seconds; inference and training workloads, "
             "one pipeline stage, no ZeRO)."),
    ] = "analytic"
    trace: Annotated[
        TraceOptions, Meta(description="Options of the trace tier (ignored by `analytic`).")
    ] = TraceOptions()

    workloads: Annotated[
        tuple[Workload, ...],
        Meta(min_length=1, max_length=16, description="Workloads sharing each device (1 .. 16); "
             "with several, the most loaded stage of each is summed on one device."),
    ]
    device: Annotated[
        DeviceRef | None,
        Meta(description="The device type; it fixes the CUDA context and workspace defaults "
             "and dtype warnings. Default: none (generic defaults)."),
    ] = None
    headroom: Annotated[
        Headroom, Meta(description="Safety margin added to each device's subtotal (an "
                       "`llm_serving` workload reports the memory the engine leaves unused "
                       "instead).")
    ] = Headroom()
    software: Annotated[
        Software | None,
        Meta(description="Driver, CUDA and torch versions of the target: they choose the "
             "calibration profile (default: any profile of the device)."),
    ] = None

    def __post_init__(self) -> None:
        check_serving_alone(self.workloads)
        if any(isinstance(w, LLMServingWorkload) for w in self.workloads):
            if self.device is None:
                raise ValueError("an llm_serving workload needs a device (the engine sizes its "
                                 "KV cache from the GPU's total memory)")
            if self.method != "analytic":
                raise ValueError("an llm_serving workload is budgeted by method 'analytic' only")


def check_serving_alone(workloads: tuple[Workload, ...]) -> None:
    """A serving engine takes the GPU for itself (its KV pool is whatever is left), so it cannot
    share a budget with co-located workloads."""
    if len(workloads) > 1 and any(isinstance(w, LLMServingWorkload) for w in workloads):
        raise ValueError("an llm_serving workload must be the only workload (the engine hands "
                         "all memory it may use to its KV cache)")


_SERVING_IN_WORKLOADS: dict[str, object] = {
    "properties": {"workloads": {"contains": {
        "type": "object", "properties": {"kind": {"const": "llm_serving"}},
        "required": ["kind"]}}},
    "required": ["workloads"]}


# The cross-field checks above, as JSON Schema (merged into the published components).
SCHEMA_RULES: dict[str, list[dict[str, object]]] = {
    "Parallelism": [
        {"if": {"properties": {"offload_optimizer": {"const": True}},
                "required": ["offload_optimizer"]},
         "then": {"properties": {"zero_stage": {"minimum": 1}}, "required": ["zero_stage"]}},
        {"if": {"properties": {"offload_parameters": {"const": True}},
                "required": ["offload_parameters"]},
         "then": {"properties": {"zero_stage": {"const": 3}}, "required": ["zero_stage"]}},
        {"if": {"properties": {"virtual_stages": {"minimum": 2}}, "required": ["virtual_stages"]},
         "then": {"properties": {"pipeline_schedule": {"const": "interleaved_1f1b"}},
                  "required": ["pipeline_schedule"]}},
    ],
    "GPTQ": [{"properties": {"group_size": {"not": {"const": 0}}}}],
    "ServingQuantization": [
        {"properties": {"group_size": {"not": {"const": 0}}}},
        {"if": {"properties": {"applied_at_load": {"const": True}},
                "required": ["applied_at_load"]},
         "then": {"properties": {"method": {"const": "fp8"}}, "required": ["method"]}},
    ],
    "BudgetRequest": [
        {"if": _SERVING_IN_WORKLOADS,
         "then": {"properties": {"workloads": {"maxItems": 1},
                                 "device": {"not": {"type": "null"}},
                                 "method": {"const": "analytic"}},
                  "required": ["device"]}},
    ],
    "FitRequest": [
        {"if": _SERVING_IN_WORKLOADS,
         "then": {"properties": {"workloads": {"maxItems": 1}}}},
    ],
    "AWQ": [{"properties": {"group_size": {"not": {"const": 0}}}}],
    "Precision": [
        {"if": {"properties": {"weights": {"const": "fp8"}}, "required": ["weights"]},
         "then": {"properties": {"quantization": {"type": "null"}}}},
    ],
    "TrainingWorkload": [
        {"if": {"properties": {"mixed_precision": {"const": "autocast"}},
                "required": ["mixed_precision"]},
         "then": {"properties": {"precision": {"properties": {"weights": {"const": "fp32"}},
                                               "required": ["weights"]}},
                  "required": ["precision"]}},
        {"if": {"properties": {"method": {"properties": {"kind": {"const": "qlora"}},
                                          "required": ["kind"]}}, "required": ["method"]},
         "then": {"properties": {"precision": {"properties": {"quantization": {
             "type": "null"}}}}}},
    ],
}
