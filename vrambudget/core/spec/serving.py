"""A serving-engine deployment of an LLM (``llm_serving``)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, UnsetType

from . import rules
from .limits import MAX_LAYERS, MAX_TOKENS, Degree, Name, Wire
from .model import ModelSource

__all__ = [
    "GGUF_ENGINES",
    "Engine",
    "EngineVersion",
    "GGUFFileType",
    "GGUFOptions",
    "GGUFTensorSpec",
    "LLMServingWorkload",
    "SGLangOptions",
    "ServingParallelism",
    "ServingQuantization",
    "SpeculativeOptions",
]

Engine = Literal["vllm", "sglang", "llama_cpp", "ollama"]

GGUF_ENGINES = frozenset({"llama_cpp", "ollama"})
"""The engines that serve GGUF files on ggml (llama.cpp's buffers; no torch)."""

EngineVersion = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=32,
        pattern=r"^(b[0-9]{1,6}|[0-9]{1,3}(\.[0-9]{1,4}){1,3}(\.post[0-9]{1,3})?)$",
        description="An engine release: `0.11`, `0.11.2`, `0.10.1.1` (vLLM, SGLang, Ollama) or a "
        "llama.cpp build `b6500`.",
    ),
]

GGUFFileType = Literal[
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_1",
    "Q5_0",
    "Q4_K_M",
    "Q4_K_S",
    "Q4_1",
    "Q4_0",
    "IQ4_XS",
    "IQ4_NL",
    "Q3_K_L",
    "Q3_K_M",
    "Q3_K_S",
    "IQ3_M",
    "IQ3_S",
    "IQ3_XS",
    "IQ3_XXS",
    "Q2_K",
    "Q2_K_S",
    "IQ2_M",
    "IQ2_S",
    "IQ2_XS",
    "IQ2_XXS",
    "IQ1_M",
    "IQ1_S",
]
"""llama-quantize's named file types (``LLAMA_FTYPE_MOSTLY_*``, tools/quantize/quantize.cpp)."""

GGMLType = Literal[
    "F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS",
    "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4",
]  # fmt: skip
"""ggml tensor types a GGUF file may hold (ggml.h ``ggml_type``)."""


class GGUFTensorSpec(Wire, frozen=True, kw_only=True):
    """One tensor of a GGUF file as its header lists it (``vrambudget gguf FILE`` writes them)."""

    name: Annotated[str, Meta(min_length=1, max_length=256, description="`blk.3.attn_q.weight`.")]
    type: Annotated[GGMLType, Meta(description="Its ggml type.")]
    shape: Annotated[
        tuple[Annotated[int, Meta(ge=1, le=1 << 40)], ...],
        Meta(min_length=1, max_length=4, description="ggml shape: ne[0] (row length) first."),
    ]


CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


