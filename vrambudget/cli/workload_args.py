"""The workload flags ``vrambudget estimate`` and ``vrambudget fit`` share: the model (one of
``--model``, ``--config``, ``--hub``, ``--checkpoint``), the kind and its sizes, precision and
parallelism, what a training run trains (full, LoRA, QLoRA) and with which optimizer, the
software stack (:class:`vrambudget.core.spec.Software`), and an ``llm_serving`` deployment's
engine settings (the names of :class:`vrambudget.core.spec.LLMServingWorkload`). Each flag
names the request field it sets, so that an error about the field can name the flag
(:data:`FLAG_OF`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, get_args

import msgspec

__all__ = [
    "FLAG_OF",
    "UsageError",
    "add_workload_args",
    "model_from_args",
    "model_resolver",
    "reject_with_file",
    "request_fields",
    "software_from_args",
    "workload_from_args",
]

# Per kind, the defaults of the size flags (None: the flag does not apply to the kind).
_SIZES: dict[str, dict[str, int | None]] = {
    "inference": {"batch": 1, "prompt": 1024, "generate": 256, "concurrency": 1},
    "training": {"batch": 1, "prompt": 1024, "generate": None, "concurrency": None},
    "llm_serving": {"batch": None, "prompt": None, "generate": None, "concurrency": None},
}

# Training flags, by dest (each sets a field of a training workload; None: not given).
_TRAINING = (
    "finetune",
    "lora_rank",
    "lora_targets",
    "modules_to_save",
    "ensure_weight_tying",
    "optimizer",
    "mixed_precision",
    "grad_accum",
)

# Software-stack flags, by dest (request field `software`; inference and training).
_STACK = ("framework", "library", "torch", "cuda", "expandable_segments")

# Flags that set a field of an llm_serving workload, by dest; the engines each applies to.
_VLLM_SGLANG = ("vllm", "sglang")
_GGUF = ("llama_cpp", "ollama")
_SERVING: dict[str, tuple[str, ...]] = {
    "engine": ("vllm", "sglang", "llama_cpp", "ollama"),
    "engine_version": ("vllm", "sglang", "llama_cpp", "ollama"),
    "max_model_len": _VLLM_SGLANG,
    "gpu_memory_utilization": ("vllm",),
    "max_num_seqs": _VLLM_SGLANG,
    "max_num_batched_tokens": _VLLM_SGLANG,
    "dtype": _VLLM_SGLANG,
    "kv_cache_dtype": _VLLM_SGLANG,
    "enforce_eager": ("vllm",),
    "flashinfer_sampler": ("vllm",),
    "mem_fraction_static": ("sglang",),
    "file_type": _GGUF,
    "n_ctx": _GGUF,
    "n_gpu_layers": _GGUF,
    "n_parallel": _GGUF,
    "n_cpu_moe": ("llama_cpp",),
}

FLAG_OF: dict[str, str] = {
    "batch_size": "--batch",
    "micro_batch_size": "--batch",
    "prompt_tokens": "--prompt",
    "sequence_length": "--prompt",
    "generated_tokens": "--generate",
    "concurrent_requests": "--concurrency",
    "tensor": "--tp",
    "pipeline": "--pp",
    "data": "--dp",
    "zero_stage": "--zero",
    "weights": "--weights",
    "compute": "--compute",
    "quantization": "--quant",
    "method": "--quant",
    "checkpointing": "--checkpointing",
    "engine": "--engine",
    "engine_version": "--engine-version",
    "max_model_len": "--max-model-len",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "dtype": "--dtype",
    "kv_cache_dtype": "--kv-cache-dtype",
    "enforce_eager": "--enforce-eager",
    "flashinfer_sampler": "--flashinfer-sampler",
    "mem_fraction_static": "--mem-fraction-static",
    "file_type": "--file-type",
    "n_ctx": "--n-ctx",
    "n_gpu_layers": "--n-gpu-layers",
    "n_parallel": "--n-parallel",
    "n_cpu_moe": "--n-cpu-moe",
    "iterations": "--iterations",
    "id": "--model / --gpu",
    "rank": "--lora-rank",
    "target_modules": "--lora-targets",
    "modules_to_save": "--modules-to-save",
    "ensure_weight_tying": "--ensure-weight-tying",
    "mixed_precision": "--mixed-precision",
    "gradient_accumulation_steps": "--grad-accum",
    "attention": "--attention",
    "framework": "--framework",
    "framework_version": "--framework",
    "torch_version": "--torch",
    "cuda_version": "--cuda",
    "driver_version": "--driver",
    "expandable_segments": "--expandable-segments",
    "fraction": "--headroom",
    "memory_in_use_bytes": "--memory-in-use",
    "desktop_session": "--desktop",
    **{lib: "--library" for lib in ("transformers", "peft", "trl", "accelerate")},
    **{lib: "--library" for lib in ("bitsandbytes", "deepspeed", "flash_attn", "liger_kernel")},
}
"""The flag that sets a request field (by the field's last name), for error messages."""


def _flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _given(args: argparse.Namespace, dests: tuple[str, ...]) -> list[str]:
    """The flags among ``dests`` that were given, as written (``--no-expandable-segments`` is
    the one flag that gives False)."""
    out = []
    for d in dests:
        value = getattr(args, d, None)
        if value is False and d == "expandable_segments":
            out.append("--no-expandable-segments")
        elif value not in (None, False):
            out.append(_flag_name(d))
    return out


def _serving_quant_methods() -> tuple[str, ...]:
    """``ServingQuantization.method``'s values, read from the type."""
    from msgspec import inspect as mi

    from vrambudget.core.spec import ServingQuantization

    info = mi.type_info(ServingQuantization)
    assert isinstance(info, mi.StructType)
    field = next(f for f in info.fields if f.name == "method")
    t = field.type.type if isinstance(field.type, mi.Metadata) else field.type
    assert isinstance(t, mi.LiteralType)
    return tuple(str(v) for v in t.values)


_ENGINE_FRAMEWORKS = ("vllm", "sglang", "diffusers")
"""Frameworks that ``--framework`` does not take: the serving engines are ``--engine``, and
image generation has no flags here."""


def _library_names() -> tuple[str, ...]:
    """The libraries ``software.libraries`` names, read from the type."""
    from vrambudget.core.spec import Libraries

    return tuple(f.name for f in msgspec.structs.fields(Libraries))


def _mixed_precision_type() -> Any:
    """``TrainingWorkload.mixed_precision``'s Literal, read from the type."""
    from vrambudget.core.spec import TrainingWorkload

    field = next(f for f in msgspec.structs.fields(TrainingWorkload) if f.name == "mixed_precision")
    return get_args(field.type)[0]


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The workload flags (the model, the kind, its sizes, precision, parallelism, training,
    the software stack, serving)."""
    from vrambudget.core.dtypes import COMPUTE_DTYPES, WeightDType
    from vrambudget.core.spec import Quantization
    from vrambudget.core.spec.requests import Framework
    from vrambudget.core.spec.serving import GGUFFileType
    from vrambudget.core.spec.workloads import Attention, Optimizer

    m = p.add_argument_group("the model (exactly one, or --file)")
    m.add_argument("--model", metavar="PRESET", help="a preset id (`vrambudget models` lists them)")
    m.add_argument(
        "--config",
        metavar="FILE",
        help="a model's config.json (any model_type transformers knows)",
    )
    m.add_argument(
        "--hub",
        metavar="OWNER/NAME[@REVISION]",
        help="a Hugging Face Hub repository: its config.json and safetensors headers are fetched "
        "(VRAMBUDGET_HUB_ENDPOINT / _TOKEN or HF_TOKEN for gated repositories)",
    )
    m.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a local checkpoint directory: config.json and the safetensors headers (exact "
        "stored bytes; no tensor data is read)",
    )
    w = p.add_argument_group("the workload")
    w.add_argument(
        "--kind",
        choices=list(_SIZES),
        default="inference",
        help="inference (prefill and decode of --batch sequences), training (one optimizer "
        "step), or llm_serving (a serving engine: see the llm_serving flags); default: "
        "inference",
    )
    w.add_argument(
        "--batch",
        type=int,
        metavar="N",
        help="inference: sequences per forward (default 1); training: micro-batch size (default 1)",
    )
    w.add_argument(
        "--prompt",
        type=int,
        metavar="TOKENS",
        help="inference: prompt tokens; training: sequence length (default 1024)",
    )
    w.add_argument(
        "--generate", type=int, metavar="TOKENS", help="inference: tokens generated (default 256)"
    )
    w.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="inference: concurrent requests of --batch sequences each (default 1)",
    )
    w.add_argument(
        "--weights",
        default="auto",
        choices=["auto", *get_args(WeightDType)],
        help="dtype of unquantized weights (default auto: the checkpoint's torch_dtype)",
    )
    w.add_argument(
        "--compute",
        default="auto",
        choices=["auto", *COMPUTE_DTYPES],
        help="activation dtype (default auto: the weights' dtype)",
    )
    analytic_quant = [t.__struct_config__.tag for t in get_args(Quantization)]
    w.add_argument(
        "--quant",
        choices=sorted({*analytic_quant, *_serving_quant_methods()}),
        help="quantize the linear layers (default: the checkpoint's quantization_config); "
        f"inference / training: {', '.join(analytic_quant)}; llm_serving (vLLM / SGLang "
        f"--quantization): {', '.join(_serving_quant_methods())}",
    )
    w.add_argument(
        "--checkpointing",
        choices=["none", "selective", "full", "offloaded"],
        default="none",
        help="training: activation checkpointing (default none)",
    )
    w.add_argument(
        "--tp", type=int, default=1, metavar="N", help="tensor-parallel degree (default 1)"
    )
    w.add_argument(
        "--pp", type=int, default=1, metavar="N", help="pipeline-parallel stages (default 1)"
    )
    w.add_argument(
        "--dp",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel replicas (default 1; llm_serving: engine replicas)",
    )
    w.add_argument(
        "--zero",
        type=int,
        default=0,
        choices=[0, 1, 2, 3],
        help="training: ZeRO stage, sharding over --dp (default 0)",
    )
    w.add_argument(
        "--attention",
        choices=list(get_args(get_args(Attention)[0])),
        help="inference / training: attention implementation; eager materializes the scores "
        "(default: sdpa)",
    )
    t = p.add_argument_group("training (with --kind training)")
    t.add_argument(
        "--finetune",
        choices=["full", "lora", "qlora"],
        help="what is trained: every parameter (default), LoRA adapters on a frozen base, or "
        "QLoRA (LoRA on a bitsandbytes 4-bit NF4 base with double quantization)",
    )
    t.add_argument(
        "--lora-rank",
        type=int,
        metavar="R",
        help="LoRA / QLoRA: adapter rank (default 16)",
    )
    t.add_argument(
        "--lora-targets",
        metavar="NAMES",
        help="LoRA / QLoRA: comma-separated module names that get adapters, as the modelling "
        "code calls them (default q_proj,k_proj,v_proj,o_proj), or all-linear (PEFT's "
        "shorthand: every projection of the layers, the LM head excepted)",
    )
    t.add_argument(
        "--modules-to-save",
        metavar="NAMES",
        help="LoRA / QLoRA: comma-separated modules trained whole beside the adapters (PEFT's "
        "modules_to_save, e.g. embed_tokens,lm_head to learn new tokens): each adds a "
        "trainable copy with its gradients and optimizer state",
    )
    t.add_argument(
        "--ensure-weight-tying",
        action="store_true",
        default=None,
        help="LoRA / QLoRA with --modules-to-save: PEFT's ensure_weight_tying (a tied LM head "
        "shares the embedding's trainable copy)",
    )
    t.add_argument(
        "--optimizer",
        choices=[c.__struct_config__.tag for c in get_args(Optimizer)],
        help="optimizer (default adamw, torch's foreach implementation; adamw_8bit: "
        "bitsandbytes' 8-bit AdamW)",
    )
    t.add_argument(
        "--mixed-precision",
        choices=list(get_args(_mixed_precision_type())),
        help="master_fp32 (default: 16-bit weights and gradients, fp32 masters and moments), "
        "autocast (fp32 parameters, 16-bit compute: torch.autocast, Trainer's bf16=True on an "
        "fp32 model) or pure (everything in the weights' dtype)",
    )
    t.add_argument(
        "--grad-accum",
        type=int,
        metavar="N",
        help="micro-batches per optimizer step (default 1; above 1 the gradients stay live "
        "between them)",
    )
    p.add_argument(
        "--headroom",
        type=float,
        metavar="FRACTION",
        help="memory kept free on top of the estimate, a fraction of the device subtotal in "
        "[0, 0.9] (default: up to the error band's high end, docs/ACCURACY.md)",
    )
    k = p.add_argument_group(
        "the software stack (inference and training; what is not named is the current "
        "release, and the answer lists every behaviour it assumed)"
    )
    k.add_argument(
        "--framework",
        metavar="NAME[==VERSION]",
        help="what runs the workload, optionally with its release: one of "
        f"{', '.join(f for f in get_args(Framework) if f not in _ENGINE_FRAMEWORKS)} "
        "(e.g. axolotl==0.9.1, transformers==4.46.3; default transformers)",
    )
    k.add_argument(
        "--library",
        action="append",
        metavar="NAME==VERSION",
        help="a library's release, repeatable (e.g. --library peft==0.13.2 --library "
        f"trl==0.24.0); one of {', '.join(_library_names())}",
    )
    k.add_argument("--torch", metavar="VERSION", help="torch release, e.g. 2.5.1 (major.minor)")
    k.add_argument("--cuda", metavar="VERSION", help="CUDA runtime of the torch build, e.g. 12.4")
    k.add_argument(
        "--driver",
        metavar="VERSION",
        help="NVIDIA driver, e.g. 535.247.01: the compatibility checks, and vLLM's CUDA graphs "
        "(3.35x the memory before R550; default: R550 or later, and a CUDA 12.x build's answer "
        "says what an older one would change)",
    )
    k.add_argument(
        "--expandable-segments",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the caching allocator runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "(or, with --no-expandable-segments, without it): the fragmentation part of "
        "allocator_overhead, and the trace's allocator replay (default: the framework's rule; "
        "axolotl 0.5.2+ with torch 2.2+ sets it)",
    )
    s = p.add_argument_group(
        "llm_serving (with --kind llm_serving; each flag names the engines it applies to)"
    )
    s.add_argument(
        "--engine",
        choices=list(_SERVING["engine"]),
        help="the serving engine (default vllm)",
    )
    s.add_argument(
        "--engine-version",
        metavar="VERSION",
        help="the engine release (0.11.2, b6500); default: the newest modelled "
        "(docs/SERVING.md lists them)",
    )
    s.add_argument(
        "--max-model-len",
        type=int,
        metavar="TOKENS",
        help="vLLM / SGLang: longest request, prompt + output (default: the model's context)",
    )
    s.add_argument(
        "--gpu-memory-utilization",
        type=float,
        metavar="FRACTION",
        help="vLLM: the share of each GPU the engine may use, in (0, 1] (default: the "
        "release's own, docs/SERVING.md)",
    )
    s.add_argument(
        "--max-num-seqs",
        type=int,
        metavar="N",
        help="vLLM / SGLang: sequences per engine step (default: the engine's for the GPU)",
    )
    s.add_argument(
        "--max-num-batched-tokens",
        type=int,
        metavar="N",
        help="vLLM / SGLang: tokens per engine step (default: the engine's for the GPU)",
    )
    s.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="vLLM / SGLang: model dtype (default auto: the checkpoint's)",
    )
    s.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
        help="vLLM / SGLang: KV-cache dtype (default auto: the model dtype)",
    )
    s.add_argument(
        "--enforce-eager", action="store_true", help="vLLM: no CUDA graphs (no graph memory)"
    )
    s.add_argument(
        "--flashinfer-sampler",
        action="store_true",
        help="vLLM: VLLM_USE_FLASHINFER_SAMPLER=1 (or a 0.10-0.11 image with flashinfer): the "
        "warm-up sampler sorts nothing",
    )
    s.add_argument(
        "--mem-fraction-static",
        type=float,
        metavar="FRACTION",
        help="SGLang: the share of GPU memory for weights and the KV pool, in (0, 1) "
        "(default: the release's automatic value)",
    )
    s.add_argument(
        "--file-type",
        choices=list(get_args(GGUFFileType)),
        metavar="TYPE",
        help="llama.cpp / Ollama: the GGUF quantization (default Q4_K_M; one of "
        f"{', '.join(get_args(GGUFFileType))})",
    )
    s.add_argument(
        "--n-ctx",
        type=int,
        metavar="TOKENS",
        help="llama.cpp / Ollama: context size -c [num_ctx] (default: the engine's)",
    )
    s.add_argument(
        "--n-gpu-layers",
        type=int,
        metavar="N",
        help="llama.cpp / Ollama: layers on the GPUs -ngl (default: all / as many as fit)",
    )
    s.add_argument(
        "--n-parallel",
        type=int,
        metavar="N",
        help="llama.cpp / Ollama: request slots -np [OLLAMA_NUM_PARALLEL] (default: the engine's)",
    )
    s.add_argument(
        "--n-cpu-moe",
        type=int,
        metavar="N",
        help="llama.cpp: the expert weights of the first N layers stay in host memory "
        "(--n-cpu-moe; default 0)",
    )


def model_from_args(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The model of ``--model``, ``--config``, ``--hub`` or ``--checkpoint`` (exactly one)."""
    given = [a for a in ("model", "config", "hub", "checkpoint") if getattr(args, a)]
    if len(given) != 1:
        raise UsageError(
            f"{command}: give one of --model PRESET, --config config.json, "
            "--hub OWNER/NAME[@REV], --checkpoint DIR"
            + (" (or --file FILE)" if command == "estimate" else "")
            + (f"; got {', '.join('--' + g for g in given)}" if given else "")
        )
    if args.model:
        return {"source": "preset", "id": args.model}
    if args.config:
        try:
            return {"source": "hf_config", "config": json.loads(Path(args.config).read_bytes())}
        except (OSError, ValueError) as exc:
            raise UsageError(f"--config {args.config}: {exc}") from None
    if args.hub:
        repo, _, revision = args.hub.partition("@")
        return {"source": "hub", "id": repo, "revision": revision or None}
    from vrambudget.trace.models import local_checkpoint_model

    return local_checkpoint_model(args.checkpoint)


class UsageError(Exception):
    """Flags that do not make a request (exit 2, the message as is)."""


def reject_with_file(args: argparse.Namespace) -> None:
    """``--file`` is the whole request: a model or serving flag beside it would be ignored, so
    it is an error instead."""
    given = [
        flag
        for dest, flag in (
            ("model", "--model"),
            ("config", "--config"),
            ("hub", "--hub"),
            ("checkpoint", "--checkpoint"),
            *((d, FLAG_OF[d]) for d in _SERVING),
        )
        if getattr(args, dest) not in (None, False)
    ] + _given(args, (*_TRAINING, *_STACK, "driver", "attention", "headroom"))
    if given:
        raise UsageError(f"--file is the whole request: drop {', '.join(given)}")


def _serving_workload(args: argparse.Namespace, model: dict[str, Any]) -> dict[str, Any]:
    engine = args.engine or "vllm"
    for dest, engines in _SERVING.items():
        value = getattr(args, dest)
        if value not in (None, False) and engine not in engines:
            raise UsageError(
                f"{FLAG_OF[dest]} applies to engine {' / '.join(engines)}, not {engine} "
                f"(--engine {engine})"
            )
    w: dict[str, Any] = {"kind": "llm_serving", "engine": engine, "model": model}
    for dest in (
        "engine_version",
        "max_model_len",
        "gpu_memory_utilization",
        "max_num_seqs",
        "max_num_batched_tokens",
        "dtype",
        "kv_cache_dtype",
    ):
        if getattr(args, dest) is not None:
            w[dest] = getattr(args, dest)
    if args.enforce_eager:
        w["enforce_eager"] = True
    if args.flashinfer_sampler:
        w["flashinfer_sampler"] = True
    if args.mem_fraction_static is not None:
        w["sglang"] = {"mem_fraction_static": args.mem_fraction_static}
    gguf = {
        k: getattr(args, k)
        for k in ("file_type", "n_ctx", "n_gpu_layers", "n_parallel", "n_cpu_moe")
        if getattr(args, k) is not None
    }
    if gguf:
        w["gguf"] = gguf
    if args.quant:
        methods = _serving_quant_methods()
        if args.quant not in methods:
            raise UsageError(
                f"--quant {args.quant}: for --kind llm_serving, allowed: {', '.join(methods)}"
            )
        w["quantization"] = {"method": args.quant}
    if args.weights != "auto" or args.compute != "auto":
        raise UsageError("--weights / --compute: for --kind llm_serving use --dtype")
    if args.checkpointing != "none" or args.zero:
        raise UsageError("--checkpointing / --zero apply to --kind training only")
    _only_training(args)
    # the CUDA build stays a choice (vLLM publishes wheels per CUDA release): the compatibility
    # checks read it beside --driver
    stack = _given(args, (*(d for d in _STACK if d != "cuda"), "attention"))
    if stack:
        raise UsageError(
            f"{', '.join(stack)}: not for --kind llm_serving; the engine and its release "
            "(--engine, --engine-version) fix its stack and attention kernels (--cuda and "
            "--driver apply)"
        )
    w["parallelism"] = {"tensor": args.tp, "pipeline": args.pp, "data": args.dp}
    return w


def _only_training(args: argparse.Namespace) -> None:
    given = _given(args, _TRAINING)
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise UsageError(f"{', '.join(given)}: {verb} to --kind training only")


def _training_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The training workload's fields the training flags set (none: the request's defaults)."""
    out: dict[str, Any] = {}
    lora = args.finetune in ("lora", "qlora")
    lora_flags = (args.lora_rank, args.lora_targets, args.modules_to_save, args.ensure_weight_tying)
    if not lora and any(f is not None for f in lora_flags):
        raise UsageError(
            "--lora-rank / --lora-targets / --modules-to-save need --finetune lora or qlora"
        )
    if args.finetune:
        method: dict[str, Any] = {"kind": args.finetune}
        if args.lora_rank is not None:
            method["rank"] = args.lora_rank
        if args.lora_targets is not None:
            method["target_modules"] = _targets(args.lora_targets)
        if args.ensure_weight_tying:
            method["ensure_weight_tying"] = True
        if args.modules_to_save is not None:
            method["modules_to_save"] = [
                n.strip() for n in args.modules_to_save.split(",") if n.strip()
            ]
        out["method"] = method
    if args.optimizer:
        out["optimizer"] = {"name": args.optimizer}
    if args.mixed_precision:
        out["mixed_precision"] = args.mixed_precision
    if args.grad_accum is not None:
        out["gradient_accumulation_steps"] = args.grad_accum
    return out


def _targets(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--lora-targets: give module names, e.g. q_proj,v_proj")
    if "all-linear" in names and len(names) > 1:
        raise UsageError("--lora-targets: all-linear stands alone (every projection already)")
    return names


def request_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The request-level fields the flags set, shared by a budget and a fit: ``software`` (the
    stack flags) and ``headroom`` (``--headroom``); absent where no flag sets them."""
    out: dict[str, Any] = {}
    software = software_from_args(args)
    if software:
        out["software"] = software
    if args.headroom is not None:
        out["headroom"] = {"fraction": args.headroom}
    return out


