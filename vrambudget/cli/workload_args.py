"""The workload flags ``vrambudget estimate`` and ``vrambudget fit`` share: the model (one of
``--model``, ``--config``, ``--hub``, ``--checkpoint``), the kind and its sizes, precision and
parallelism, and an ``llm_serving`` deployment's engine settings (the names of
:class:`vrambudget.core.spec.LLMServingWorkload`). Each flag names the request field it sets,
so that an error about the field can name the flag (:data:`FLAG_OF`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, get_args

__all__ = [
    "FLAG_OF",
    "UsageError",
    "add_workload_args",
    "model_from_args",
    "model_resolver",
    "reject_with_file",
    "workload_from_args",
]

# Per kind, the defaults of the size flags (None: the flag does not apply to the kind).
_SIZES: dict[str, dict[str, int | None]] = {
    "inference": {"batch": 1, "prompt": 1024, "generate": 256, "concurrency": 1},
    "training": {"batch": 1, "prompt": 1024, "generate": None, "concurrency": None},
    "llm_serving": {"batch": None, "prompt": None, "generate": None, "concurrency": None},
}

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
    "iterations": "--iterations",
    "id": "--model / --gpu",
}
"""The flag that sets a request field (by the field's last name), for error messages."""


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


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The workload flags (the model, the kind, its sizes, precision, parallelism, serving)."""
    from vrambudget.core.dtypes import COMPUTE_DTYPES, WeightDType
    from vrambudget.core.spec import Quantization
    from vrambudget.core.spec.serving import GGUFFileType

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
    ]
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
        for k in ("file_type", "n_ctx", "n_gpu_layers", "n_parallel")
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
    w["parallelism"] = {"tensor": args.tp, "pipeline": args.pp, "data": args.dp}
    return w


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
    if args.kind == "inference":
        if args.checkpointing != "none" or args.zero:
            raise UsageError("--checkpointing / --zero apply to --kind training only")
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
        )
    return workload


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
