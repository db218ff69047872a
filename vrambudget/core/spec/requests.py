"""What a caller sends: workloads on a device type (``BudgetRequest``, ``FitRequest``), the
device, the headroom and the software stack."""

from __future__ import annotations

import re
from typing import Annotated, Literal, cast

import msgspec
from msgspec import Meta

from ..catalog import GPUId
from ..dtypes import NativeDType
from ..roofline import MBU_DEFAULT, MFU_DEFAULT
from . import rules
from .diffusion import ImageGenerationWorkload
from .encoders import Seq2SeqWorkload, SpeechToTextWorkload, VisionWorkload
from .limits import (
    MAX_DEVICES,
    MAX_FIT_DEVICE_COUNT,
    MAX_SOLVED_DEVICE_COUNT,
    Bytes,
    Fraction,
    Name,
    Tokens,
    Wire,
)
from .serving import LLMServingWorkload
from .workloads import GenericWorkload, InferenceWorkload, TrainingWorkload

__all__ = [
    "DRIVER_VERSION_PATTERN",
    "AnalyticWorkload",
    "BudgetRequest",
    "CatalogDevice",
    "CustomDevice",
    "DeviceRef",
    "DiskOptions",
    "EncoderWorkload",
    "FitRequest",
    "FitVariable",
    "Framework",
    "Headroom",
    "LatencyTarget",
    "Libraries",
    "LossImplementation",
    "ModelWorkload",
    "NormImplementation",
    "Software",
    "TraceOptions",
    "Workload",
    "analytic_workloads",
    "driver_version",
]


Workload = (
    InferenceWorkload
    | TrainingWorkload
    | GenericWorkload
    | LLMServingWorkload
    | ImageGenerationWorkload
    | VisionWorkload
    | Seq2SeqWorkload
    | SpeechToTextWorkload
)
ModelWorkload = InferenceWorkload | TrainingWorkload
"""A workload of a model the analytic tier builds tensor by tensor."""
EncoderWorkload = VisionWorkload | Seq2SeqWorkload | SpeechToTextWorkload
"""A workload of a model whose inputs are not a text prompt (image, input sequence, audio)."""
AnalyticWorkload = (
    InferenceWorkload | TrainingWorkload | GenericWorkload | EncoderWorkload
)  # fmt: skip
"""What the analytic tier budgets (a serving engine's workload goes to the engine's model)."""


def analytic_workloads(workloads: tuple[Workload, ...]) -> tuple[AnalyticWorkload, ...] | None:
    """The workloads as the analytic tier's, or None when one is a serving-engine workload
    (the same tuple: no copy on the hot path)."""
    for w in workloads:
        if isinstance(w, LLMServingWorkload):
            return None
    return cast("tuple[AnalyticWorkload, ...]", workloads)


# --------------------------------------------------------------------------------- devices --


InUse = Annotated[
    int,
    Meta(
        ge=0,
        le=1 << 50,
        description="Memory other processes already hold on the device when the workload "
        "starts (a desktop session, another server): `nvidia-smi`'s used memory with nothing "
        "of yours running, bytes. It comes off what the workload may use (the fit, the largest "
        "batch), and a serving engine sees it as SGLang and vLLM do: SGLang's pool is its "
        "fraction of the free memory, vLLM refuses to start when the free memory is below "
        "`gpu_memory_utilization` x total. Must be below the device's total. Default 0: a GPU "
        "nothing else uses (with `desktop_session`: that desktop's published hold).",
    ),
]


DesktopSession = Annotated[
    Literal["windows", "linux", "none"] | None,
    Meta(
        description="Whether the device also drives a desktop session: `windows` (the WDDM "
        "driver: native Windows, WSL2 or Docker Desktop), `linux` (Xorg or a Wayland "
        "compositor), or `none` (headless). Where `memory_in_use_bytes` is 0, a desktop's hold "
        "is taken as the median of published nvidia-smi readings of such desktops, and the "
        "fit verdict, the largest batch / context and a serving engine's KV-token band reach "
        "the spread of those readings (`device.memory_in_use_low_bytes` / `_high_bytes` in "
        "the answer); a measured `memory_in_use_bytes` replaces it. Default null: not said "
        "(a consumer card's serving answer warns that a desktop may hold memory).",
    ),
]