def software_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The request's ``software`` the stack flags describe (None: none given)."""
    sw: dict[str, Any] = {}
    if args.framework:
        name, sep, version = args.framework.partition("==")
        sw["framework"] = name.strip()
        if sep:
            sw["framework_version"] = version.strip()
    libraries: dict[str, str] = {}
    for item in args.library or ():
        name, sep, version = item.partition("==")
        name = name.strip().replace("-", "_")
        if not sep or not version.strip():
            raise UsageError(f"--library {item}: give NAME==VERSION, e.g. peft==0.13.2")
        if name not in _library_names():
            raise UsageError(f"--library {item}: allowed names: {', '.join(_library_names())}")
        libraries[name] = version.strip()
    if libraries:
        sw["libraries"] = libraries
    if args.torch:
        sw["torch_version"] = args.torch
    if args.cuda:
        sw["cuda_version"] = args.cuda
    if args.driver:
        sw["driver_version"] = args.driver
    if args.expandable_segments is not None:
        sw["expandable_segments"] = args.expandable_segments
    return sw or None


def workload_from_args(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The workload (as JSON data) the flags describe; a :class:`UsageError` for a flag that
    does not apply to the kind or engine."""
    model = model_from_args(args, command)
    sizes = _SIZES[args.kind]
    for dest, default in sizes.items():
        if default is None and getattr(args, dest) is not None:
            hint = (
                " (a serving engine sizes its batch itself: --max-num-seqs)"
                if (args.kind == "llm_serving")
                else ""
            )
            raise UsageError(f"--{dest} does not apply to --kind {args.kind}{hint}")
    if args.kind == "llm_serving":
        return _serving_workload(args, model)
    for dest in _SERVING:
        if getattr(args, dest) not in (None, False):
            raise UsageError(f"{FLAG_OF[dest]} applies to --kind llm_serving only")

    def size(dest: str) -> int:
        value = getattr(args, dest)
        return int(sizes[dest] if value is None else value)  # type: ignore[arg-type]

    workload: dict[str, Any] = {
        "kind": args.kind,
        "model": model,
        "precision": {"weights": args.weights, "compute": args.compute},
        "parallelism": {
            "tensor": args.tp,
            "pipeline": args.pp,
            "data": args.dp,
            "zero_stage": args.zero,
        },
    }
    if args.quant:
        from vrambudget.core.spec import Quantization

        tags = [t.__struct_config__.tag for t in get_args(Quantization)]
        if args.quant not in tags:
            raise UsageError(
                f"--quant {args.quant}: for --kind {args.kind}, allowed: {', '.join(tags)}"
            )
        workload["precision"]["quantization"] = {"scheme": args.quant}
    framework = args.framework.partition("==")[0].strip() if args.framework else None
    if framework is not None and (
        framework in _ENGINE_FRAMEWORKS or framework not in _frameworks()
    ):
        engine = " (a serving engine is --kind llm_serving --engine)" * (
            framework in ("vllm", "sglang")
        )
        raise UsageError(
            f"--framework {args.framework}{engine}: allowed: "
            f"{', '.join(f for f in _frameworks() if f not in _ENGINE_FRAMEWORKS)}"
        )
    if args.attention:
        workload["attention"] = args.attention
    if args.kind == "inference":
        if args.checkpointing != "none" or args.zero:
            raise UsageError("--checkpointing / --zero apply to --kind training only")
        _only_training(args)
        workload.update(
            batch_size=size("batch"),
            prompt_tokens=size("prompt"),
            generated_tokens=size("generate"),
            concurrent_requests=size("concurrency"),
        )
    else:
        workload.update(
            micro_batch_size=size("batch"),
            sequence_length=size("prompt"),
            checkpointing=args.checkpointing,
            **_training_fields(args),
        )
    return workload


def _frameworks() -> tuple[str, ...]:
    from vrambudget.core.spec.requests import Framework

    return get_args(Framework)


def _missing_framework() -> str | None:
    """The first package a framework resolution imports (lazily, at the first model that needs
    it) that is not installed, or None."""
    import importlib.util

    return next((m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None), None)


def _no_framework(missing: str) -> Any:
    """Without the trace extra: models that need the framework are refused, naming it."""
    from vrambudget.core.errors import InvalidWorkload
    from vrambudget.core.resolve import needs_resolution

    def resolve(workloads: tuple[Any, ...]) -> tuple[Any, ...]:
        for i, w in enumerate(workloads):
            spec = getattr(w, "speculative", None)
            for where, model in (
                ("model", getattr(w, "model", None)),
                ("speculative.model", getattr(spec, "model", None) if spec else None),
            ):
                if model is not None and needs_resolution(model):
                    raise InvalidWorkload(
                        f"workloads[{i}].{where}",
                        f"needs the framework ({missing} is not installed): "
                        "pip install 'vrambudget[trace]'",
                    )
        return workloads

    return resolve


def model_resolver() -> Any:
    """``resolve(workloads) -> workloads`` with every model resolved in this process as the
    service resolves it (Hub fetches, framework inventories), or, without the framework
    installed, one that refuses the models that need it."""
    missing = _missing_framework()
    if missing:
        return _no_framework(missing)
    from vrambudget.trace.models import resolve_models

    return resolve_models


DESKTOP_ARG: dict[str, Any] = {
    "choices": ("windows", "linux", "none"),
    "help": "the --gpu also drives a desktop session: windows (native, WSL2 or Docker "
    "Desktop), linux (Xorg / Wayland), or none (headless); without --memory-in-use the "
    "desktop's published hold is assumed and the verdict holds at its high end",
}
"""``--desktop`` of ``estimate`` and ``fit`` (``device.desktop_session``)."""
