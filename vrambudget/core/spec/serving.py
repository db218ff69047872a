"""A serving-engine deployment of an LLM (``llm_serving``)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, UnsetType

from ..serving.calibration import DEFAULT_ENGINE_VERSION, ENGINE_VERSIONS
from . import rules
from .limits import MAX_TOKENS, Degree, Name, Wire
from .model import ModelSource

__all__ = ["EngineVersion", "LLMServingWorkload", "ServingParallelism", "ServingQuantization"]


EngineVersion = Literal[ENGINE_VERSIONS]  # type: ignore[valid-type]


class ServingParallelism(Wire, frozen=True, kw_only=True):
    """vLLM's ``--tensor-parallel-size``, ``--pipeline-parallel-size``,
    ``--data-parallel-size`` and ``--enable-expert-parallel``."""

    tensor: Annotated[
        Degree, Meta(description="Tensor-parallel size: GPUs each layer is split over.")
    ] = 1
    pipeline: Annotated[
        Degree,
        Meta(
            description="Pipeline-parallel size: stages the layers are cut into "
            "(vLLM get_pp_indices)."
        ),
    ] = 1
    data: Annotated[
        Degree,
        Meta(
            description="Data-parallel size: independent engine replicas (each with "
            "its own KV cache); budgets are per GPU of one replica."
        ),
    ] = 1
    enable_expert_parallel: Annotated[
        bool,
        Meta(
            description="MoE experts sharded over tensor x data ranks instead of each "
            "expert split by tensor parallelism."
        ),
    ] = False

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data


class ServingQuantization(Wire, frozen=True, kw_only=True):
    """Weight quantization as vLLM loads it: a quantized checkpoint (fp8, compressed-tensors
    w8a8 / w4a16, GPTQ, AWQ) or fp8 applied while loading (``--quantization fp8`` on a 16-bit
    checkpoint)."""

    method: Annotated[
        Literal["fp8", "fp8_channel", "fp8_block", "w8a8_int8", "w4a16", "gptq", "awq"],
        Meta(
            description="`fp8`: fp8 weights, one scale per tensor (also `--quantization fp8` "
            "at load); `fp8_channel`: per output channel (compressed-tensors fp8-dynamic); "
            "`fp8_block`: 128x128 blocks (DeepSeek-V3 style); `w8a8_int8`: int8 weights with "
            "per-channel scales (compressed-tensors w8a8); `w4a16`: 4-bit compressed-tensors "
            "pack-quantized; `gptq`, `awq`: 4-bit GPTQ/AWQ (also their Marlin kernels)."
        ),
    ]
    group_size: Annotated[
        int,
        Meta(
            ge=-1,
            le=1 << 16,
            description="Input features per scale group of the 4-bit "
            "methods (`w4a16`, `gptq`, `awq`); -1: one group per row.",
        ),
    ] = 128
    applied_at_load: Annotated[
        bool,
        Meta(
            description="The checkpoint is 16-bit and vLLM quantizes it while loading "
            "(`--quantization fp8`; `method` must be `fp8`). The stored bytes are the "
            "same as an fp8 checkpoint's."
        ),
    ] = False

    def __post_init__(self) -> None:
        rules.check(self)


class LLMServingWorkload(Wire, tag="llm_serving", tag_field="kind", frozen=True, kw_only=True):
    """An LLM served by an inference engine. The engine profiles a dummy forward pass and hands
    everything left of ``gpu_memory_utilization x total memory`` to a paged KV-cache pool; the
    answer follows the engine's own accounting (calibrated per engine version)."""

    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the model's name.")
    ] = None
    engine: Annotated[Literal["vllm"], Meta(description="The serving engine.")] = "vllm"
    engine_version: Annotated[
        EngineVersion,
        Meta(
            description="Engine version whose accounting and calibration are used "
            f"(default {DEFAULT_ENGINE_VERSION}; see docs/ACCURACY.md)."
        ),
    ] = DEFAULT_ENGINE_VERSION
    model: Annotated[
        ModelSource,
        Meta(description="The model: a preset id, an inline `config.json`, or its dimensions."),
    ]
    parallelism: Annotated[
        ServingParallelism, Meta(description="Tensor / pipeline / data parallel sizes.")
    ] = ServingParallelism()
    gpu_memory_utilization: Annotated[
        float,
        Meta(
            gt=0.0,
            le=1.0,
            description="Fraction of each GPU's total memory the "
            "engine may use (vLLM default 0.9).",
        ),
    ] = 0.9
    max_model_len: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None,
        Meta(
            description="Longest sequence (prompt + output), tokens; default (null): the "
            "model's max_position_embeddings."
        ),
    ] = None
    max_num_seqs: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 20)] | None,
        Meta(
            description="Sequences per engine step; default (null): the engine's default for "
            "the GPU and entrypoint (vLLM: 1024 on >= 70 GiB GPUs other than A100, else 256)."
        ),
    ] = None
    max_num_batched_tokens: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 24)] | None,
        Meta(
            description="Tokens per engine step (the profile run's batch); default (null): "
            "the engine's default (vLLM API server: 8192 on >= 70 GiB GPUs other than A100, "
            "else 2048; LLM class 16384 / 8192). Must be >= max_num_seqs."
        ),
    ] = None
    entrypoint: Annotated[
        Literal["api_server", "llm_class"],
        Meta(
            description="`api_server` (`vllm serve`) or `llm_class` (offline `LLM(...)`): "
            "they have different batch defaults."
        ),
    ] = "api_server"
    dtype: Annotated[
        Literal["auto", "bfloat16", "float16", "float32"],
        Meta(
            description="Model dtype; `auto`: the checkpoint's (float16 stays float16, "
            "everything else bfloat16)."
        ),
    ] = "auto"
    kv_cache_dtype: Annotated[
        Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
        Meta(description="KV-cache dtype; `auto`: the model dtype; fp8: one byte per element."),
    ] = "auto"
    block_size: Annotated[
        Literal[1, 8, 16, 32, 64, 128] | None,
        Meta(description="Tokens per KV-cache block; default (null): the engine's (16)."),
    ] = None
    enforce_eager: Annotated[bool, Meta(description="No CUDA graphs (no graph memory).")] = False
    disable_hybrid_kv_cache_manager: Annotated[
        bool,
        Meta(
            description="Cache sliding-window layers as full attention (vLLM "
            "`--disable-hybrid-kv-cache-manager`)."
        ),
    ] = False
    quantization: Annotated[
        ServingQuantization | None | UnsetType,
        Meta(
            description="Weight quantization (vLLM `--quantization`). Absent (default): the "
            "checkpoint's `quantization_config`, as vLLM detects it (none when it has none); "
            "null: none (weights in `dtype`)."
        ),
    ] = UNSET