class CatalogDevice(Wire, tag="catalog", tag_field="source", frozen=True, kw_only=True):
    id: Annotated[GPUId, Meta(description="GPU id from `GET /v1/gpus`.")]
    memory_in_use_bytes: InUse = 0
    desktop_session: DesktopSession = None


class CustomDevice(Wire, tag="custom", tag_field="source", frozen=True, kw_only=True):
    """A device that is not in the catalog."""

    name: Annotated[Name, Meta(description="Label of the device in the answer and warnings.")] = (
        "custom"
    )
    memory_total_bytes: Annotated[
        int, Meta(ge=1, le=1 << 50, description="Device memory capacity, bytes.")
    ]
    native_dtypes: Annotated[
        tuple[NativeDType, ...],
        Meta(
            description="Dtypes with native (tensor-core) support; weights or compute in any "
            "other dtype get a warning."
        ),
    ] = ("fp32", "fp16", "bf16")
    architecture: Annotated[
        Name,
        Meta(
            description="Architecture name, reported in the answer only (overheads use "
            "generic defaults)."
        ),
    ] = "unknown"
    memory_in_use_bytes: InUse = 0
    desktop_session: DesktopSession = None


DeviceRef = CatalogDevice | CustomDevice


class Headroom(Wire, frozen=True, kw_only=True):
    """Safety margin kept free on top of the estimate."""

    fraction: Annotated[
        Fraction | None,
        Meta(
            description="Of the device subtotal. Default (null): the high end of the "
            "answer's error band (`devices[].band`), calibrated on published measurements of "
            "the workload's class."
        ),
    ] = None
    min_bytes: Annotated[
        Bytes,
        Meta(description="Floor of the headroom, bytes: max(fraction x subtotal, min_bytes)."),
    ] = 0

    def __post_init__(self) -> None:
        # -0.0 equals 0.0 (so they share cached answers): one spelling, so an answer never
        # echoes the other request's
        if self.fraction == 0.0:
            msgspec.structs.force_setattr(self, "fraction", 0.0)


class DiskOptions(Wire, frozen=True, kw_only=True):
    """Which copies of the model files the disk budget counts besides the files themselves.
    Each is a provisioning convention of this service, for the steps around serving or
    training (a conversion, an update), not a copy that loading or running the model keeps."""

    conversion_copy: Annotated[
        bool | None,
        Meta(
            description="Count one more copy of the model files as scratch space for a step "
            "that writes a complete new copy before the old one is removed (merging adapters "
            "into the weights and saving, converting the format). Default (null): counted for "
            "safetensors checkpoints (inference, training, vision / seq2seq / speech, vLLM and "
            "SGLang serving), not for a GGUF file (llama.cpp, Ollama) or an image-generation "
            "pipeline's files."
        ),
    ] = None
    update_copy: Annotated[
        bool | None,
        Meta(
            description="Count one more copy for a blue/green update: the next version of "
            "the files downloaded while the current one is in use. Default (null): counted "
            "for safetensors checkpoints, not for a GGUF file or an image-generation "
            "pipeline's files (as `conversion_copy`)."
        ),
    ] = None


