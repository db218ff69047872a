"""A checkpoint's ``quantization_config`` read as the loaders read it
(vrambudget/core/quant_config.py), with blocks of published checkpoints quoted verbatim.

Where a block was read: the search index used to find these blocks returns the text of public
GitHub files; for some it names the repository, path and commit (quoted beside the fixture), for
others only an index id (``find_string id``), in which case the fixture names the checkpoint and
the public GitHub file that quotes its ``config.json``. Blocks written by a library's own
serializer (transformers' config classes, compressed-tensors' ``QuantizationConfig``) are built
by that library in the test where it is installed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from research.engine_logs import QWEN_AWQ
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.quant_config import (
    SUPPORTED_METHODS,
    is_not_converted,
    parse_quantization_config,
)
from vrambudget.core.quantization import tensor_storage
from vrambudget.core.spec import (
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

QWEN3_32B_AWQ: dict[str, Any] = QWEN_AWQ  # verbatim, with its source (research/engine_logs.py)

# Qwen/Qwen2.5-Coder-1.5B-Instruct-GPTQ-Int4, from
# https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GPTQ-Int4/resolve/main/config.json,
# `quantization_config` verbatim as quoted in a public GitHub file (find_string id 63241653895).
QWEN25_CODER_GPTQ_INT4: dict[str, Any] = {
    "batch_size": 1,
    "bits": 4,
    "block_name_to_quantize": None,
    "cache_block_outputs": True,
    "damp_percent": 0.01,
    "dataset": None,
    "desc_act": False,
    "exllama_config": {"version": 1},
    "group_size": 128,
    "max_input_length": None,
    "model_seqlen": None,
    "module_name_preceding_first_block": None,
    "modules_in_block_to_quantize": None,
    "pad_token_id": None,
    "quant_method": "gptq",
    "sym": True,
    "tokenizer": None,
    "true_sequential": True,
    "use_cuda_fp16": False,
    "use_exllama": True,
}

# A GPTQModel 6.0.3 (via optimum 2.1.0) checkpoint of a Llama-3 model saved with transformers
# 5.4.0, quoted in a public GitHub issue text (find_string id 69699966269); its `"dataset"`
# value is elided there (`[ ... ]`) and left out here, the leading `"...": true` key is cut.
GPTQMODEL_V2: dict[str, Any] = {
    "backend": "auto",
    "batch_size": 1,
    "bits": 4,
    "block_name_to_quantize": None,
    "cache_block_outputs": True,
    "checkpoint_format": "gptq_v2",
    "damp_percent": 0.1,
    "desc_act": False,
    "format": "gptq_v2",
    "group_size": 128,
    "max_input_length": None,
    "meta": {"quantizer": ["optimum:2.1.0", "gptqmodel:6.0.3"]},
    "model_seqlen": None,
    "module_name_preceding_first_block": None,
    "modules_in_block_to_quantize": None,
    "pad_token_id": None,
    "quant_method": "gptq",
    "sym": True,
    "tokenizer": None,
    "true_sequential": True,
}

# A Llama-3-8B-Instruct bnb-4bit checkpoint's config.json (transformers 4.46.1), quoted
# verbatim in a public GitHub file (find_string id 48504090255; the repository name is cut
# off in the quoted `_name_or_path`).
LLAMA3_8B_BNB_4BIT: dict[str, Any] = {
    "_load_in_4bit": True,
    "_load_in_8bit": False,
    "bnb_4bit_compute_dtype": "float32",
    "bnb_4bit_quant_storage": "uint8",
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False,
    "llm_int8_skip_modules": None,
    "llm_int8_threshold": 6.0,
    "load_in_4bit": True,
    "load_in_8bit": False,
    "quant_method": "bitsandbytes",
}

# transformers' serialized BitsAndBytesConfig(load_in_8bit=True) as asserted by a
# huggingface/diffusers pipeline-quantization test (find_string id 181673612).
BNB_8BIT: dict[str, Any] = {
    "_load_in_4bit": False,
    "_load_in_8bit": True,
    "bnb_4bit_compute_dtype": "float32",
    "bnb_4bit_quant_storage": "uint8",
    "bnb_4bit_quant_type": "fp4",
    "bnb_4bit_use_double_quant": False,
    "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False,
    "llm_int8_skip_modules": None,
    "llm_int8_threshold": 6.0,
    "load_in_4bit": False,
    "load_in_8bit": True,
    "quant_method": "bitsandbytes",
}

# deepseek-ai/DeepSeek-V3 README_WEIGHTS.md @ b4e06d883e655af15b9510ea155a6ae013720c54,
# "FP8 Configuration" (the checkpoint's quantization_config).
DEEPSEEK_V3_FP8: dict[str, Any] = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}

# A DeepSeek-V4 config.json (model_type deepseek_v4, transformers 4.57.1) quoted in a public
# GitHub file (find_string id 62459182027).
DEEPSEEK_V4_FP8: dict[str, Any] = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
}

# openai/gpt-oss-20b, https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json,
# quoted verbatim in a public GitHub file (find_string id 5715646759).
GPT_OSS_20B: dict[str, Any] = {
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
    "quant_method": "mxfp4",
}

# "Verbatim hf_quant_config.json from nvidia/Llama-3.3-70B-Instruct-FP4", a Go test fixture in
# a public GitHub repository (find_string id 61969877663); vLLM reads it as the
# quantization_config (vLLM 0.34.0 modelopt.py 328-365).
LLAMA33_70B_FP4_HF_QUANT: dict[str, Any] = {
    "producer": {"name": "modelopt", "version": "0.23.0"},
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": "FP8",
        "group_size": 16,
        "exclude_modules": ["lm_head"],
    },
}

# The flat config.json form ModelOpt writes (producer 0.34.1.dev85), as used verbatim in a
# FastDeploy test of ModelOptNvFp4Config (find_string id 55269927891).
MODELOPT_NVFP4_FLAT: dict[str, Any] = {
    "config_groups": {
        "group_0": {
            "input_activations": {
                "dynamic": False,
                "num_bits": 4,
                "type": "float",
                "group_size": 16,
            },
            "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
            "targets": ["Linear"],
        }
    },
    "quant_algo": "NVFP4",
    "producer": {"name": "modelopt", "version": "0.34.1.dev85+g7a72957d"},
    "quant_method": "modelopt",
}

# vllm-project/compressed-tensors README.md @ 6420f4aec7536448ee0795591ef6724277f21fa6
# ("Once done, the config.json will have the following quantization_config").
CT_README_MXFP4: dict[str, Any] = {
    "config_groups": {
        "group_0": {
            "format": "mxfp4-pack-quantized",
            "input_activations": {
                "actorder": None,
                "block_structure": None,
                "dynamic": True,
                "group_size": 32,
                "num_bits": 4,
                "observer": None,
                "observer_kwargs": {},
                "scale_dtype": "torch.uint8",
                "strategy": "group",
                "symmetric": True,
                "type": "float",
                "zp_dtype": None,
            },
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": 32,
                "num_bits": 4,
                "observer": "memoryless_minmax",
                "observer_kwargs": {},
                "scale_dtype": "torch.uint8",
                "strategy": "group",
                "symmetric": True,
                "type": "float",
                "zp_dtype": None,
            },
        }
    },
    "format": "mxfp4-pack-quantized",
    "global_compression_ratio": None,
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
    "sparsity_config": {},
    "transform_config": {},
    "version": "0.18.1.dev0+gac8e2ba.d20260813",
}

# huggingface/transformers tests/quantization/fbgemm_fp8/test_fbgemm_fp8.py
# @ 006bd23dd0ce18d54e1cf260b09b15fa943a731d, FbgemmFp8ConfigTest.test_from_dict.
FBGEMM_FP8: dict[str, Any] = {
    "modules_to_not_convert": ["lm_head.weight"],
    "quant_method": "fbgemm_fp8",
}


def _ct(fmt: str, weights: dict[str, Any], inputs: dict[str, Any] | None) -> dict[str, Any]:
    """The quantization_config compressed-tensors 0.20.1 writes for a preset
    (``QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(p, ["Linear"])},
    ignore=["lm_head"], format=fmt, quantization_status="compressed").model_dump(mode="json")``,
    recorded; ``test_ct_fixtures_are_the_librarys`` rebuilds them with the library)."""
    return {
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": inputs,
                "output_activations": None,
                "format": None,
            }
        },
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": None,
        "format": fmt,
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "moe_sparsity_config": None,
    }


_W4 = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 128, "strategy": "group"}
CT_W4A16 = _ct("pack-quantized", {**_W4, "dynamic": False}, None)
CT_W4A16_ASYM = _ct("pack-quantized", {**_W4, "symmetric": False, "dynamic": False}, None)
CT_FP8_DYNAMIC = _ct(
    "float-quantized",
    {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "group_size": None,
        "strategy": "channel",
        "dynamic": False,
    },
    {
        "num_bits": 8,
        "type": "float",
        "symmetric": True,
        "group_size": None,
        "strategy": "token",
        "dynamic": True,
    },
)
_FP4 = {
    "num_bits": 4,
    "type": "float",
    "symmetric": True,
    "group_size": 16,
    "strategy": "tensor_group",
    "scale_dtype": "torch.float8_e4m3fn",
}
CT_NVFP4 = _ct(
    "nvfp4-pack-quantized",
    {**_FP4, "dynamic": False},
    {**_FP4, "dynamic": "local", "observer": "static_minmax"},
)

_CT_PRESETS = {
    "W4A16": ("pack-quantized", CT_W4A16),
    "W4A16_ASYM": ("pack-quantized", CT_W4A16_ASYM),
    "FP8_DYNAMIC": ("float-quantized", CT_FP8_DYNAMIC),
    "NVFP4": ("nvfp4-pack-quantized", CT_NVFP4),
}


# --- schemes ------------------------------------------------------------------------------------


def test_awq_qwen3_32b() -> None:
    cq = parse_quantization_config(QWEN3_32B_AWQ)
    assert cq.scheme == AWQ(bits=4, group_size=128, version="gemm")
    assert (cq.method, cq.not_converted, cq.compute_dtype) == ("awq", (), None)
    assert cq.summary == "AWQ 4-bit GEMM, group 128, zero points (quantization_config)"
    # down_proj of the loaded model: qweight 25600 x 640 int32, qzeros 200 x 640, scales 200 x 5120
    assert tensor_storage(cq.scheme, 5120, 25600, 1) == (
        25600 * 640 * 4,
        200 * 640 * 4 + 200 * 5120 * 2,
    )


def test_awq_legacy_and_current_layout_keys() -> None:
    assert parse_quantization_config(
        {"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "GEMV"}
    ).scheme == AWQ(group_size=64, version="gemv")
    # transformers 5 writes `format`; a legacy `version` wins when both are present
    assert parse_quantization_config({"quant_method": "awq", "format": "gemv_fast"}).scheme == AWQ(
        version="gemv_fast"
    )
    both = {"quant_method": "awq", "format": "gemm", "version": "gemv"}
    assert parse_quantization_config(both).scheme == AWQ(version="gemv")


def test_gptq_qwen25_coder_int4() -> None:
    cq = parse_quantization_config(QWEN25_CODER_GPTQ_INT4)
    assert cq.scheme == GPTQ(bits=4, group_size=128, checkpoint_format="gptq")
    assert cq.method == "gptq" and cq.not_converted == ()
    assert cq.summary.startswith("GPTQ 4-bit, group 128, desc_act false, symmetric, gptq format")


def test_gptq_gptqmodel_v2_format() -> None:
    assert parse_quantization_config(GPTQMODEL_V2).scheme == GPTQ(checkpoint_format="gptq_v2")


def test_gptq_3bit_and_dynamic_skips() -> None:
    # 3-bit, group 128, act order, as the TheBloke `gptq-3bit-128g-actorder_True` branches
    # describe them (no verbatim 3-bit block was found; this one is built from those fields).
    qc = {"bits": 3, "group_size": 128, "desc_act": True, "sym": True, "quant_method": "gptq"}
    cq = parse_quantization_config(qc)
    assert cq.scheme == GPTQ(bits=3)
    assert "desc_act true" in cq.summary
    dynamic = {**qc, "dynamic": {"-:model.layers.0.mlp.*": {}, "+:.*down_proj": {"bits": 8}}}
    cq = parse_quantization_config(dynamic)
    assert cq.not_converted == ("-:model.layers.0.mlp.*",)
    assert "dynamic" in cq.summary
    assert is_not_converted("model.layers.0.mlp.up_proj", cq.not_converted)
    assert not is_not_converted("model.layers.1.mlp.up_proj", cq.not_converted)


def test_gptq_errors_name_the_allowed_values() -> None:
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({**QWEN25_CODER_GPTQ_INT4, "bits": 5})
    assert err.value.field == "quantization_config.bits"
    assert "2, 3, 4, 8" in err.value.message
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({"quant_method": "gptq", "checkpoint_format": "exl3"})
    assert err.value.field == "quantization_config.checkpoint_format"
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({"quant_method": "gptq", "group_size": 0})
    assert err.value.field == "quantization_config.group_size"


def test_bnb_nf4_double_quant_checkpoint() -> None:
    cq = parse_quantization_config(LLAMA3_8B_BNB_4BIT)
    assert cq.scheme == BitsAndBytes4bit(
        quant_type="nf4", block_size=64, double_quant=True, prequantized=True
    )
    assert (cq.method, cq.compute_dtype, cq.not_converted) == ("bitsandbytes", "fp32", ())
    assert "NF4 4-bit, blocks of 64, double quantization, compute fp32" in cq.summary


def test_bnb_8bit() -> None:
    cq = parse_quantization_config(BNB_8BIT)
    assert cq.scheme == Int8(scale_dtype="fp32")
    assert cq.compute_dtype is None


def test_bnb_transformers_serialization() -> None:
    from transformers import BitsAndBytesConfig

    four = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="bfloat16"
    ).to_dict()
    cq = parse_quantization_config(four)
    assert cq.scheme == BitsAndBytes4bit(quant_type="fp4", prequantized=True)
    assert cq.compute_dtype == "bf16"
    eight = BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=["lm_head"]).to_dict()
    cq = parse_quantization_config(eight)
    assert (cq.scheme, cq.not_converted) == (Int8(), ("lm_head",))
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({**four, "bnb_4bit_quant_type": "int4"})
    assert err.value.field == "quantization_config.bnb_4bit_quant_type"
    assert "nf4, fp4" in err.value.message


def test_fp8_deepseek_v3_block() -> None:
    cq = parse_quantization_config(DEEPSEEK_V3_FP8)
    assert cq.scheme == FP8(granularity="block", block_size=128)
    assert cq.summary == (
        "fp8 e4m3, 128x128 blocks (fp32 weight_scale_inv), dynamic activations "
        "(quantization_config)"
    )
    assert "ue8m0" in parse_quantization_config(DEEPSEEK_V4_FP8).summary


def test_fp8_per_tensor_static_and_errors() -> None:
    # vLLM's Fp8Config reads an absent weight_block_size as per-tensor scales.
    cq = parse_quantization_config(
        {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    )
    assert cq.scheme == FP8(granularity="tensor", input_scale=True)
    assert cq.not_converted == ("lm_head",)
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({**DEEPSEEK_V3_FP8, "weight_block_size": [1, 128]})
    assert err.value.field == "quantization_config.weight_block_size"
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({**DEEPSEEK_V3_FP8, "expert_dtype": "fp4"})
    assert err.value.field == "quantization_config.expert_dtype"


def test_fp8_transformers_default_serialization_is_128_blocks() -> None:
    from transformers import FineGrainedFP8Config

    cq = parse_quantization_config(FineGrainedFP8Config().to_dict())
    assert cq.scheme == FP8(granularity="block", block_size=128)


def test_fbgemm_fp8() -> None:
    cq = parse_quantization_config(FBGEMM_FP8)
    assert cq.scheme == FP8(granularity="channel")
    assert cq.not_converted == ("lm_head.weight",)


def test_mxfp4_gpt_oss_20b() -> None:
    cq = parse_quantization_config(GPT_OSS_20B)
    assert cq.scheme == MXFP4()
    assert cq.method == "mxfp4"
    assert cq.not_converted == tuple(GPT_OSS_20B["modules_to_not_convert"])
    skip = cq.not_converted
    assert is_not_converted("model.layers.3.self_attn.q_proj", skip)
    assert is_not_converted("model.layers.3.mlp.router", skip)
    assert is_not_converted("model.embed_tokens", skip)
    assert is_not_converted("lm_head", skip)
    assert not is_not_converted("model.layers.3.mlp.experts", skip)


def test_modelopt_nvfp4_legacy_hf_quant_config() -> None:
    cq = parse_quantization_config(LLAMA33_70B_FP4_HF_QUANT)
    assert cq.scheme == NVFP4(input_scale=True)
    assert (cq.method, cq.not_converted) == ("modelopt", ("lm_head",))
    assert "KV cache FP8" in cq.summary


def test_modelopt_flat_config_and_algorithms() -> None:
    assert parse_quantization_config(MODELOPT_NVFP4_FLAT).scheme == NVFP4(input_scale=True)
    base = {"quant_method": "modelopt", "ignore": ["lm_head", "*.mlp.gate"]}
    w4a16 = parse_quantization_config({**base, "quant_algo": "W4A16_NVFP4"})
    assert w4a16.scheme == NVFP4(input_scale=False)
    assert w4a16.not_converted == ("lm_head", "*.mlp.gate")
    assert parse_quantization_config({**base, "quant_algo": "FP8"}).scheme == FP8(
        granularity="tensor", input_scale=True
    )
    assert parse_quantization_config(
        {**base, "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}
    ).scheme == FP8(granularity="channel")
    assert parse_quantization_config({**base, "quant_algo": "FP8_PB_WO"}).scheme == FP8(
        granularity="block", block_size=128
    )
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({**base, "quant_algo": "MIXED_PRECISION"})
    assert err.value.field == "quantization_config.quant_algo"
    assert "NVFP4" in err.value.message


def test_compressed_tensors_readme_mxfp4() -> None:
    cq = parse_quantization_config(CT_README_MXFP4)
    assert cq.scheme == MXFP4()
    assert (cq.method, cq.not_converted) == ("compressed-tensors", ("lm_head",))


def test_compressed_tensors_w4a16_symmetric_and_asymmetric() -> None:
    sym = parse_quantization_config(CT_W4A16)
    assert sym.scheme == CompressedTensors(
        format="pack-quantized", num_bits=4, type="int", strategy="group", group_size=128
    )
    assert sym.summary.startswith(
        "compressed-tensors pack-quantized: int4 weights, group 128, symmetric, bf16 scales"
    )
    asym = parse_quantization_config(CT_W4A16_ASYM)
    assert asym.scheme == CompressedTensors(symmetric=False)
    # fp16 checkpoints keep fp16 scales
    fp16 = parse_quantization_config(CT_W4A16, model_dtype="float16")
    assert isinstance(fp16.scheme, CompressedTensors) and fp16.scheme.scale_dtype == "fp16"


def test_compressed_tensors_fp8_dynamic_and_nvfp4() -> None:
    fp8 = parse_quantization_config(CT_FP8_DYNAMIC)
    assert fp8.scheme == CompressedTensors(
        format="float-quantized", type="float", num_bits=8, strategy="channel", group_size=None
    )
    fp8_tensor = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"}
    static = _ct("float-quantized", fp8_tensor, {**fp8_tensor, "dynamic": False})
    assert parse_quantization_config(static).scheme == CompressedTensors(
        format="float-quantized",
        type="float",
        num_bits=8,
        strategy="tensor",
        group_size=None,
        input_scale=True,
    )
    assert parse_quantization_config(CT_NVFP4).scheme == NVFP4(input_scale=True)
    a16 = _ct("nvfp4-pack-quantized", {**_FP4, "dynamic": False}, None)
    assert parse_quantization_config(a16).scheme == NVFP4(input_scale=False)


def test_compressed_tensors_actorder_group_and_block_strings() -> None:
    weights = {**_W4, "actorder": "group"}
    cq = parse_quantization_config(_ct("pack-quantized", weights, None))
    assert isinstance(cq.scheme, CompressedTensors) and cq.scheme.g_idx
    static = parse_quantization_config(_ct("pack-quantized", {**_W4, "actorder": "static"}, None))
    assert isinstance(static.scheme, CompressedTensors) and not static.scheme.g_idx
    block = {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": "128x128"}
    cq = parse_quantization_config(_ct("float-quantized", block, None))
    assert isinstance(cq.scheme, CompressedTensors)
    assert cq.scheme.block_structure == (128, 128)


def test_compressed_tensors_mixed_groups_are_refused() -> None:
    qc = _ct("mixed-precision", {**_W4}, None)
    qc["config_groups"]["group_1"] = {
        "targets": ["re:.*self_attn.*"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
        "format": "float-quantized",
    }
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config(qc)
    assert err.value.field == "quantization_config.config_groups"
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({**CT_W4A16, "format": "sparse-24-bitmask"})
    assert err.value.field == "quantization_config.format"
    assert "pack-quantized" in err.value.message


def test_compressed_tensors_bad_strategy_names_the_field() -> None:
    qc = _ct("pack-quantized", {**_W4, "strategy": "rowwise"}, None)
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config(qc)
    assert err.value.field == "quantization_config.config_groups.group_0.weights.strategy"
    assert "tensor_group" in err.value.message


def test_unknown_and_missing_methods_name_the_supported_ones() -> None:
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({"quant_method": "hqq"})
    assert err.value.field == "quantization_config.quant_method"
    for method in SUPPORTED_METHODS:
        assert method in err.value.message
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({"bits": 4})
    assert err.value.field == "quantization_config.quant_method"
    with pytest.raises(InvalidWorkload) as err:
        parse_quantization_config({**QWEN3_32B_AWQ, "bits": 8})
    assert err.value.field == "quantization_config.bits"


@pytest.mark.parametrize(
    "qc",
    [
        QWEN3_32B_AWQ,
        QWEN25_CODER_GPTQ_INT4,
        GPTQMODEL_V2,
        LLAMA3_8B_BNB_4BIT,
        BNB_8BIT,
        DEEPSEEK_V3_FP8,
        GPT_OSS_20B,
        LLAMA33_70B_FP4_HF_QUANT,
        MODELOPT_NVFP4_FLAT,
        CT_README_MXFP4,
        CT_W4A16,
        CT_W4A16_ASYM,
        CT_FP8_DYNAMIC,
        CT_NVFP4,
        FBGEMM_FP8,
    ],
)
def test_every_parsed_scheme_is_a_valid_request(qc: dict[str, Any]) -> None:
    """What the parser returns decodes back through the wire type (ranges and rules hold)."""
    scheme = parse_quantization_config(qc).scheme
    assert msgspec.convert(msgspec.to_builtins(scheme), Quantization) == scheme


@pytest.mark.parametrize("preset", sorted(_CT_PRESETS))
def test_ct_fixtures_are_the_librarys(preset: str) -> None:
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    fmt, fixture = _CT_PRESETS[preset]
    built = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
        ignore=["lm_head"],
        format=fmt,
        quantization_status="compressed",
    ).model_dump(mode="json")
    assert built == fixture


# --- which modules stay unquantized -------------------------------------------------------------

_TRANSFORMERS_CASES = [
    ("lm_head", "lm_head"),
    ("model.layers.1.self_attn.q_proj", "model.layers.1"),
    ("model.layers.11.self_attn.q_proj", "model.layers.1"),
    ("model.layers.11.self_attn.q_proj", "model.layers.*.self_attn"),
    ("model.layers.0.mlp.gate_proj", "mlp.gate"),
    ("model.layers.0.mlp.gate", "mlp.gate"),
    ("model.decoder.layers.23.fc1", "fc1"),
    ("model.visual.blocks.0.attn.qkv", "visual"),
    ("visual.blocks.0.attn.qkv", "visual"),
]


@pytest.mark.parametrize(("path", "pattern"), _TRANSFORMERS_CASES)
def test_default_rule_is_transformers_should_convert_module(path: str, pattern: str) -> None:
    from transformers.quantizers.quantizers_utils import should_convert_module

    assert is_not_converted(path, [pattern]) == (not should_convert_module(path, [pattern]))


def test_matching_rules_by_library() -> None:
    # transformers: prefix up to a module boundary, regex, or suffix
    assert is_not_converted("model.layers.0.mlp.gate", ["mlp.gate"])
    assert not is_not_converted("model.layers.0.mlp.gate_proj", ["mlp.gate"])
    # compressed-tensors: `re:` is re.match from the start; other names are exact
    assert is_not_converted("model.layers.0.mlp.gate", ["re:.*mlp.gate$"])
    assert not is_not_converted("model.layers.0.mlp.gate_proj", ["re:.*mlp.gate$"])
    ct = "compressed-tensors"
    assert is_not_converted("lm_head", ["lm_head"], method=ct)
    assert not is_not_converted("model.lm_head.proj", ["lm_head"], method=ct)
    # ModelOpt (vLLM is_layer_excluded): wildcards and substrings
    assert is_not_converted("model.layers.3.mlp.gate", ["*.mlp.gate"], method="modelopt")
    assert is_not_converted("model.layers.3.self_attn.q_proj", ["self_attn"], method="modelopt")
    assert not is_not_converted("model.layers.3.mlp.down_proj", ["*.mlp.gate"], method="modelopt")
    # a ModelOpt wildcard under the default rule falls back to shell matching
    assert is_not_converted("model.layers.3.mlp.gate", ["*.mlp.gate"])


def test_a_checkpoint_matches_its_skips_by_its_own_library_rule() -> None:
    # `ignore: ["self_attn"]` left unquantized: compressed-tensors takes a non-`re:` name as an
    # exact module path (utils/match.py 445), ModelOpt as a substring (vLLM is_layer_excluded),
    # transformers as a module-boundary prefix or suffix -- `self_attn` is neither a prefix of
    # nor a suffix of `model.layers.0.self_attn.q_proj`, and not equal to it.
    ct = parse_quantization_config(
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "ignore": ["self_attn"],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                }
            },
        }
    )
    mo = parse_quantization_config(
        {
            "quant_method": "modelopt",
            "quant_algo": "FP8",
            "exclude_modules": ["self_attn"],
        }
    )
    path = "model.layers.0.self_attn.q_proj"
    assert not ct.leaves_unquantized(path)
    assert ct.leaves_unquantized("self_attn")
    assert mo.leaves_unquantized(path)
    assert not is_not_converted(path, ["self_attn"])  # the default (transformers) rule


def test_re_patterns_match_compressed_tensors_match_name() -> None:
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.utils.match import match_name

    cases = [
        ("model.layers.0.mlp.gate", "re:.*mlp.gate$"),
        ("model.layers.0.mlp.gate_proj", "re:.*mlp.gate$"),
        ("lm_head", "lm_head"),
        ("model.lm_head", "lm_head"),
        ("model.visual.blocks.0.attn.qkv", "re:visual.*"),
        ("model.visual.blocks.0.attn.qkv", "re:.*visual.*"),
    ]
    for path, pattern in cases:
        mine = is_not_converted(path, [pattern], method="compressed-tensors")
        assert mine == match_name(path, pattern), (path, pattern)
