"""The compatibility rules: each takes what the workloads need and what the device offers and
answers an outcome (or None where it does not apply), with the source of its facts
(:data:`vrambudget.core.compat.facts.SOURCES`)."""

from __future__ import annotations

from collections.abc import Callable

from ..formulas.sdpa import flash_hardware_cc, mem_efficient_gqa, transformers_sdpa_backend
from ..result import CompatibilityVerdict, RuleOutcome
from ..stack import version_tuple
from .facts import (
    BNB_CUDA_MIN_CC,
    BNB_ROCM_FIRST,
    BNB_ROCM_TARGETS,
    CUDA_ARCH_MIN,
    CUDA_DROPS_BELOW_CC,
    CUDA_FAMILY_MIN_DRIVER,
    CUDA_TOOLKIT_DRIVER,
    FA2_CK_TARGETS,
    SGLANG_ROCM_NAMED,
    SOURCES,
    VLLM_HIP_TARGETS,
    VLLM_MIN_CAPABILITY,
)
from .needs import DeviceFacts, Needs

__all__ = ["RULES", "Rule"]

Rule = Callable[[Needs, DeviceFacts], RuleOutcome | None]


def _out(
    rule: str, verdict: CompatibilityVerdict, reason: str, source: str, remedy: str | None = None
) -> RuleOutcome:
    return RuleOutcome(
        rule=rule, verdict=verdict, reason=reason, remedy=remedy, source=SOURCES[source]
    )


def _v(t: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in t)


def _sm(cc: tuple[int, int]) -> str:
    return f"sm{cc[0]}{cc[1]}"


def _cuda_words(n: Needs) -> str:
    return f"CUDA {_v(n.cuda)} ({n.cuda_basis})" if n.cuda else f"CUDA unknown ({n.cuda_basis})"


# ------------------------------------------------------------------------------- CUDA ----


