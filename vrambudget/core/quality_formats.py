"""Which precisions an output-quality check (:mod:`vrambudget.core.probe_quality`) can apply, as a
pure function: the agent refuses the others at submission (422 naming the field) and the probe
child checks the deployed precision again before it builds anything
(:mod:`vrambudget.workloads.quality` emulates each format by its rounding).

Emulated: fp8 weights (``weights: fp8`` or ``quantization: {scheme: fp8}``, every granularity),
bitsandbytes LLM.int8 (``int8``), GPTQ and AWQ (round-to-nearest), bitsandbytes NF4/FP4 (with
or without double quantization), compressed-tensors integer weights (strategies ``tensor``,
``channel``, ``group``) and 8-bit float weights (``tensor``, ``channel``, ``group``, ``block``),
and an fp8 KV cache. Not emulated: MXFP4, NVFP4, compressed-tensors ``tensor_group`` (NVFP4's
layout) and float weights of other widths than 8 bits."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from .spec import MXFP4, NVFP4, CompressedTensors

__all__ = ["unsupported_quantization"]


def unsupported_quantization(quantization: Any) -> str | None:
    """Why a quality check cannot apply this quantization (None: it can). ``quantization`` is a
    precision's ``quantization`` (a scheme, None, or absent)."""
    if quantization is None or quantization is UNSET:
        return None
    if isinstance(quantization, MXFP4 | NVFP4):
        return (
            f"{quantization.__struct_config__.tag} is not emulated by the quality check "
            "(supported: fp8, int8, gptq, awq, bnb_4bit, compressed_tensors int/fp8)"
        )
    if isinstance(quantization, CompressedTensors):
        if quantization.strategy == "tensor_group":
            return "compressed_tensors strategy tensor_group (NVFP4's layout) is not emulated"
        if quantization.type == "float" and quantization.num_bits != 8:
            return "compressed_tensors float weights are emulated at 8 bits (fp8 e4m3) only"
        if quantization.type == "int" and quantization.strategy == "block":
            return "compressed_tensors int weights with strategy block are not emulated"
    return None
