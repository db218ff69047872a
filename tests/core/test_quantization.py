"""Quantized tensor storage (vrambudget/core/quantization.py): each scheme's packed bytes and
metadata for one 4096 x 4096 weight, written out by hand."""

from __future__ import annotations

from vrambudget.core.quantization import tensor_storage
from vrambudget.core.spec import AWQ, FP8, GPTQ, BitsAndBytes4bit, Int8


def test_gptq_awq_bnb_fp8_int8_storage_of_a_4096_square():
    rows = cols = 4096
    # GPTQ 4-bit g128: qweight 512 x 4096 int32; qzeros 32 x 512 int32; scales 32 x 4096 fp16;
    # g_idx 4096 int32.
    assert tensor_storage(GPTQ(), rows, cols, 1) == (8_388_608, 65_536 + 262_144 + 16_384)
    # AWQ 4-bit g128: qweight 4096 x 512 int32; qzeros 32 x 512 int32; scales 32 x 4096 fp16.
    assert tensor_storage(AWQ(), rows, cols, 1) == (8_388_608, 65_536 + 262_144)
    # NF4, blocksize 64: 8,388,608 packed bytes; 262,144 fp32 absmax; 16-entry fp32 code.
    assert tensor_storage(BitsAndBytes4bit(), rows, cols, 1) == (8_388_608, 1_048_576 + 64)
    # Double quantization: uint8 absmax (262,144) + fp32 per 256 blocks (1,024 x 4) + offset.
    assert tensor_storage(BitsAndBytes4bit(double_quant=True), rows, cols, 1) == (
        8_388_608,
        262_144 + 4_096 + 4 + 64,
    )
    assert tensor_storage(FP8(), rows, cols, 1) == (16_777_216, 4)
    assert tensor_storage(FP8(granularity="block"), rows, cols, 1) == (16_777_216, 32 * 32 * 4)
    assert tensor_storage(Int8(), rows, cols, 1) == (16_777_216, 4096 * 4)
