"""Stored bytes of one real-shaped tensor under each quantization format
(vrambudget/core/quantization.py), computed by hand from the format's tensors, and, where the
library runs on a CPU, checked against the tensors the library itself creates: transformers
(installed) on the meta device; compressed-tensors, bitsandbytes, AutoAWQ and AutoGPTQ when
importable (they are not dependencies of the project: those checks skip without them)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from vrambudget.core.arch import Role
from vrambudget.core.quantization import (
    bnb_serialized_state_bytes,
    quantized_roles,
    tensor_storage,
)
from vrambudget.core.spec import (
    AWQ,
    FP8,
    GPTQ,
    MXFP4,
    NVFP4,
    BitsAndBytes4bit,
    CompressedTensors,
    Int8,
)


def _bytes(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    return {k: v.numel() * v.element_size() for k, v in tensors.items() if v is not None}


@contextmanager
def _without_package_init(package: str) -> Iterator[None]:
    """Import submodules of ``package`` without running its ``__init__`` (AutoAWQ's and
    AutoGPTQ's import their whole model zoo and datasets); skip when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip(f"{package} is not installed")
    before = set(sys.modules)
    stub = types.ModuleType(package)
    stub.__path__ = list(spec.submodule_search_locations)
    saved = sys.modules.get(package)
    sys.modules[package] = stub
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name == package or name.startswith(package + "."):
                del sys.modules[name]
        if saved is not None:
            sys.modules[package] = saved
        else:
            sys.modules.pop(package, None)


# --- AWQ ----------------------------------------------------------------------------------------


def test_awq_gemm_qwen3_32b_down_proj() -> None:
    # Qwen/Qwen3-32B-AWQ (bits 4, group 128, gemm): mlp.down_proj is 5120 x 25600. The loaded
    # model's tensors, as listed with its config (find_string id 62727925985): qweight
    # [25600, 640] int32, qzeros [200, 640] int32, scales [200, 5120] (2 bytes).
    rows, cols = 5120, 25600
    qweight = cols * (rows * 4 // 32) * 4  # 25600 x 640 x 4
    qzeros = (cols // 128) * (rows * 4 // 32) * 4  # 200 x 640 x 4
    scales = (cols // 128) * rows * 2  # 200 x 5120 x 2
    assert (qweight, qzeros, scales) == (65_536_000, 512_000, 2_048_000)
    assert tensor_storage(AWQ(), rows, cols, 1) == (qweight, qzeros + scales)


def test_awq_layouts_of_llama2_down_proj_by_hand() -> None:
    # Llama 2 7B mlp.down_proj: 4096 x 11008, group 128 -> 86 groups; GEMV pads the group
    # count to w = ceil(86 / 8) = 11 words (AutoAWQ gemv.py calculate_zeros_width).
    rows, cols = 4096, 11008
    packed = rows * cols // 2  # 4 bits per weight, whatever the word
    gemm_meta = 86 * (rows // 8) * 4 + 86 * rows * 2  # qzeros + scales
    gemv_meta = rows * 11 * 4 + rows * (11 * 8) * 2  # qzeros (4096, 11) + scales (4096, 88)
    fast_meta = 2 * (11 * 8) * rows * 2  # fp16 scales and fp16 qzeros, (88, 4096) each
    marlin_meta = 86 * rows * 2  # scales only
    assert tensor_storage(AWQ(version="gemm"), rows, cols, 1) == (packed, gemm_meta)
    assert tensor_storage(AWQ(version="exllama"), rows, cols, 1) == (packed, gemm_meta)
    assert tensor_storage(AWQ(version="gemv"), rows, cols, 1) == (packed, gemv_meta)
    assert tensor_storage(AWQ(version="gemv_fast"), rows, cols, 1) == (packed, fast_meta)
    assert tensor_storage(AWQ(version="marlin"), rows, cols, 1) == (packed, marlin_meta)
    assert (gemm_meta, gemv_meta, fast_meta, marlin_meta) == (880_640, 901_120, 1_441_792, 704_512)


def test_awq_gemv_pads_small_groups() -> None:
    # group 64: the padded width is a multiple of 2 words, group 32 of 4 (gemv.py 13-23).
    # Qwen2.5-1.5B gate_proj 8960 x 1536, group 64: 24 groups -> ceil(24 / 8) = 3 -> 4 words.
    assert tensor_storage(AWQ(version="gemv", group_size=64), 8960, 1536, 1)[1] == (
        8960 * 4 * 4 + 8960 * (4 * 8) * 2
    )
    # Llama 2 7B down_proj 4096 x 11008, group 32: 344 groups -> 43 -> 44 words.
    assert tensor_storage(AWQ(version="gemv_fast", group_size=32), 4096, 11008, 1)[1] == (
        2 * (44 * 8) * 4096 * 2
    )


@pytest.mark.parametrize(
    ("version", "group", "cols", "rows"),
    [
        ("gemm", 128, 11008, 4096),
        ("gemv", 128, 11008, 4096),
        ("gemv_fast", 128, 11008, 4096),
        ("marlin", 128, 11008, 4096),
        ("gemv", 64, 1536, 8960),
        ("gemv_fast", 64, 1536, 8960),
        ("gemv", 32, 11008, 4096),
        ("gemv_fast", 32, 11008, 4096),
    ],
)
def test_awq_layouts_match_autoawq_modules(version: str, group: int, cols: int, rows: int) -> None:
    with _without_package_init("awq"):
        linear = importlib.import_module("awq.modules.linear")
        cls = {
            "gemm": linear.WQLinear_GEMM,
            "gemv": linear.WQLinear_GEMV,
            "gemv_fast": linear.WQLinear_GEMVFast,
            "marlin": linear.WQLinear_Marlin,
        }[version]
        module = cls(4, group, cols, rows, False, "meta")  # (w_bit, group, in, out, bias, dev)
        sizes = _bytes(module.state_dict())
    payload = sizes.pop("qweight")
    q = AWQ(version=version, group_size=group)  # type: ignore[arg-type]
    assert tensor_storage(q, rows, cols, 1) == (payload, sum(sizes.values()))


# --- GPTQ ---------------------------------------------------------------------------------------


def test_gptq_4bit_qwen25_coder_down_proj() -> None:
    # Qwen/Qwen2.5-Coder-1.5B-Instruct-GPTQ-Int4 (bits 4, group 128): down_proj 1536 x 8960.
    rows, cols = 1536, 8960
    qweight = (cols * 4 // 32) * rows * 4  # (1120, 1536) int32
    qzeros = (cols // 128) * (rows * 4 // 32) * 4  # (70, 192) int32
    scales = (cols // 128) * rows * 2  # (70, 1536) fp16
    g_idx = cols * 4  # (8960,) int32
    assert tensor_storage(GPTQ(), rows, cols, 1) == (qweight, qzeros + scales + g_idx)
    assert (qweight, qzeros + scales + g_idx) == (6_881_280, 53_760 + 215_040 + 35_840)


def test_gptq_3bit_llama2_q_proj() -> None:
    # A 3-bit, group-128 GPTQ q_proj of Llama 2 7B (4096 x 4096): 3 bits x 32 values per 3 words.
    rows = cols = 4096
    qweight = (cols * 3 // 32) * rows * 4  # (384, 4096) int32
    qzeros = (cols // 128) * (rows * 3 // 32) * 4  # (32, 384) int32
    scales = (cols // 128) * rows * 2
    g_idx = cols * 4
    assert tensor_storage(GPTQ(bits=3), rows, cols, 1) == (qweight, qzeros + scales + g_idx)
    assert qweight == 6_291_456 and qzeros == 49_152


def test_gptq_marlin_format_keeps_no_zeros_or_g_idx() -> None:
    # AutoGPTQ qlinear_marlin.py: B (in/16, out*16/8) int32 and s (groups, out) fp16.
    rows = cols = 4096
    b = (cols // 16) * (rows * 16 // 8) * 4
    s = (cols // 128) * rows * 2
    assert tensor_storage(GPTQ(checkpoint_format="marlin"), rows, cols, 1) == (b, s)
    assert tensor_storage(GPTQ(checkpoint_format="gptq_v2"), rows, cols, 1) == tensor_storage(
        GPTQ(), rows, cols, 1
    )


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_gptq_matches_autogptq_quantlinear(bits: int) -> None:
    with _without_package_init("auto_gptq"):
        module = importlib.import_module("auto_gptq.nn_modules.qlinear.qlinear_cuda_old")
        with torch.device("meta"):
            layer = module.QuantLinear(bits, 128, 4096, 11008, False)  # (bits, group, in, out)
        sizes = _bytes(layer.state_dict())
    payload = sizes.pop("qweight")
    assert tensor_storage(GPTQ(bits=bits), 11008, 4096, 1) == (payload, sum(sizes.values()))  # type: ignore[arg-type]


# --- bitsandbytes -------------------------------------------------------------------------------


def test_bnb_nf4_llama3_q_proj_with_and_without_double_quant() -> None:
    rows = cols = 4096
    n = rows * cols
    payload = n // 2  # two 4-bit codes per uint8
    blocks = n // 64  # 262,144 absmax values
    plain = blocks * 4 + 16 * 4  # fp32 absmax + fp32 NF4 code (quant_map)
    nested = blocks + (blocks // 256) * 4 + 4 + 16 * 4  # uint8 absmax, fp32 per 256, offset
    assert tensor_storage(BitsAndBytes4bit(), rows, cols, 1) == (payload, plain)
    assert tensor_storage(BitsAndBytes4bit(double_quant=True), rows, cols, 1) == (payload, nested)
    loaded = BitsAndBytes4bit(double_quant=True, prequantized=True)
    # a loaded checkpoint restores its own 256-entry fp32 nested_quant_map per tensor
    assert tensor_storage(loaded, rows, cols, 1) == (payload, nested + 256 * 4)
    assert (plain, nested) == (1_048_640, 266_308)


def test_bnb_serialized_quant_state_json() -> None:
    # {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4096, 4096],
    #  "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.25}
    text = (
        '{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4096, 4096], '
        '"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.25}'
    )
    q = BitsAndBytes4bit(double_quant=True)
    assert bnb_serialized_state_bytes(q, (4096, 4096), "bfloat16", 0.25) == len(text)
    plain = '{"quant_type": "fp4", "blocksize": 64, "dtype": "float16", "shape": [1536, 8960]}'
    assert bnb_serialized_state_bytes(
        BitsAndBytes4bit(quant_type="fp4"), (1536, 8960), "float16"
    ) == len(plain)


@pytest.mark.parametrize("double_quant", [False, True])
def test_bnb_matches_bitsandbytes_quantize_4bit(double_quant: bool) -> None:
    functional = pytest.importorskip("bitsandbytes.functional")
    weight = torch.randn(384, 1000, dtype=torch.bfloat16)  # 384,000 values: 6,000 blocks
    packed, state = functional.quantize_4bit(
        weight, blocksize=64, compress_statistics=double_quant, quant_type="nf4"
    )
    serialized = state.as_dict(packed=True)
    json_tensor = serialized.pop("quant_state.bitsandbytes__nf4")
    tensors = _bytes(serialized)  # absmax, quant_map (+ nested_absmax, nested_quant_map)
    offset = 4 if double_quant else 0  # the fp32 offset lives in the JSON, and on the device
    q = BitsAndBytes4bit(double_quant=double_quant, prequantized=True)
    assert tensor_storage(q, 384, 1000, 1) == (
        packed.numel() * packed.element_size(),
        sum(tensors.values()) + offset,
    )
    nested_offset = float(state.offset) if double_quant else None
    assert bnb_serialized_state_bytes(q, (384, 1000), "bfloat16", nested_offset) == (
        json_tensor.numel()
    )


def test_int8_llm_int8_scb() -> None:
    # LLM.int8: int8 weight + fp32 SCB per row (4096 x 14336 up_proj of Llama 3 8B is 14336 rows).
    assert tensor_storage(Int8(), 14336, 4096, 1) == (14336 * 4096, 14336 * 4)


# --- fp8 ----------------------------------------------------------------------------------------


def test_fp8_block_deepseek_v3_shapes() -> None:
    # DeepSeek-V3 expert gate_proj 2048 x 7168, weight_scale_inv fp32 per 128 x 128 block.
    assert tensor_storage(FP8(granularity="block"), 2048, 7168, 1) == (
        2048 * 7168,
        (2048 // 128) * (7168 // 128) * 4,  # (16, 56) fp32
    )
    # kv_a_proj_with_mqa 576 x 7168: ceil(576 / 128) = 5 block rows.
    assert tensor_storage(FP8(granularity="block"), 576, 7168, 1) == (576 * 7168, 5 * 56 * 4)


def test_fp8_matches_transformers_fp8_linear() -> None:
    from transformers.integrations.finegrained_fp8 import FP8Linear

    with torch.device("meta"):
        block = FP8Linear(7168, 576, block_size=(128, 128))
        static = FP8Linear(4096, 4096, block_size=None, activation_scheme="static")
    for layer, q, rows, cols in (
        (block, FP8(granularity="block"), 576, 7168),
        (static, FP8(granularity="tensor", input_scale=True), 4096, 4096),
    ):
        sizes = _bytes(layer.state_dict())
        assert tensor_storage(q, rows, cols, 1) == (sizes.pop("weight"), sum(sizes.values()))


def test_fbgemm_fp8_channel_matches_transformers() -> None:
    from transformers.integrations.fbgemm_fp8 import FbgemmFp8Linear

    with torch.device("meta"):
        layer = FbgemmFp8Linear(4096, 14336, False)  # (in, out, bias)
    sizes = _bytes(layer.state_dict())  # input_scale_ub is a non-persistent scratch buffer
    assert tensor_storage(FP8(granularity="channel"), 14336, 4096, 1) == (
        sizes.pop("weight"),
        sum(sizes.values()),
    )
    assert sizes == {"weight_scale": 14336 * 4}


# --- MXFP4 / NVFP4 ------------------------------------------------------------------------------


def test_mxfp4_gpt_oss_20b_experts() -> None:
    # gpt-oss-20b: 32 experts, hidden 2880, intermediate 2880. gate_up_proj_blocks
    # (32, 5760, 90, 16) uint8 and gate_up_proj_scales (32, 5760, 90) uint8.
    experts, hidden, inter = 32, 2880, 2880
    blocks = experts * (2 * inter) * (hidden // 32) * 16
    scales = experts * (2 * inter) * (hidden // 32)
    assert tensor_storage(MXFP4(), 2 * inter, hidden, experts) == (blocks, scales)
    assert (blocks, scales) == (265_420_800, 16_588_800)
    assert tensor_storage(MXFP4(), hidden, inter, experts) == (
        experts * hidden * (inter // 32) * 16,
        experts * hidden * (inter // 32),
    )


def test_mxfp4_payload_matches_transformers_experts() -> None:
    from transformers import GptOssConfig
    from transformers.integrations.mxfp4 import Mxfp4GptOssExperts

    config = GptOssConfig(num_local_experts=32, hidden_size=2880, intermediate_size=2880)
    with torch.device("meta"):
        experts = Mxfp4GptOssExperts(config)
    sizes = _bytes(experts.state_dict())
    assert tensor_storage(MXFP4(), 5760, 2880, 32)[0] == sizes["gate_up_proj"]
    assert tensor_storage(MXFP4(), 2880, 2880, 32)[0] == sizes["down_proj"]


def test_mxfp4_quantizes_experts_only() -> None:
    assert quantized_roles(MXFP4()) == frozenset({Role.EXPERT})
    assert quantized_roles(NVFP4()) == frozenset({Role.LINEAR, Role.EXPERT})
    assert Role.LM_HEAD in quantized_roles(CompressedTensors(quantize_lm_head=True))


def test_nvfp4_llama33_70b_down_proj() -> None:
    # nvidia/Llama-3.3-70B-Instruct-FP4: down_proj 8192 x 28672.
    rows, cols = 8192, 28672
    weight = rows * cols // 2  # uint8, two e2m1 per byte
    weight_scale = rows * cols // 16  # fp8 e4m3 per 16
    assert tensor_storage(NVFP4(), rows, cols, 1) == (weight, weight_scale + 4 + 4)
    assert tensor_storage(NVFP4(input_scale=False), rows, cols, 1) == (weight, weight_scale + 4)
    assert (weight, weight_scale) == (117_440_512, 14_680_064)


# --- compressed-tensors -------------------------------------------------------------------------


def test_compressed_tensors_w4a16_llama31_down_proj() -> None:
    # Llama 3.1 8B down_proj 4096 x 14336, w4a16 group 128, bf16 scales.
    rows, cols = 4096, 14336
    weight_packed = rows * (cols * 4 // 32) * 4  # (4096, 1792) int32
    weight_scale = rows * (cols // 128) * 2  # (4096, 112) bf16
    weight_shape = 2 * 8  # int64 (2,)
    sym = CompressedTensors()
    assert tensor_storage(sym, rows, cols, 1) == (weight_packed, weight_scale + weight_shape)
    zero_point = (rows * 4 // 32) * (cols // 128) * 4  # (512, 112) int32, packed along rows
    asym = CompressedTensors(symmetric=False)
    assert tensor_storage(asym, rows, cols, 1) == (
        weight_packed,
        weight_scale + weight_shape + zero_point,
    )
    assert (weight_packed, weight_scale, zero_point) == (29_360_128, 917_504, 229_376)


def test_compressed_tensors_fp8_dynamic_and_block() -> None:
    rows, cols = 4096, 14336
    fp8 = {"format": "float-quantized", "type": "float", "num_bits": 8}
    channel = CompressedTensors(**fp8, strategy="channel")  # type: ignore[arg-type]
    assert tensor_storage(channel, rows, cols, 1) == (rows * cols, rows * 1 * 2)  # (4096, 1) bf16
    block = CompressedTensors(**fp8, strategy="block", block_structure=(128, 128))  # type: ignore[arg-type]
    assert tensor_storage(block, rows, cols, 1) == (rows * cols, 32 * 112 * 2)


def test_compressed_tensors_3bit_packs_densely_and_g_idx() -> None:
    # compressed-tensors 0.20.1 packs 32 values of 3 bits into 3 words: ceil(cols * 3 / 32).
    q = CompressedTensors(num_bits=3, g_idx=True)
    rows, cols = 4096, 11008
    assert tensor_storage(q, rows, cols, 1) == (
        rows * (cols * 3 // 32) * 4,  # (4096, 1032) int32
        rows * 86 * 2 + 16 + cols * 4,  # scales, weight_shape, weight_g_idx int32 (11008,)
    )


def test_compressed_tensors_scales_round_up_like_the_library() -> None:
    # initialize.py 226-233: (rows, ceil(cols / group)); 1000 columns in groups of 128 -> 8.
    q = CompressedTensors()
    assert tensor_storage(q, 96, 1000, 1)[1] == 96 * 8 * 2 + 16
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.initialize import (
        initialize_module_for_quantization,
    )

    linear = torch.nn.Linear(1000, 96, bias=False, dtype=torch.bfloat16)
    initialize_module_for_quantization(linear, preset_name_to_scheme("W4A16", ["Linear"]))
    scale = linear.weight_scale
    assert scale.numel() * scale.element_size() == 96 * 8 * 2


def test_compressed_tensors_asymmetric_int8_keeps_unpacked_zero_points() -> None:
    # int-quantized, asymmetric, per channel: weight int8 (rows, cols), weight_scale (rows, 1)
    # bf16 and weight_zero_point (rows, 1) int8 (zp_dtype: quant_args.py 415-419).
    q = CompressedTensors(format="int-quantized", num_bits=8, strategy="channel", symmetric=False)
    rows, cols = 384, 640
    assert tensor_storage(q, rows, cols, 1) == (rows * cols, rows * 2 + rows * 1)
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.lifecycle.initialize import (
        initialize_module_for_quantization,
    )
    from compressed_tensors.utils import get_direct_state_dict

    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(num_bits=8, type="int", strategy="channel", symmetric=False),
        input_activations=QuantizationArgs(
            num_bits=8, type="int", strategy="token", symmetric=True, dynamic=True
        ),
    )
    linear = torch.nn.Linear(cols, rows, bias=False, dtype=torch.bfloat16)
    initialize_module_for_quantization(linear, scheme)
    with torch.no_grad():
        linear.weight_scale.fill_(1.0)
        linear.weight_zero_point.zero_()
    compressed = BaseCompressor.get_value_from_registry("int-quantized").compress(
        get_direct_state_dict(linear), scheme
    )
    sizes = _bytes(compressed)
    assert tensor_storage(q, rows, cols, 1) == (sizes.pop("weight"), sum(sizes.values()))


def test_stacked_experts_multiply() -> None:
    for q in (AWQ(), GPTQ(), NVFP4(), CompressedTensors(), BitsAndBytes4bit(), FP8()):
        one = tensor_storage(q, 1536, 4096, 1)
        assert tensor_storage(q, 1536, 4096, 128) == (one[0] * 128, one[1] * 128)


_CT_PRESETS: dict[str, tuple[str, CompressedTensors | NVFP4 | MXFP4]] = {
    "W4A16": ("pack-quantized", CompressedTensors()),
    "W4A16_ASYM": ("pack-quantized", CompressedTensors(symmetric=False)),
    "W8A16": ("pack-quantized", CompressedTensors(num_bits=8)),
    "W3A16": ("pack-quantized", CompressedTensors(num_bits=3)),
    "FP8_DYNAMIC": (
        "float-quantized",
        CompressedTensors(format="float-quantized", type="float", num_bits=8, strategy="channel"),
    ),
    "FP8": (
        "float-quantized",
        CompressedTensors(
            format="float-quantized", type="float", num_bits=8, strategy="tensor", input_scale=True
        ),
    ),
    "FP8_BLOCK": (
        "float-quantized",
        CompressedTensors(
            format="float-quantized",
            type="float",
            num_bits=8,
            strategy="block",
            block_structure=(128, 128),
        ),
    ),
    "W8A8": (
        "int-quantized",
        CompressedTensors(format="int-quantized", num_bits=8, strategy="channel"),
    ),
    "NVFP4": ("nvfp4-pack-quantized", NVFP4()),
    "NVFP4A16": ("nvfp4-pack-quantized", NVFP4(input_scale=False)),
    "MXFP4": ("mxfp4-pack-quantized", MXFP4()),
}


@pytest.mark.parametrize("preset", sorted(_CT_PRESETS))
def test_compressed_tensors_matches_the_library(preset: str) -> None:
    """The library's own initialization and compressor on a bf16 384 x 640 Linear."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.initialize import (
        initialize_module_for_quantization,
    )
    from compressed_tensors.utils import get_direct_state_dict

    fmt, q = _CT_PRESETS[preset]
    rows, cols = 384, 640
    linear = torch.nn.Linear(cols, rows, bias=False, dtype=torch.bfloat16)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    initialize_module_for_quantization(linear, scheme)
    with torch.no_grad():
        for name, p in linear.named_parameters():
            if "scale" in name:
                p.fill_(1.0)
            elif name.endswith("zero_point"):
                p.zero_()
    compressed = BaseCompressor.get_value_from_registry(fmt).compress(
        get_direct_state_dict(linear), scheme
    )
    sizes = _bytes(compressed)
    payload_name = "weight_packed" if "weight_packed" in sizes else "weight"
    assert tensor_storage(q, rows, cols, 1) == (sizes.pop(payload_name), sum(sizes.values()))


def test_every_scheme_has_a_storage_rule() -> None:
    for q in (
        Int8(),
        FP8(),
        GPTQ(),
        AWQ(),
        BitsAndBytes4bit(),
        MXFP4(),
        NVFP4(),
        CompressedTensors(),
    ):
        payload, meta = tensor_storage(q, 64, 64, 1)
        assert payload > 0 and meta > 0
