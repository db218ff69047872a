"""Numeric formats: their storage size and the vocabulary used on the wire."""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "COMPUTE_DTYPES",
    "ComputeDType",
    "KVCacheDType",
    "NativeDType",
    "WeightDType",
    "bits_of",
    "bytes_of",
    "float_dtype",
    "native_dtype_name",
    "torch_dtype_name",
]

WeightDType = Literal["fp32", "fp16", "bf16", "fp8"]
ComputeDType = Literal["fp32", "fp16", "bf16"]
KVCacheDType = Literal["auto", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
NativeDType = Literal[
    "fp64", "fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "fp6", "fp4"
]
"""What a device's tensor (matrix) cores run natively (a GPU's ``native_dtypes``)."""
COMPUTE_DTYPES: tuple[str, ...] = get_args(ComputeDType)

_TORCH_NAMES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "double": "fp64",
    "int64": "int64",
    "int32": "int32",
    "int16": "int16",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "float8_e8m0fnu": "fp8_e8m0",
}
"""torch's dtype names (``torch.bfloat16``, as configs and ``str(tensor.dtype)`` write them, and
their aliases ``float``, ``half``, ``double``) in this vocabulary."""
_SAFETENSORS_FLOATS: dict[str, str] = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}


def torch_dtype_name(name: object) -> str | None:
    """``torch.bfloat16`` / ``bfloat16`` -> ``bf16``; None for a name torch does not have."""
    return _TORCH_NAMES.get(str(name).removeprefix("torch."))


def float_dtype(name: object) -> str | None:
    """The floating dtype (fp32 / fp16 / bf16) a torch name or a safetensors header code
    (``F32``, ``F16``, ``BF16``) names; None for any other."""
    found = _SAFETENSORS_FLOATS.get(str(name)) or torch_dtype_name(name)
    return found if found in COMPUTE_DTYPES else None


_BITS: dict[str, int] = {
    "fp32": 32,
    "tf32": 32,  # stored as fp32; tf32 is a tensor-core math mode
    "fp16": 16,
    "bf16": 16,
    "fp8": 8,
    "fp8_e4m3": 8,
    "fp8_e5m2": 8,
    "int8": 8,
    "uint8": 8,
    "int32": 32,
    "int16": 16,
    "int64": 64,
    "uint64": 64,
    "uint32": 32,
    "uint16": 16,
    "fp64": 64,
    "bool": 8,
    "fp8_e8m0": 8,
    "int4": 4,
    "nf4": 4,
    "fp4": 4,
}

# Which entry of a GPU's `native_dtypes` a dtype needs to run on tensor/matrix cores.
_NATIVE_NAME: dict[str, str] = {
    "fp32": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}


def bits_of(dtype: str) -> int:
    return _BITS[dtype]


def bytes_of(dtype: str) -> int:
    """Whole bytes per element; only for formats of 8 bits or more."""
    bits = _BITS[dtype]
    if bits % 8:
        raise ValueError(f"{dtype} is sub-byte ({bits} bits): use a packing formula")
    return bits // 8


def native_dtype_name(dtype: str) -> str | None:
    return _NATIVE_NAME.get(dtype)
