"""The dtype vocabulary: torch's names and safetensors' header codes read in one place."""

from __future__ import annotations

import pytest

from vrambudget.core.dtypes import float_dtype, torch_dtype_name


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("torch.bfloat16", "bf16"),
        ("bfloat16", "bf16"),
        ("half", "fp16"),
        ("float", "fp32"),
        ("torch.float8_e4m3fn", "fp8_e4m3"),
        ("float8_e8m0fnu", "fp8_e8m0"),
        ("uint8", "uint8"),
        ("complex64", None),
        ("bf16", None),  # not a torch name
    ],
)
def test_torch_names(name: str, ours: str | None) -> None:
    assert torch_dtype_name(name) == ours


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        ("F32", "fp32"),
        ("F16", "fp16"),
        ("BF16", "bf16"),
        ("torch.float16", "fp16"),
        ("F8_E4M3", None),  # a float, but not one weights are loaded in unquantized
        ("int8", None),
        (None, None),
    ],
)
def test_float_dtypes(name: object, ours: str | None) -> None:
    assert float_dtype(name) == ours