class TraceOptions(Wire, frozen=True, kw_only=True):
    """How the trace tier runs the workload (used with ``method: trace``)."""

    iterations: Annotated[
        int,
        Meta(
            ge=2,
            le=8,
            description="Training steps (or generation requests) traced, "
            "2 .. 8: the first optimizer step creates the optimizer state lazily, so the "
            "steady state is only seen from the second.",
        ),
    ] = 2
    expandable_segments: Annotated[
        bool,
        Meta(
            description="Replay with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (also "
            "done when the stack runs with it: `software.expandable_segments`, or axolotl's "
            "default)."
        ),
    ] = False
    code: Annotated[
        Literal["framework", "builtin"],
        Meta(
            description="`framework` (default): the model built by transformers from its "
            "config.json, generating as `generate` does and training as `Trainer` with PEFT "
            "does. `builtin`: the service's own re-implementation of the family (also used, "
            "and said so, where the framework program cannot run: a model given by its "
            "dimensions, tensor parallelism, selective recomputation, quantized experts)."
        ),
    ] = "framework"


Framework = Literal[
    "transformers",
    "torchtune",
    "litgpt",
    "deepspeed",
    "fsdp",
    "unsloth",
    "axolotl",
    "vllm",
    "sglang",
    "diffusers",
]
"""The program that runs the workload (PEFT, TRL and accelerate ride on ``transformers``:
name them in ``libraries``)."""

LossImplementation = Literal[
    "cross_entropy",
    "cross_entropy_no_upcast",
    "chunked_cross_entropy",
    "litgpt_chunked_cross_entropy",
    "fused_linear_cross_entropy",
]

NormImplementation = Literal["fp32_upcast", "fused"]

Version = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[0-9][0-9A-Za-z.+_-]*$")]

DRIVER_VERSION_PATTERN = r"^[1-9][0-9]{2}(\.[0-9]+){0,3}$"
"""An NVIDIA driver version as nvidia-smi and NVML print it: a three-digit branch, then up to
three dotted numbers (``535.247.01``, ``560.94``). A CUDA version (``12.4``, the "CUDA Version"
of nvidia-smi's header) is not one."""
DriverVersion = Annotated[str, Meta(min_length=3, max_length=32, pattern=DRIVER_VERSION_PATTERN)]


def driver_version(text: object) -> str | None:
    """``text`` as a ``software.driver_version`` where it reads as one (what NVML or a probe
    report gave), else None: the service would refuse any other string."""
    if not text or len(str(text)) > 32 or re.fullmatch(DRIVER_VERSION_PATTERN, str(text)) is None:
        return None
    return str(text)


class Libraries(Wire, frozen=True, kw_only=True):
    """Versions of the libraries the framework runs with (each optional; default: the current
    release, or the version the framework's release pins)."""

    transformers: Annotated[
        Version | None,
        Meta(
            description="transformers, whose model classes and loss run under `fsdp`, "
            "`deepspeed` or `axolotl` (its release decides, among others, the loss's fp32 "
            "copies of the logits). Where transformers is the framework, its release is "
            "`framework_version` and this stays absent."
        ),
    ] = None
    peft: Annotated[Version | None, Meta(description="PEFT (LoRA / QLoRA wrappers).")] = None
    trl: Annotated[Version | None, Meta(description="TRL (SFTTrainer and friends).")] = None
    accelerate: Annotated[Version | None, Meta(description="accelerate.")] = None
    bitsandbytes: Annotated[
        Version | None,
        Meta(description="bitsandbytes: before 0.43.2 its 4-bit layers keep their inputs."),
    ] = None
    deepspeed: Annotated[Version | None, Meta(description="DeepSpeed.")] = None
    flash_attn: Annotated[Version | None, Meta(description="flash-attn.")] = None
    liger_kernel: Annotated[
        Version | None,
        Meta(description="Liger kernels: named, the loss is its fused linear cross-entropy."),
    ] = None


