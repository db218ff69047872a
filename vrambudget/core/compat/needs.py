"""What a request needs of the device and its software, and what the device offers: the two
inputs of the compatibility rules, extracted once per request (``needs_of``) and once per device
type (``device_facts``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..device import DeviceContext
from ..errors import InvalidWorkload
from ..memo import BoundedCache
from ..resolve import resolve_model
from ..serving.engine_args import model_dtype, serving_quantization
from ..serving.releases import engine_release
from ..spec import QLoRA, Software, Workload
from ..spec.diffusion import ImageGenerationWorkload
from ..spec.precision import (
    AWQ,
    FP8,
    GPTQ,
    MXFP4,
    NVFP4,
    BitsAndBytes4bit,
    CompressedTensors,
    Int8,
    Quantization,
)
from ..spec.serving import LLMServingWorkload
from ..spec.workloads import AdamW8bit, InferenceWorkload, TrainingWorkload
from ..stack import CURRENT, PINNED, resolve_stack, version_tuple
from .build import stack_build

__all__ = ["DeviceFacts", "Needs", "device_facts", "needs_of"]

_ENGINES = ("vllm", "sglang", "llama_cpp", "ollama")


@dataclass(frozen=True, slots=True)
class Needs:
    """What the workloads need, in the rules' terms (hashable: the rules' memo key)."""

    framework: str
    framework_version: str
    """The named version, or the default (the engine's newest modelled release, the current)."""
    version_named: bool
    dtypes: frozenset[str]
    """Weights and compute dtypes of the model workloads (fp32, fp16, bf16, fp8)."""
    quant: frozenset[str]
    """awq, gptq, fp8, mxfp4, nvfp4, bnb_4bit, bnb_int8, bnb_optim8bit, ct_int8, ct_wna16,
    ct_fp8, ct_other."""
    flash_attention: bool
    flash_attn_version: str | None
    bnb_version: str
    bnb_named: bool
    torch_version: str
    torch_basis: str
    """How the torch release is known: ``named``, ``pinned by vllm 0.33.0``, ``current``."""
    cuda: tuple[int, int] | None
    cuda_basis: str
    rocm: tuple[int, ...] | None
    driver: tuple[int, ...] | None
    driver_text: str | None
    sdpa_calls: frozenset[tuple[str, int, int, int]] = frozenset()
    """(compute dtype, heads, K/V heads, head dim) of each model workload whose attention is
    transformers' SDPA (asked for, not soft-capped -- which falls back to eager -- nor latent);
    empty for frameworks with their own attention code."""
    sdpa_native_gqa: bool = True
    """transformers passes grouped K/V heads to SDPA as they are
    (:attr:`vrambudget.core.stack.Stack.sdpa_native_gqa`)."""


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    name: str
    vendor: str
    cc: tuple[int, int] | None
    gfx: str | None
    native_dtypes: frozenset[str]
    custom: bool
    driver_cuda: tuple[int, int] | None = None
    """The newest CUDA the installed driver supports (live, from NVML); None from the catalog."""


def device_facts(ctx: DeviceContext) -> DeviceFacts:
    cc = None
    if ctx.compute_capability:
        major, _, minor = ctx.compute_capability.partition(".")
        cc = (int(major), int(minor or 0))
    return DeviceFacts(
        name=ctx.name,
        vendor=ctx.vendor,
        cc=cc,
        gfx=ctx.gfx_target,
        native_dtypes=ctx.native_dtypes,
        custom=ctx.id is None,
    )


def _quant_kinds(q: Quantization | object | None) -> set[str]:
    match q:
        case None:
            return set()
        case AWQ():
            return {"awq"}
        case GPTQ():
            return {"gptq"}
        case FP8():
            return {"fp8"}
        case MXFP4():
            return {"mxfp4"}
        case NVFP4():
            return {"nvfp4"}
        case BitsAndBytes4bit():
            return {"bnb_4bit"}
        case Int8():
            return {"bnb_int8"}
        case CompressedTensors():
            if q.type == "float" and q.num_bits == 8:
                return {"ct_fp8"}
            if q.type == "int" and q.num_bits == 8 and q.format == "int-quantized":
                return {"ct_int8"}
            if q.type == "int" and q.num_bits in (4, 8):
                return {"ct_wna16"}
            return {"ct_other"}
    return set()


def _sdpa_call(w: Workload) -> tuple[str, int, int, int] | None:
    """(compute dtype, heads, K/V heads, head dim) of the workload's SDPA attention, or None:
    not SDPA, soft-capped (eager runs), latent attention, or a model not resolved here."""
    model = getattr(w, "model", None)
    precision = getattr(w, "precision", None)
    if getattr(w, "attention", None) != "sdpa" or model is None or precision is None:
        return None
    if precision.compute == "auto":  # not deployed: the dtype is not known here
        return None
    try:
        arch = resolve_model(model)
    except (InvalidWorkload, ValueError, KeyError):
        return None
    if arch.attention_softcap or arch.mla is not None:
        return None
    return (precision.compute, arch.num_heads, arch.num_kv_heads, arch.head_dim)


def needs_of(workloads: tuple[Workload, ...], software: Software | None) -> Needs:
    """What the (deployed) workloads need; the first serving workload names the engine.
    Model workloads' needs are cached by what they read of them (a budget of another batch
    or context needs the same)."""
    if not all(type(w) in _MODEL_KINDS for w in workloads):
        return _needs_of(workloads, software)
    key = (
        tuple(
            [
                (
                    type(w),
                    w.model,  # type: ignore[union-attr]
                    w.precision,  # type: ignore[union-attr]
                    w.attention,  # type: ignore[union-attr]
                    getattr(w, "method", None),
                    getattr(w, "optimizer", None),
                )
                for w in workloads
            ]
        ),
        software,
    )
    hit = _NEEDS.get(key)
    return hit if hit is not None else _NEEDS.put(key, _needs_of(workloads, software))


_MODEL_KINDS = (InferenceWorkload, TrainingWorkload)
_NEEDS: BoundedCache[tuple[object, ...], Needs] = BoundedCache(1024)


def _needs_of(workloads: tuple[Workload, ...], software: Software | None) -> Needs:
    sw = software or Software()
    dtypes: set[str] = set()
    quant: set[str] = set()
    flash = False
    sdpa_calls: set[tuple[str, int, int, int]] = set()
    framework: str = sw.framework or "transformers"
    version = sw.framework_version
    for w in workloads:
        if isinstance(w, LLMServingWorkload):
            framework = w.engine
            version = w.engine_version
            if w.engine in ("vllm", "sglang"):
                dtypes.add(model_dtype(w))
                quant |= _quant_kinds(serving_quantization(w))
            continue
        precision = getattr(w, "precision", None)
        if isinstance(w, ImageGenerationWorkload):
            framework = sw.framework or "diffusers"
            if precision is not None:  # null: the pipeline's own (the image budget warns)
                dtypes.add(precision)
        elif precision is not None:
            dtypes |= {d for d in (precision.weights, precision.compute) if d != "auto"}
            quant |= _quant_kinds(getattr(precision, "quantization", None))
        if isinstance(w, TrainingWorkload):
            if isinstance(w.method, QLoRA):
                quant.add("bnb_4bit")
            if isinstance(w.optimizer, AdamW8bit):
                quant.add("bnb_optim8bit")
        if getattr(w, "attention", None) == "flash":
            flash = True
        call = _sdpa_call(w)
        if call is not None:
            sdpa_calls.add(call)
    named = version is not None
    if version is None:
        if framework in _ENGINES:
            version = engine_release(framework, None).modelled
        else:
            version = CURRENT.get(framework, "")
    build = stack_build(framework, version, software)
    driver = version_tuple(sw.driver_version) if sw.driver_version else None
    stack = resolve_stack(software)
    bnb = sw.libraries.bitsandbytes
    bnb_named = bnb is not None
    if bnb is None:
        pin = PINNED.get(framework, {}).get("bitsandbytes")
        bnb = (
            pin[1]
            if pin is not None and version_tuple(version) < pin[0]
            else CURRENT["bitsandbytes"]
        )
    return Needs(
        framework=framework,
        framework_version=version,
        version_named=named,
        dtypes=frozenset(dtypes),
        quant=frozenset(quant),
        flash_attention=flash,
        sdpa_calls=frozenset(sdpa_calls) if stack.transformers_version is not None else frozenset(),
        sdpa_native_gqa=stack.sdpa_native_gqa,
        flash_attn_version=sw.libraries.flash_attn,
        bnb_version=bnb,
        bnb_named=bnb_named,
        torch_version=build.torch_version,
        torch_basis=build.torch_basis,
        cuda=build.cuda,
        cuda_basis=build.cuda_basis,
        rocm=version_tuple(sw.rocm_version) if sw.rocm_version else None,
        driver=driver,
        driver_text=sw.driver_version,
    )