class GGUFOptions(Wire, frozen=True, kw_only=True):
    """A GGUF deployment's settings, in llama.cpp's names (the Ollama equivalent in brackets)."""

    file_type: Annotated[
        GGUFFileType,
        Meta(
            description="The GGUF file's quantization as llama-quantize names it (Q4_K_M, "
            "Q8_0, IQ4_XS, ...): each tensor's type follows llama.cpp's recipe for it."
        ),
    ] = "Q4_K_M"
    n_ctx: Annotated[
        Annotated[int, Meta(ge=1, le=(1 << 32) - 1)] | None,
        Meta(
            description="`-c` [num_ctx]: llama.cpp's context size in tokens, shared by all "
            "slots (each of the n_parallel slots gets n_ctx / n_parallel); for Ollama, the "
            "context of one request (Ollama allocates num_ctx x num_parallel). Default "
            "(null): the engine's default for its version."
        ),
    ] = None
    n_gpu_layers: Annotated[
        Annotated[int, Meta(ge=0, le=1 << 16)] | None,
        Meta(
            description="`-ngl` [num_gpu]: layers on the GPUs (the output layer counts as one "
            "more: n_layer + 1 offloads everything). Default (null): all (llama.cpp), or as "
            "many as fit (Ollama's own estimate)."
        ),
    ] = None
    devices: Annotated[
        Annotated[int, Meta(ge=1, le=64)],
        Meta(description="GPUs the layers are split over (`--split-mode layer`)."),
    ] = 1
    tensor_split: Annotated[
        tuple[Annotated[float, Meta(ge=0.0, le=1e6)], ...] | None,
        Meta(
            description="`--tensor-split`: the proportion of layers per GPU (one number per "
            "device); default (null): equal GPUs split evenly."
        ),
    ] = None
    n_parallel: Annotated[
        Annotated[int, Meta(ge=1, le=256)] | None,
        Meta(
            description="`-np` [OLLAMA_NUM_PARALLEL]: concurrent request slots (llama.cpp's "
            "LLAMA_MAX_SEQ: 256); default (null): the engine's default for its version."
        ),
    ] = None
    cache_type_k: Annotated[
        CacheType, Meta(description="`-ctk` [OLLAMA_KV_CACHE_TYPE]: the K cache's type.")
    ] = "f16"
    cache_type_v: Annotated[
        CacheType,
        Meta(
            description="`-ctv` [OLLAMA_KV_CACHE_TYPE]: the V cache's type (a quantized V "
            "cache needs flash attention)."
        ),
    ] = "f16"
    flash_attn: Annotated[
        Literal["auto", "on", "off"],
        Meta(
            description="`-fa` [OLLAMA_FLASH_ATTENTION]: `auto` is on where the backend "
            "supports it (llama.cpp >= b6325 default)."
        ),
    ] = "auto"
    n_batch: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 20)] | None,
        Meta(
            description="`-b` [num_batch]: logical batch (tokens per llama_decode); default "
            "(null): 2048 (llama.cpp), 512 (Ollama)."
        ),
    ] = None
    n_ubatch: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 20)] | None,
        Meta(
            description="`-ub`: physical batch, which sizes the compute buffers; default "
            "(null): 512 (llama.cpp only: Ollama runs num_batch)."
        ),
    ] = None
    kv_offload: Annotated[
        bool,
        Meta(description="`--no-kv-offload` off: the KV cache of GPU layers on their GPU."),
    ] = True
    op_offload: Annotated[
        bool,
        Meta(
            description="`--no-op-offload` off (llama.cpp only): micro-batches of 32 tokens or "
            "more run the matmuls of host-resident weights on the first GPU, copying each "
            "weight into its compute buffer; false keeps them on the host."
        ),
    ] = True
    n_cpu_moe: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_LAYERS,
            description="`--n-cpu-moe N` (llama.cpp only): the expert weights (`ffn_*_exps`) "
            "of the first N repeating layers stay in host memory; `--cpu-moe` is N = the "
            "model's layers. Dense models have none to move. Default 0: none.",
        ),
    ] = 0
    tensors: Annotated[
        Annotated[tuple[GGUFTensorSpec, ...], Meta(min_length=1, max_length=1 << 16)] | None,
        Meta(
            description="The file's own tensors (from its header: `vrambudget gguf FILE`): "
            "the model buffers use them instead of file_type's recipe. Default (null): the "
            "recipe.",
        ),
    ] = None

    def __post_init__(self) -> None:
        rules.check(self)


class SGLangOptions(Wire, frozen=True, kw_only=True):
    """SGLang's `launch_server` memory settings (`python/sglang/srt/server_args.py`)."""

    mem_fraction_static: Annotated[
        Annotated[float, Meta(gt=0.0, lt=1.0)] | None,
        Meta(
            description="`--mem-fraction-static`: the fraction of GPU memory for weights and "
            "the KV pool; default (null): the release's automatic value for the GPU and TP."
        ),
    ] = None
    max_running_requests: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 20)] | None,
        Meta(description="`--max-running-requests`; default (null): from the pool."),
    ] = None
    max_total_tokens: Annotated[
        Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None,
        Meta(description="`--max-total-tokens`: caps the token pool."),
    ] = None
    chunked_prefill_size: Annotated[
        Annotated[int, Meta(ge=-1, le=1 << 24)] | None,
        Meta(
            description="`--chunked-prefill-size` (-1 disables); default (null): the "
            "release's value for the GPU."
        ),
    ] = None
    cuda_graph_max_bs: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 16)] | None,
        Meta(description="`--cuda-graph-max-bs`; default (null): the release's value."),
    ] = None
    disable_cuda_graph: Annotated[bool, Meta(description="`--disable-cuda-graph`.")] = False
    page_size: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 12)],
        Meta(description="`--page-size`: tokens per KV page."),
    ] = 1


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
            description="MoE experts whole, spread over the tensor x data ranks, instead of "
            "each expert split by tensor parallelism (over those same ranks: with data > 1 "
            "vLLM splits a MoE model's experts over the replicas either way)."
        ),
    ] = False
    peer_access: Annotated[
        bool | None,
        Meta(
            description="Whether the GPUs of a tensor-parallel group read each other's memory "
            "directly (CUDA peer-to-peer). null: as the GPU type implies (NVLink / NVSwitch / "
            "xGMI boards and PCIe cards are taken to have it). false: the group spans nodes, "
            "or the host disables P2P (many VMs, containers and consumer boards). vLLM then "
            "turns its custom all-reduce off, and says so in its log ('Custom allreduce is "
            "disabled because your platform lacks GPU P2P capability' or '... because this "
            "process group spans across nodes'); NCCL moves the data through host memory, "
            "and the all-reduce buffers on the GPU are small."
        ),
    ] = None

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