class Software(Wire, frozen=True, kw_only=True):
    """The software stack a budget is for. Every field is optional: what is not named defaults
    to the current release, and the answer's ``stack`` lists the behaviours assumed, each
    with its source. A calibration profile measured on other versions is not used."""

    framework: Annotated[
        Framework | None,
        Meta(
            description="What runs the workload. Default: `transformers` (generate, Trainer "
            "with PEFT) for inference and training, `vllm` for `llm_serving`, `diffusers` for "
            "image generation."
        ),
    ] = None
    framework_version: Annotated[
        Version | None,
        Meta(description="e.g. `4.46.3` (compared on major.minor). Default: the current release."),
    ] = None
    libraries: Annotated[
        Libraries,
        Meta(
            description='Versions of the libraries the framework uses, e.g. `{"peft": "0.13.2"}`.'
        ),
    ] = Libraries()
    loss: Annotated[
        LossImplementation | None,
        Meta(
            description="Training loss implementation. `cross_entropy`: the full logits and "
            "their fp32 copy (transformers' ForCausalLMLoss); `cross_entropy_no_upcast`: "
            "`F.cross_entropy` on the logits in the compute dtype, no fp32 copy (a hand-written "
            "loop over a bf16/fp16 model without autocast); `chunked_cross_entropy`: fp32 per "
            "chunk of the sequence (torchtune's CEWithChunkedOutputLoss); "
            "`litgpt_chunked_cross_entropy`: fp32 logits (Fabric converts the model's output) held "
            "by the training loop, cross-entropy per 128-token chunk (LitGPT); "
            "`fused_linear_cross_entropy`: no logits materialized (Liger, Unsloth; Liger's "
            "forward computes the hidden states' and a trainable head's gradients, by the "
            "`libraries.liger_kernel` release, the current one if not named). Default: the "
            "framework's own."
        ),
    ] = None
    norm: Annotated[
        NormImplementation | None,
        Meta(
            description="RMSNorm implementation, for what training saves. `fp32_upcast`: the "
            "module casts its input to fp32 and autograd keeps that copy (transformers, LitGPT, "
            "torchtune); `fused`: one kernel that keeps the input in its own dtype and a "
            "per-token rstd (Liger's LigerRMSNorm, Unsloth, a compiled layer). Default: the "
            "framework's own (`fused` for Unsloth, where `libraries.liger_kernel` is named, and "
            "for torchtune with `torch_compile`)."
        ),
    ] = None
    torch_version: Annotated[
        Version | None,
        Meta(description="e.g. `2.13.0+cu130` (compared on major.minor)."),
    ] = None
    cuda_version: Annotated[
        Version | None,
        Meta(description="CUDA runtime of the torch build, e.g. `13.0` (major.minor)."),
    ] = None
    rocm_version: Annotated[
        Version | None,
        Meta(description="ROCm runtime of the torch build, e.g. `6.4` (AMD GPUs)."),
    ] = None
    driver_version: Annotated[
        DriverVersion | None,
        Meta(
            description="NVIDIA driver as nvidia-smi prints it, e.g. `580.82.07` (a "
            "three-digit branch and up to three dotted numbers; compared on the branch). "
            "Before R550 (CUDA 12.4's driver) vLLM's CUDA graphs take 3.35x the memory; not "
            "named: R550 or later, and where the CUDA build can run on an older driver (12.x) "
            "the vLLM answer says what one would change and its KV band reaches it."
        ),
    ] = None
    cuda_module_loading: Annotated[
        Literal["lazy", "eager"] | None,
        Meta(
            description="`CUDA_MODULE_LOADING`: `lazy` is the default from CUDA 11.7 with "
            "torch 1.13; `eager` loads every kernel image into the context. Default: from "
            "`torch_version` and `cuda_version`: eager before torch 1.13 (which first sets "
            "`CUDA_MODULE_LOADING=LAZY`) or before CUDA 11.7, lazy otherwise (and when "
            "neither is named)."
        ),
    ] = None
    torch_compile: Annotated[
        bool,
        Meta(
            description="The training program runs under `torch.compile` (torchtune's "
            "`compile: True`, which compiles the chunked loss's upcast and cross-entropy: "
            "the fp32 log-softmax is not saved). Other compiled regions are budgeted as "
            "eager, which is the larger."
        ),
    ] = False
    qlora_upcast: Annotated[
        bool | None,
        Meta(
            description="QLoRA only: whether the parameters the 4-bit base leaves unquantized "
            "(embeddings, LM head) are cast to fp32 for training, as PEFT's "
            "`prepare_model_for_kbit_training` does; fp32 embeddings also make every layer's "
            "input fp32; the cast runs at start-up (a `model_init` phase). `false`: they keep "
            "the model's dtype from the start (axolotl's `embeddings_skip_upcast: true`). "
            "Default: the framework's rule, named in the answer's `stack` (fp32 for PEFT's "
            "scripts and TRL before 0.9.6; the model's dtype for axolotl and TRL 0.9.6-0.24, which "
            "cast them back after the start-up upcast, TRL 0.25+, torchtune, LitGPT, Unsloth)."
        ),
    ] = None
    expandable_segments: Annotated[
        bool | None,
        Meta(
            description="The caching allocator runs with "
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (`PYTORCH_ALLOC_CONF` from "
            "torch 2.9): segments grow by mapping 2 MiB pages instead of being cut into "
            "blocks, so less of the reserved memory is cached and unusable. It changes the "
            "fragmentation part of `allocator_overhead`, not the tensors. Default: the "
            "framework's rule, named in the answer's `stack` (on for axolotl 0.5.2 and later "
            "with torch 2.2 and later, which sets it when the variable is unset; off "
            "otherwise, torch's default)."
        ),
    ] = None
    zero_init: Annotated[
        bool | None,
        Meta(
            description="DeepSpeed ZeRO-3 only: whether the model is built under "
            "`deepspeed.zero.Init`, which partitions each parameter as it is created. "
            "transformers' `from_pretrained` does it when a ZeRO-3 config is active (the "
            "Trainer, Accelerate), as does Lightning's DeepSpeed strategy for a model built "
            "in `configure_model`. `false`: the model is built whole (e.g. `from_pretrained` "
            "before `deepspeed.initialize`), and `deepspeed.initialize` moves it whole to each "
            "device before partitioning it, so every device must hold the whole model once. "
            "Needs `framework` `deepspeed` or `libraries.deepspeed`. Default: `true`."
        ),
    ] = None
    loop_holds_output: Annotated[
        bool,
        Meta(
            description="Training only: the training loop keeps the model's output, and so "
            "its logits, until after the optimizer step, as a hand-written loop that binds "
            "`output = model(...)` and drops it (`output = None`) only after "
            "`optimizer.step()` (Answer.AI's fsdp_qlora `train.py`). The logits then sit "
            "beside the loss's backward tensors. transformers' Trainer and TRL drop them "
            "before the backward; LitGPT's loop, which holds them, has its own rule (the "
            "`litgpt_chunked_cross_entropy` loss). Applies with the `cross_entropy` losses. "
            "Not counted: a loop that never drops them, whose previous logits also live "
            "through the next forward."
        ),
    ] = False

    def __post_init__(self) -> None:
        rules.check(self)


class BudgetRequest(Wire, frozen=True, kw_only=True):
    """Co-located workloads on one device type; each workload keeps its own parallel layout."""

    method: Annotated[
        Literal["analytic", "trace"],
        Meta(
            description="`analytic`: closed-form formulas (microseconds). `trace`: run the "
            "workload's PyTorch code on fake tensors and replay every allocation through a "
            "model of the CUDA caching allocator (seconds; inference and training workloads, "
            "one pipeline stage, no ZeRO)."
        ),
    ] = "analytic"
    trace: Annotated[
        TraceOptions, Meta(description="Options of the trace tier (ignored by `analytic`).")
    ] = TraceOptions()

    workloads: Annotated[
        tuple[Workload, ...],
        Meta(
            min_length=1,
            max_length=16,
            description="Workloads sharing each device (1 .. 16); "
            "with several, the most loaded stage of each is summed on one device.",
        ),
    ]
    device: Annotated[
        DeviceRef | None,
        Meta(
            description="The device type; it fixes the CUDA context and workspace defaults "
            "and dtype warnings. Default: none (generic defaults)."
        ),
    ] = None
    headroom: Annotated[
        Headroom,
        Meta(
            description="Safety margin added to each device's subtotal (an "
            "`llm_serving` workload reports the memory the engine leaves unused "
            "instead)."
        ),
    ] = Headroom()
    software: Annotated[
        Software | None,
        Meta(
            description="Driver, CUDA and torch versions of the target: they choose the "
            "calibration profile (default: any profile of the device)."
        ),
    ] = None
    disk: Annotated[
        DiskOptions,
        Meta(
            description="Which extra copies of the model files the `disk` budget counts "
            "(default: a conversion copy and an update copy of safetensors checkpoints)."
        ),
    ] = DiskOptions()
    allocator_replay: Annotated[
        bool,
        Meta(
            description="Also replay transformers' `generate` through the caching-allocator "
            "model and answer what the allocator will hold beyond the allocated bytes: the "
            "expected `torch.cuda.max_memory_reserved()` and nvidia-smi readings "
            "(`devices[].allocator_cache`; inference workloads on one device; up to a few "
            "seconds). The fit verdict does not change."
        ),
    ] = False

    def __post_init__(self) -> None:
        rules.check(self)


FitVariable = Literal[
    "batch", "context", "concurrency", "device_count", "max_model_len", "gpu_layers", "file_type"
]


class LatencyTarget(Wire, frozen=True, kw_only=True):
    """A latency target for ``/v1/fits`` (inference and ``llm_serving`` workloads): each layout
    gets a roofline estimate of time to first token and time per output token
    (docs/LATENCY.md), and the largest batch that meets the targets."""

    time_per_output_token_ms: Annotated[
        Annotated[float, Meta(gt=0.0, le=600_000.0)] | None,
        Meta(
            description="Largest time per output token (one decode step), ms (0 .. 600,000]; "
            "null: no decode target (the batch is what memory holds)."
        ),
    ] = None
    time_to_first_token_ms: Annotated[
        Annotated[float, Meta(gt=0.0, le=3_600_000.0)] | None,
        Meta(
            description="Largest time to first token (the prompt's prefill, one request), ms "
            "(0 .. 3,600,000]; null: no prefill target."
        ),
    ] = None
    prompt_tokens: Annotated[
        Tokens | None,
        Meta(
            description="Prompt length the targets are for. Default: an inference workload's "
            "prompt_tokens; 1,024 for `llm_serving`."
        ),
    ] = None
    output_tokens: Annotated[
        Tokens | None,
        Meta(
            description="Output length: decode steps are estimated at the last one (context "
            "prompt + output). Default: an inference workload's generated_tokens; 256 for "
            "`llm_serving`."
        ),
    ] = None
    mfu: Annotated[
        float,
        Meta(
            gt=0.0,
            le=1.0,
            description="Model FLOPs utilization assumed for compute-bound steps (0 .. 1]; "
            f"default {MFU_DEFAULT} (docs/LATENCY.md).",
        ),
    ] = MFU_DEFAULT
    mbu: Annotated[
        float,
        Meta(
            gt=0.0,
            le=1.0,
            description="Model bandwidth utilization assumed for memory-bound steps (0 .. 1]; "
            f"default {MBU_DEFAULT} (docs/LATENCY.md).",
        ),
    ] = MBU_DEFAULT


class FitRequest(Wire, frozen=True, kw_only=True):
    """One workload (plus co-located ones) against many GPUs and device counts."""

    workloads: Annotated[
        tuple[Workload, ...],
        Meta(
            min_length=1,
            max_length=16,
            description="The workload to fit first (the one laid "
            "out on device_counts and solved for), then up to 15 co-located ones that keep "
            "their own layouts.",
        ),
    ]
    devices: Annotated[
        Annotated[tuple[DeviceRef, ...], Meta(max_length=MAX_DEVICES)] | None,
        Meta(
            description="Catalog GPUs and custom devices to check (at most 64: each is "
            "checked at every device count); default "
            "(null): the whole catalog."
        ),
    ] = None
    device_counts: Annotated[
        tuple[Annotated[int, Meta(ge=1, le=MAX_FIT_DEVICE_COUNT)], ...],
        Meta(
            min_length=1,
            max_length=16,
            description="Devices per replica to check. The first "
            "workload is laid out on them: inference as tensor parallel within 8-GPU nodes and "
            "pipeline parallel across; training as data parallel over its tensor x pipeline "
            "layout.",
        ),
    ] = (1,)
    headroom: Annotated[
        Headroom, Meta(description="Safety margin added to each device's subtotal.")
    ] = Headroom()
    solve: Annotated[
        tuple[FitVariable, ...],
        Meta(
            description="Maxima to solve. `max_model_len` (and `context`) of an `llm_serving` "
            "workload: the largest max_model_len (llama.cpp / Ollama: context) at which the "
            "engine starts and holds `target_concurrency` sequences; `concurrency`: its maximum "
            "concurrency; `device_count`: the smallest GPU count that reaches "
            "`target_concurrency`; `gpu_layers` (llama.cpp / Ollama): the most layers that fit "
            "on the GPUs; `file_type` (llama.cpp / Ollama): the largest GGUF quantization that "
            "fits whole on the GPUs."
        ),
    ] = ("batch", "context", "concurrency", "device_count", "gpu_layers", "file_type")
    target_concurrency: Annotated[
        Annotated[float, Meta(gt=0.0, le=float(1 << 24))] | None,
        Meta(
            description="`llm_serving` only: a layout fits when the engine starts and its "
            "maximum concurrency at max_model_len is at least this; default (null): when it "
            "starts."
        ),
    ] = None
    prices: Annotated[
        Annotated[
            dict[
                Annotated[str, Meta(min_length=1, max_length=128)],
                Annotated[float, Meta(ge=0.0, le=1e12)],
            ],
            Meta(max_length=256),
        ]
        | None,
        Meta(
            description="Price of one GPU per hour by catalog id or custom device name. Ranks "
            "the cheapest GPU type for an `llm_serving` workload (price x smallest device "
            "count) and, with a latency estimate, every layout by cost per million output "
            "tokens (`cost_ranking`). Default (null): `cheapest` is the fewest devices (ties: "
            "the least memory per device), never a price."
        ),
    ] = None

    latency_target: Annotated[
        LatencyTarget | None,
        Meta(
            description="Inference and `llm_serving` workloads: estimate each layout's time to "
            "first token, time per output token and tokens/s (roofline over the GPU's peak "
            "FLOP/s and bandwidth), and the largest batch that meets the targets. Default "
            "(null): no latency estimate (unless `prices` ask for a cost ranking)."
        ),
    ] = None

    max_device_count: Annotated[
        int,
        Meta(
            ge=1,
            le=MAX_SOLVED_DEVICE_COUNT,
            description="Largest device count tried when solving "
            "`device_count` (1 .. 8, then multiples of 8; at most 256).",
        ),
    ] = 64
    software: Annotated[
        Software | None,
        Meta(
            description="Driver, CUDA and torch versions of the target: they choose each "
            "GPU's calibration profile (default: any profile of the GPU)."
        ),
    ] = None
    disk: Annotated[
        DiskOptions,
        Meta(
            description="Which extra copies of the model files the disk of a layout's budget "
            "counts (`POST /v1/cluster-requests` from this fit: its ephemeral storage); the "
            "fit itself is of device memory."
        ),
    ] = DiskOptions()

    def __post_init__(self) -> None:
        rules.check(self)