def cuda_arch(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """The CUDA build must target the device: Blackwell needs CUDA >= 12.8; CUDA 13 dropped
    compute capabilities below 7.5 (Volta and older)."""
    if d.vendor != "nvidia" or d.cc is None:
        return None
    need = CUDA_ARCH_MIN.get(d.cc[0])
    dropped = [(m, cc) for m, cc in CUDA_DROPS_BELOW_CC.items() if d.cc < cc]
    if need is None and not dropped:
        return None
    rule = "cuda.architecture"
    if n.cuda is None:
        return _out(
            rule,
            "unknown",
            f"which CUDA the build uses is not known ({n.cuda_basis}); {d.name} ({_sm(d.cc)}) "
            "runs only on some",
            need[1] if need else "cuda_arch_dropped",
            "name software.cuda_version (or a torch_version with its +cuXYZ build)",
        )
    if need is not None and n.cuda < need[0]:
        return _out(
            rule,
            "unsupported",
            f"{d.name} ({_sm(d.cc)}) needs CUDA >= {_v(need[0])}; the build is {_cuda_words(n)}",
            need[1],
            f"use a CUDA >= {_v(need[0])} build (torch >= 2.8 from PyPI ships CUDA 12.8)",
        )
    for major, below in dropped:
        if n.cuda[0] >= major:
            return _out(
                rule,
                "unsupported",
                f"CUDA {major}.0 and later do not target compute capability below "
                f"{_v(below)}: {d.name} is {_sm(d.cc)}; the build is {_cuda_words(n)}",
                "cuda_arch_dropped",
                f"use a CUDA {major - 1}.x build (e.g. torch 2.10 with CUDA 12.8: "
                "software.torch_version '2.10.0+cu128')",
            )
    return _out(
        rule,
        "supported",
        f"{_cuda_words(n)} targets {d.name} ({_sm(d.cc)})",
        need[1] if need else "cuda_arch_dropped",
    )


def cuda_driver(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """The driver must run the CUDA runtime: the toolkit's own driver (Table 3), or at least the
    major's minimum for minor-version compatibility (Table 2)."""
    if d.vendor != "nvidia" or n.driver is None:
        return None
    rule = "cuda.driver_minimum"
    cuda = n.cuda
    if cuda is None and d.cc is not None and d.cc[0] in CUDA_ARCH_MIN:
        cuda = CUDA_ARCH_MIN[d.cc[0]][0]  # the device needs at least this one
    if cuda is None:
        return _out(
            rule,
            "unknown",
            f"driver {n.driver_text}: the CUDA runtime it must run is not known ({n.cuda_basis})",
            "cuda_driver",
            "name software.cuda_version",
        )
    family = CUDA_FAMILY_MIN_DRIVER.get(cuda[0])
    own_text = CUDA_TOOLKIT_DRIVER.get(cuda)
    own = version_tuple(own_text) if own_text else None
    if family is None and own is None:
        return _out(
            rule,
            "unknown",
            f"CUDA {_v(cuda)}'s minimum driver is not in the table read (11.0 .. 13.2)",
            "cuda_driver",
        )
    if family is not None and n.driver[0] < family:
        return _out(
            rule,
            "unsupported",
            f"driver {n.driver_text} is below {family}, the minimum for any CUDA {cuda[0]}.x "
            f"runtime; the build is CUDA {_v(cuda)} ({n.cuda_basis if n.cuda else d.name})",
            "cuda_driver",
            f"upgrade the driver to >= {own_text or family} (CUDA {_v(cuda)}'s own), or "
            "use a build for an older CUDA the device supports",
        )
    if own is not None and n.driver < own:
        return _out(
            rule,
            "supported",
            f"driver {n.driver_text} is below CUDA {_v(cuda)}'s own {own_text} but within "
            f"CUDA {cuda[0]}.x minor-version compatibility (>= {family}): kernels that need "
            "PTX JIT of newer code may still fail",
            "cuda_driver",
        )
    return _out(rule, "supported", f"driver {n.driver_text} runs CUDA {_v(cuda)}", "cuda_driver")


def cuda_driver_supports(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """Live: the installed driver (NVML's CUDA driver version) must support the runtime's CUDA
    major (minor versions run by minor-version compatibility)."""
    if d.driver_cuda is None or n.cuda is None:
        return None
    rule = "cuda.driver_supports"
    if n.cuda[0] > d.driver_cuda[0]:
        return _out(
            rule,
            "unsupported",
            f"the driver supports CUDA up to {_v(d.driver_cuda)}; the build is {_cuda_words(n)}",
            "nvml_cuda_driver",
            f"upgrade the driver to one for CUDA {n.cuda[0]}.x, or install a CUDA "
            f"{d.driver_cuda[0]}.x build",
        )
    return _out(
        rule,
        "supported",
        f"the driver supports CUDA up to {_v(d.driver_cuda)}; the build is {_cuda_words(n)}",
        "nvml_cuda_driver",
    )


# ------------------------------------------------------------------------------ dtypes ---


def bf16(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """bf16 below compute capability 8.0: vLLM refuses it; torch emulates it."""
    if "bf16" not in n.dtypes or d.vendor != "nvidia" or d.cc is None or d.cc >= (8, 0):
        return None
    rule = "dtype.bf16"
    if n.framework == "vllm":
        return _out(
            rule,
            "unsupported",
            f"vLLM refuses bfloat16 below compute capability 8.0: {d.name} is {_sm(d.cc)}",
            "vllm_bf16",
            "serve in float16 (dtype: float16)",
        )
    return _out(
        rule,
        "supported",
        f"{d.name} ({_sm(d.cc)}) has no native bf16 support: torch emulates bf16 (slower than "
        "fp16, which is native)",
        "torch_bf16",
    )


def native_dtypes(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """A custom device has no compute capability: its native_dtypes are all that is known."""
    if not d.custom or d.cc is not None:
        return None
    names = {"fp8": "fp8_e4m3"}
    missing = sorted(t for t in n.dtypes if names.get(t, t) not in d.native_dtypes)
    if not missing:
        return None
    return _out(
        "dtype.native",
        "unknown",
        f"{d.name} has no native {', '.join(missing)} support: kernels fall back or fail "
        "(no compute capability is known for a custom device)",
        "custom_native",
        "use a catalog GPU, or a dtype in the device's native_dtypes",
    )


def _vllm_table(version: str) -> tuple[str, dict[str, int]]:
    v = version_tuple(version)
    rows = sorted(VLLM_MIN_CAPABILITY, key=version_tuple)
    at = max((r for r in rows if version_tuple(r) <= v), key=version_tuple, default=rows[0])
    return at, VLLM_MIN_CAPABILITY[at]


_VLLM_METHOD = {
    "awq": "awq",
    "gptq": "gptq",
    "fp8": "fp8",
    "mxfp4": "mxfp4",
    "nvfp4": "nvfp4",
    "bnb_4bit": "bnb",
    "ct_int8": "compressed_tensors_int8",
    "ct_wna16": "compressed_tensors_wna16",
    "ct_fp8": "compressed_tensors_fp8",
}


def vllm_quantization(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """vLLM refuses a quantization below its config's get_min_capability()."""
    if n.framework != "vllm" or d.vendor != "nvidia" or d.cc is None or not n.quant:
        return None
    at, table = _vllm_table(n.framework_version)
    cap = d.cc[0] * 10 + d.cc[1]
    for kind in sorted(n.quant):
        method = _VLLM_METHOD.get(kind)
        need = table.get(method) if method else None
        rule = f"vllm.quantization.{kind}"
        if need is None:
            return _out(
                rule,
                "unknown",
                f"vLLM {at}'s minimum capability for {kind} was not read",
                "vllm_quant",
            )
        if cap < need:
            return _out(
                rule,
                "unsupported",
                f"vLLM {n.framework_version} (read at {at}) needs compute capability {need} for "
                f"{kind}; {d.name} is {cap}",
                "vllm_quant",
                "use a GPU of compute capability >= "
                f"{need / 10:.1f}, or an unquantized fp16 checkpoint",
            )
    kinds = ", ".join(sorted(n.quant))
    note = ""
    if {"mxfp4", "nvfp4"} & n.quant and d.cc < (10, 0):
        note = "; without FP4 tensor cores (before Blackwell) it runs other kernels"
    return _out(
        "vllm.quantization",
        "supported",
        f"vLLM {n.framework_version} (read at {at}) runs {kinds} on compute capability {cap}"
        + note,
        "vllm_mxfp4_hopper" if note else "vllm_quant",
    )


_ON_TRANSFORMERS = frozenset({"transformers", "unsloth", "axolotl"})
"""Frameworks that load checkpoints with transformers' ``from_pretrained`` (its quantizers)."""


def transformers_quantization(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """transformers (5.23.0): fp8 below 8.9 and MXFP4 below 7.5 are dequantized to bf16 (the
    budgeted format does not run); pre-quantized NVFP4 does not load."""
    if n.framework not in _ON_TRANSFORMERS or d.vendor != "nvidia" or d.cc is None:
        return None
    fp8 = "fp8" in n.quant or "fp8" in n.dtypes
    if "nvfp4" in n.quant:
        return _out(
            "transformers.nvfp4",
            "unsupported",
            "transformers does not load pre-quantized NVFP4 checkpoints (and its NVFP4 needs "
            f"Blackwell sm100+; {d.name} is {_sm(d.cc)})",
            "transformers_nvfp4",
            "serve the NVFP4 checkpoint with vLLM (framework/engine vllm)",
        )
    if "mxfp4" in n.quant and d.cc < (7, 5):
        return _out(
            "transformers.mxfp4",
            "unsupported",
            f"transformers dequantizes MXFP4 to bf16 below compute capability 7.5 ({d.name} is "
            f"{_sm(d.cc)}): the weights take 2 bytes each, not the budgeted 4 bits",
            "transformers_mxfp4",
            "budget the model in bf16 (quantization: null), or use a GPU of compute "
            "capability >= 7.5",
        )
    if fp8 and d.cc < (8, 9):
        return _out(
            "transformers.fp8",
            "unsupported",
            f"transformers dequantizes fp8 checkpoints to bf16 below compute capability 8.9 "
            f"({d.name} is {_sm(d.cc)}): the weights take 2 bytes each, not the budgeted 1",
            "transformers_fp8",
            "budget the weights as bf16 (what transformers loads), serve with vLLM (fp8 "
            "weight-only kernels from compute capability 7.5), or use an sm89+ GPU",
        )
    return None


# ------------------------------------------------------------------------- attention ----


def sdpa_math(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """PyTorch's SDPA with no fused kernel for the call runs its math path, which materializes
    every head's scores in fp32: bf16 below sm80 (the memory-efficient kernel takes fp16 and
    fp32 there), and before torch 2.14 grouped K/V heads passed as they are below sm80 (flash
    needs sm80+, the memory-efficient kernel took no grouped heads) or in fp32 anywhere. The
    budget counts it (:func:`vrambudget.core.formulas.sdpa.transformers_sdpa_backend`); this
    says why."""
    if not n.sdpa_calls or d.custom:
        return None
    hw = flash_hardware_cc(d.cc, d.vendor)
    mem_gqa = mem_efficient_gqa(version_tuple(n.torch_version), d.vendor)
    sm = _sm(d.cc) if d.cc else "of unknown capability"
    reasons = []
    for dtype, heads, kv_heads, head_dim in sorted(n.sdpa_calls):
        backend = transformers_sdpa_backend(
            dtype=dtype,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=head_dim,
            native_gqa=n.sdpa_native_gqa,
            flash_hw=hw,
            mem_efficient_gqa=mem_gqa,
        )
        if backend != "math":
            continue
        if dtype == "bf16" and not hw:
            reasons.append(
                f"bf16 on {d.name} ({sm}): FlashAttention needs sm80+ and the "
                "memory-efficient kernel takes fp16 and fp32 only below sm80"
            )
        elif not hw:
            reasons.append(
                f"{heads} query heads on {kv_heads} K/V heads, passed as they are, on {d.name} "
                f"({sm}): FlashAttention needs sm80+ and torch {n.torch_version}'s "
                "memory-efficient kernel takes no grouped heads (from 2.14 it does)"
            )
        else:
            reasons.append(
                f"{dtype} with {heads} query heads on {kv_heads} K/V heads: FlashAttention "
                f"takes fp16/bf16 only and torch {n.torch_version}'s memory-efficient kernel no "
                "grouped heads (from 2.14 it does)"
            )
    if not reasons:
        return None
    return _out(
        "attention.sdpa_math",
        "supported",
        "PyTorch's SDPA has no fused kernel here and runs its math path, which holds every "
        "head's s x s scores in fp32 (about 9 B per score at its peak; 4 B per score per layer "
        "saved in training); the budget counts them: " + "; ".join(dict.fromkeys(reasons)),
        "torch_sdpa_math",
        "a GPU of sm80+ (FlashAttention takes grouped heads), fp16 instead of bf16 below sm80, "
        "16-bit compute instead of fp32, or torch 2.14+ (its memory-efficient kernel takes "
        "grouped heads)",
    )


def flash_attention(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """FlashAttention-2 needs Ampere or newer (CUDA) or a CK target (ROCm); FlashAttention-3
    is Hopper's."""
    if not n.flash_attention:
        return None
    fa3 = n.flash_attn_version is not None and version_tuple(n.flash_attn_version)[:1] == (3,)
    if d.vendor == "amd":
        rule = "flash_attention.rocm"
        if n.rocm is not None and n.rocm < (6,):
            return _out(
                rule,
                "unsupported",
                f"flash-attn on ROCm needs ROCm 6.0 or above; the build is ROCm {_v(n.rocm)}",
                "flash_attn_rocm",
                "use ROCm >= 6.0, or attention: sdpa",
            )
        if d.gfx is None:
            return _out(
                rule,
                "unknown",
                f"{d.name}'s gfx target is not in the catalog",
                "flash_attn_rocm",
                "attention: sdpa",
            )
        if d.gfx not in FA2_CK_TARGETS:
            return _out(
                rule,
                "unsupported",
                f"flash-attn's ROCm build does not target {d.gfx} ({d.name})",
                "flash_attn_rocm",
                "attention: sdpa (or eager)",
            )
        return _out(
            rule, "supported", f"flash-attn's ROCm build targets {d.gfx}", "flash_attn_rocm"
        )
    if d.cc is None:
        return _out(
            "flash_attention.cuda_arch",
            "unknown",
            f"{d.name}'s compute capability is not known; FlashAttention needs sm80+",
            "flash_attn",
            "attention: sdpa",
        )
    if fa3:
        if d.cc[0] != 9:
            return _out(
                "flash_attention.fa3",
                "unsupported",
                f"FlashAttention-3 (flash-attn {n.flash_attn_version}) is for Hopper (sm90); "
                f"{d.name} is {_sm(d.cc)}",
                "flash_attn_3",
                "use flash-attn 2.x (sm80+) or attention: sdpa",
            )
        return _out("flash_attention.fa3", "supported", f"{d.name} is Hopper", "flash_attn_3")
    if d.cc < (8, 0):
        return _out(
            "flash_attention.cuda_arch",
            "unsupported",
            f"FlashAttention-2 needs Ampere or newer (sm80+); {d.name} is {_sm(d.cc)}",
            "flash_attn",
            "attention: sdpa (or eager)",
        )
    return _out(
        "flash_attention.cuda_arch",
        "supported",
        f"FlashAttention-2 runs on {_sm(d.cc)} (sm80+)",
        "flash_attn",
    )


# ----------------------------------------------------------------------- bitsandbytes ---


def bitsandbytes(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """bitsandbytes: compute capability 6.0+ (LLM.int8 7.5+) on CUDA; on ROCm, PyPI wheels from
    0.49.0 for the gfx targets each release lists."""
    kinds = n.quant & {"bnb_4bit", "bnb_int8", "bnb_optim8bit"}
    if not kinds or n.framework in ("vllm", "sglang", "llama_cpp", "ollama"):
        return None
    rule = "bitsandbytes"
    named = "" if n.bnb_named else " (not named: the framework's pin or the current release)"
    if d.vendor == "amd":
        v = version_tuple(n.bnb_version)
        if v < BNB_ROCM_FIRST:
            return _out(
                rule,
                "unsupported",
                f"bitsandbytes {n.bnb_version}{named} has no ROCm build on PyPI (preview wheels "
                "or source builds only before 0.49.0)",
                "bnb_rocm",
                "use bitsandbytes >= 0.49.0 (libraries.bitsandbytes)",
            )
        if d.gfx is None:
            return _out(
                rule,
                "unknown",
                f"{d.name}'s gfx target is not in the catalog",
                "bnb_rocm",
            )
        rows = sorted(BNB_ROCM_TARGETS)
        at = max(r for r in rows if r <= v[:2])
        if d.gfx not in BNB_ROCM_TARGETS[at]:
            return _out(
                rule,
                "unsupported",
                f"bitsandbytes {n.bnb_version}'s ROCm wheels do not target {d.gfx} ({d.name})",
                "bnb_rocm",
                "a newer bitsandbytes, or a source build for the target (-DBNB_ROCM_ARCH)",
            )
        return _out(
            rule,
            "supported",
            f"bitsandbytes {n.bnb_version}{named} ships ROCm wheels for {d.gfx}",
            "bnb_rocm",
        )
    if d.cc is None:
        return None
    for kind in sorted(kinds):
        need = BNB_CUDA_MIN_CC["int8" if kind == "bnb_int8" else "nf4"]
        if d.cc < need:
            what = "LLM.int8()" if kind == "bnb_int8" else "its 4-bit and 8-bit-optimizer kernels"
            return _out(
                rule,
                "unsupported",
                f"bitsandbytes {what} need compute capability {_v(need)}+; {d.name} is {_sm(d.cc)}",
                "bnb_cuda",
                "use a newer GPU, or a method without bitsandbytes (LoRA in bf16/fp16)",
            )
    return _out(rule, "supported", f"bitsandbytes runs on {_sm(d.cc)}", "bnb_cuda")


# ---------------------------------------------------------------------------- engines ---


def engine_platform(n: Needs, d: DeviceFacts) -> RuleOutcome | None:
    """vLLM and SGLang on ROCm targets; vLLM's CUDA >= 12.8 builds start at compute
    capability 7.5."""
    if n.framework == "vllm" and d.vendor == "amd":
        if d.gfx is None:
            return _out(
                "vllm.rocm_target",
                "unknown",
                f"{d.name}'s gfx target is not in the catalog",
                "vllm_rocm",
            )
        if d.gfx not in VLLM_HIP_TARGETS:
            return _out(
                "vllm.rocm_target",
                "unsupported",
                f"vLLM's ROCm build does not target {d.gfx} ({d.name})",
                "vllm_rocm",
                "a GPU of a listed target (gfx90a, gfx942, gfx950, gfx1100 ...)",
            )
        return _out("vllm.rocm_target", "supported", f"vLLM builds for {d.gfx}", "vllm_rocm")
    if n.framework == "sglang" and d.vendor == "amd":
        if d.gfx in SGLANG_ROCM_NAMED:
            return _out(
                "sglang.rocm_target",
                "supported",
                f"SGLang's AMD page names the MI300X ({d.gfx})",
                "sglang_rocm",
            )
        return _out(
            "sglang.rocm_target",
            "unknown",
            f"SGLang's AMD documentation lists no supported targets beyond the MI300X; {d.name} "
            f"is {d.gfx or 'of an unknown gfx target'}",
            "sglang_rocm",
        )
    if n.framework == "vllm" and d.vendor == "nvidia" and d.cc is not None and d.cc < (7, 5):
        if n.cuda is None or n.cuda < (12, 8):
            return _out(
                "vllm.cuda_arch",
                "unknown",
                f"vLLM builds for {_sm(d.cc)} only with CUDA < 12.8; the build's CUDA is "
                f"{_cuda_words(n)}",
                "vllm_cuda_archs",
            )
        return _out(
            "vllm.cuda_arch",
            "unsupported",
            f"vLLM {n.framework_version} runs torch {n.torch_version} ({n.torch_basis}) with "
            f"CUDA {_v(n.cuda)}: its CUDA >= 12.8 builds start at compute capability 7.5; "
            f"{d.name} is {_sm(d.cc)}",
            "vllm_cuda_archs",
            "a GPU of compute capability >= 7.5 (T4, A10, A100, L4, H100 ...)",
        )
    return None


RULES: tuple[Rule, ...] = (
    cuda_arch,
    cuda_driver,
    cuda_driver_supports,
    engine_platform,
    bf16,
    native_dtypes,
    vllm_quantization,
    transformers_quantization,
    flash_attention,
    sdpa_math,
    bitsandbytes,
)
"""Every rule, in the order their outcomes are listed."""