class SpeculativeOptions(Wire, frozen=True, kw_only=True):
    """vLLM speculative decoding (``--speculative-config``): a drafter proposes tokens that the
    target model verifies in one step."""

    method: Annotated[
        Literal["ngram", "eagle", "eagle3", "draft_model", "mtp"],
        Meta(
            description="`ngram`: drafts from the prompt's own n-grams (no model, no memory); "
            "`eagle`: an EAGLE-1 head (its decoder layers and the fc that joins the target's "
            "hidden state and the token embedding; the embedding and LM head are the "
            "target's); `eagle3`: a one-layer EAGLE-3 head (its layer reads twice the width, "
            "its fc three of the target's hidden states, and it has its own LM head over "
            "`draft_vocab_size` tokens); `draft_model`: a separate small model with its own "
            "embedding and head, tensor-parallel like the target (vLLM 0.15 on); `mtp`: the "
            "target's own multi-token-prediction module (DeepSeek-V3: `deepseek_mtp`, one MoE "
            "decoder layer, eh_proj and its own LM head; no `model`)."
        ),
    ]
    num_speculative_tokens: Annotated[
        int, Meta(ge=1, le=32, description="Tokens drafted per step (`num_speculative_tokens`).")
    ]
    model: Annotated[
        ModelSource | None,
        Meta(
            description="The drafter (`eagle`, `eagle3`, `draft_model`): any model source, "
            "a Hub repository included (resolved like the target); none for `ngram` and "
            "`mtp`. Its attention layers must have the target's KV layout (KV heads, head "
            "size), as vLLM keeps them in the target's KV-cache group."
        ),
    ] = None
    draft_vocab_size: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 26)] | None,
        Meta(
            description="`eagle3` only: the vocabulary of the head's own LM head (its "
            "config's `draft_vocab_size`, e.g. 32,000); default (null): the head's "
            "`vocab_size`."
        ),
    ] = None

    def __post_init__(self) -> None:
        rules.check(self)


class LLMServingWorkload(Wire, tag="llm_serving", tag_field="kind", frozen=True, kw_only=True):
    """An LLM served by an inference engine. The engine profiles a dummy forward pass and hands
    everything left of ``gpu_memory_utilization x total memory`` to a paged KV-cache pool; the
    answer follows the engine's own accounting (calibrated per engine version)."""

    name: Annotated[
        Name | None, Meta(description="Label in the answer; default: the model's name.")
    ] = None
    engine: Annotated[
        Engine,
        Meta(
            description="The serving engine: `vllm`, `sglang`, `llama_cpp` (llama-server) or "
            "`ollama`."
        ),
    ] = "vllm"
    engine_version: Annotated[
        EngineVersion | None,
        Meta(
            description="The engine release whose accounting is used; a release between two "
            "modelled ones uses the earlier (the answer says which). Default (null): the "
            "newest modelled release of the engine (see docs/SERVING.md)."
        ),
    ] = None
    model: Annotated[
        ModelSource,
        Meta(description="The model: a preset id, an inline `config.json`, or its dimensions."),
    ]
    parallelism: Annotated[
        ServingParallelism, Meta(description="Tensor / pipeline / data parallel sizes.")
    ] = ServingParallelism()
    gpu_memory_utilization: Annotated[
        Annotated[float, Meta(gt=0.0, le=1.0)] | None,
        Meta(
            description="vLLM: the fraction of each GPU's total memory the engine may use; "
            "default (null): the release's (0.9; 0.92 from 0.20; 1.0 with 0.34's extensible KV "
            "cache)."
        ),
    ] = None
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
    flashinfer_sampler: Annotated[
        bool | None,
        Meta(
            description="vLLM's `VLLM_USE_FLASHINFER_SAMPLER`: true runs top-k / top-p on "
            "FlashInfer (the profile's warm-up sampler sorts nothing); false and null keep the "
            "release's own path: 0.12 - 0.16 sort the vocabulary, 0.17 on a Triton kernel, "
            "0.10 - 0.11 FlashInfer when the optional flashinfer package is installed (vLLM's "
            "Docker image: say true) and a sort otherwise (`pip install vllm`: the default "
            "assumed)."
        ),
    ] = None
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
            description="Weight quantization (vLLM / SGLang `--quantization`). Absent "
            "(default): the checkpoint's `quantization_config`, as the engine detects it "
            "(none when it has none); null: none (weights in `dtype`)."
        ),
    ] = UNSET
    kv_cache_memory_bytes: Annotated[
        Annotated[int, Meta(ge=1, le=1 << 50)] | None,
        Meta(
            description="vLLM `--kv-cache-memory` (releases that have it): the KV pool's size "
            "in bytes per GPU; the engine skips its profiling budget and ignores "
            "gpu_memory_utilization."
        ),
    ] = None
    sglang: Annotated[
        SGLangOptions | None,
        Meta(description="SGLang settings (engine `sglang` only; default: its defaults)."),
    ] = None
    speculative: Annotated[
        SpeculativeOptions | None,
        Meta(
            description="vLLM speculative decoding (default: none): the drafter's weights and "
            "its layers' KV cache come out of the same budget."
        ),
    ] = None
    gguf: Annotated[
        GGUFOptions | None,
        Meta(
            description="The GGUF deployment (engines `llama_cpp` and `ollama`; default: "
            "Q4_K_M with the engine's defaults)."
        ),
    ] = None

    def __post_init__(self) -> None:
        rules.check(self)
