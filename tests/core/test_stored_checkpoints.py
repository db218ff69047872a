"""Stored bytes of quantized checkpoints in their real formats, by hand from each format's spec,
through the whole path: the safetensors header (every tensor's name, dtype and shape as the
library that writes the format saves it) -> ``resolve_config`` -> ``estimate``, and against the
formula path (the same ``config.json`` with its ``quantization_config`` and no header).

Architectures: Qwen2.5-0.5B (its preset's config: hidden 896, MLP 4864, 14 heads / 2 KV heads of
64, 24 layers, vocabulary 151,936, tied embeddings, q/k/v biases) for AWQ, GPTQ, bitsandbytes
NF4 and fp8 blocks; gpt-oss-20b (the corpus config) for MXFP4. Expected bytes are written out
from the dimensions; nothing expected is computed by the code under test.

The header path always builds the framework's inventory (``resolve_config`` with a checkpoint),
whose weights include the rotary buffers transformers computes at load: Qwen2's
``model.rotary_emb.inv_freq`` and ``original_inv_freq``, fp32 (32,) each = 256 B
(:data:`ROTARY`). The closed form the formula path uses for Qwen2 leaves them out, so the two
paths differ by exactly those 256 B; the header path is right (the buffers are allocated on the
device when the model is moved there).
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest

from tests.core.test_quant_config import (
    DEEPSEEK_V3_FP8,
    LLAMA3_8B_BNB_4BIT,
    QWEN3_32B_AWQ,
    QWEN25_CODER_GPTQ_INT4,
)
from tests.support.published import corpus_entries
from tests.support.workloads import workload
from vrambudget.core.catalog import preset
from vrambudget.core.checkpoint import Checkpoint, StoredTensor, collapse
from vrambudget.core.components import Component
from vrambudget.core.deployed import deploy
from vrambudget.core.estimate import estimate
from vrambudget.core.families.inventory import arch_from_inventory
from vrambudget.core.quantization import bnb_serialized_state_bytes
from vrambudget.core.spec import BitsAndBytes4bit
from vrambudget.core.stored import loaded_by, with_stored_tensors
from vrambudget.workloads.hf.resolve import cached_inventory, resolve_config

# Bytes per element of the safetensors dtype codes used here (the format's spec).
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1, "F8_E4M3": 1}


def tensor(name: str, dtype: str, shape: tuple[int, ...]) -> StoredTensor:
    """A header entry: ``data_offsets`` end - begin = elements x bytes per element."""
    return StoredTensor(
        name=name, dtype=dtype, shape=shape, nbytes=math.prod(shape) * DTYPE_BYTES[dtype]
    )


QWEN: dict[str, Any] = dict(preset("qwen2.5-0.5b").config or {})
H, F, KV, L, V = 896, 4864, 2 * 64, 24, 151_936
# (module, out_features, in_features, has bias): Qwen2 attention has q/k/v biases.
LINEARS = (
    ("self_attn.q_proj", H, H, True),
    ("self_attn.k_proj", KV, H, True),
    ("self_attn.v_proj", KV, H, True),
    ("self_attn.o_proj", H, H, False),
    ("mlp.gate_proj", F, H, False),
    ("mlp.up_proj", F, H, False),
    ("mlp.down_proj", H, F, False),
)
ROTARY = 2 * 32 * 4
"""model.rotary_emb.inv_freq and original_inv_freq: fp32, head_dim 64 / 2 = 32 values each."""

# Unquantized in every format: embed_tokens (the tied lm_head is not stored), 2 norms per layer
# + the final norm, q/k/v biases; 2 bytes each (bf16 or fp16).
UNQUANTIZED = 151_936 * 896 * 2 + (2 * 24 + 1) * 896 * 2 + 24 * (896 + 128 + 128) * 2
# Linear elements of one layer: q, o 896 x 896; k, v 128 x 896; gate, up, down 4864 x 896.
LAYER_LINEAR = 2 * 896 * 896 + 2 * 128 * 896 + 3 * 4864 * 896
PACKED_4BIT = 24 * LAYER_LINEAR // 2  # two 4-bit values per byte, however they are packed


def test_the_dimensions_are_the_presets() -> None:
    assert (QWEN["hidden_size"], QWEN["intermediate_size"], QWEN["num_hidden_layers"]) == (H, F, L)
    assert QWEN["vocab_size"] == V and QWEN["tie_word_embeddings"] is True
    assert QWEN["num_key_value_heads"] * QWEN["hidden_size"] // QWEN["num_attention_heads"] == KV
    assert UNQUANTIZED == 272_412_416
    assert LAYER_LINEAR == 14_909_440
    assert PACKED_4BIT == 178_913_280


def unquantized(dtype: str) -> list[StoredTensor]:
    out = [
        tensor("model.embed_tokens.weight", dtype, (V, H)),
        tensor("model.norm.weight", dtype, (H,)),
    ]
    for i in range(L):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out.append(tensor(f"model.layers.{i}.{norm}.weight", dtype, (H,)))
        for module, out_f, _, bias in LINEARS:
            if bias:
                out.append(tensor(f"model.layers.{i}.{module}.bias", dtype, (out_f,)))
    return out


def awq_gemm_header(group: int = 128) -> list[StoredTensor]:
    # AutoAWQ 0.2.9 awq/modules/linear/gemm.py 135-166 (WQLinear_GEMM) and GPTQModel 7.7.0
    # nn_modules/qlinear/__init__.py 1769-1791 (AWQuantLinear, what transformers 5.23.0
    # integrations/awq.py 76-101 builds): qweight int32 (in, out / 8), qzeros int32
    # (in / group, out / 8), scales fp16 (in / group, out), bias fp16 (out,).
    out = unquantized("F16")
    for i in range(L):
        for module, o, n, _ in LINEARS:
            p = f"model.layers.{i}.{module}."
            out += [
                tensor(p + "qweight", "I32", (n, o // 8)),
                tensor(p + "qzeros", "I32", (n // group, o // 8)),
                tensor(p + "scales", "F16", (n // group, o)),
            ]
    return out


def gptq_header(group: int = 128) -> list[StoredTensor]:
    # GPTQModel 7.7.0 nn_modules/qlinear/__init__.py 932-958 (_register_gptq_buffers, 4-bit in
    # int32 words): qweight (in * 4 / 32, out), qzeros (in / group, out * 4 / 32), scales fp16
    # (in / group, out), g_idx int32 (in,), bias fp16 (out,).
    out = unquantized("F16")
    for i in range(L):
        for module, o, n, _ in LINEARS:
            p = f"model.layers.{i}.{module}."
            out += [
                tensor(p + "qweight", "I32", (n // 8, o)),
                tensor(p + "qzeros", "I32", (n // group, o // 8)),
                tensor(p + "scales", "F16", (n // group, o)),
                tensor(p + "g_idx", "I32", (n,)),
            ]
    return out


OFFSET = 0.02783203125
"""A double-quantization offset (``absmax.mean()``, an fp32 value) as the JSON records it."""


def bnb_state_json(out_f: int, in_f: int) -> str:
    # bitsandbytes 0.50.2 functional.py 545-577 (QuantState.as_dict(packed=True): the non-tensor
    # items in this order) and utils.py 166-180 (pack_dict_to_tensor: json.dumps, UTF-8 bytes).
    return json.dumps(
        {
            "quant_type": "nf4",
            "blocksize": 64,
            "dtype": "bfloat16",
            "shape": [out_f, in_f],
            "nested_blocksize": 256,
            "nested_dtype": "float32",
            "nested_offset": OFFSET,
        }
    )


def bnb_nf4_header(
    dims: tuple[int, int, int, int, int] = (H, F, KV, L, V),
) -> list[StoredTensor]:
    # bitsandbytes 0.50.2 nn/modules.py 593-607 (Linear4bit._save_to_state_dict: the weight,
    # then every item of quant_state.as_dict(packed=True) as "weight." + key); _ops.py 233-235
    # (weight uint8 ((n + 1) // 2, 1), one absmax per block of 64); functional.py 938-949
    # (double quantization: absmax quantized to uint8 in blocks of 256 -> nested_absmax fp32,
    # nested_quant_map the 256-entry fp32 dynamic map); quant_map the 16 fp32 NF4 values.
    h, f, kv, layers, _ = dims
    linears = (
        ("self_attn.q_proj", h, h),
        ("self_attn.k_proj", kv, h),
        ("self_attn.v_proj", kv, h),
        ("self_attn.o_proj", h, h),
        ("mlp.gate_proj", f, h),
        ("mlp.up_proj", f, h),
        ("mlp.down_proj", h, f),
    )
    out = unquantized("BF16") if dims == (H, F, KV, L, V) else []
    for i in range(layers):
        for module, o, n in linears:
            p = f"model.layers.{i}.{module}.weight"
            blocks = -(-o * n // 64)
            state = bnb_state_json(o, n).encode()
            out += [
                tensor(p, "U8", ((o * n + 1) // 2, 1)),
                tensor(p + ".absmax", "U8", (blocks,)),
                tensor(p + ".nested_absmax", "F32", (-(-blocks // 256),)),
                tensor(p + ".nested_quant_map", "F32", (256,)),
                tensor(p + ".quant_map", "F32", (16,)),
                tensor(p + ".quant_state.bitsandbytes__nf4", "U8", (len(state),)),
            ]
    return out


def fp8_block_header() -> list[StoredTensor]:
    # transformers 5.23.0 integrations/finegrained_fp8.py 408-420 (FP8Linear): weight
    # float8_e4m3fn (out, in); weight_scale_inv fp32 (ceil(out / 128), ceil(in / 128)).
    out = unquantized("BF16")
    for i in range(L):
        for module, o, n, _ in LINEARS:
            p = f"model.layers.{i}.{module}."
            out += [
                tensor(p + "weight", "F8_E4M3", (o, n)),
                tensor(p + "weight_scale_inv", "F32", (-(-o // 128), -(-n // 128))),
            ]
    return out


def bf16_header() -> list[StoredTensor]:
    out = unquantized("BF16")
    for i in range(L):
        for module, o, n, _ in LINEARS:
            out.append(tensor(f"model.layers.{i}.{module}.weight", "BF16", (o, n)))
    return out


def qwen(torch_dtype: str, qc: dict[str, Any]) -> dict[str, Any]:
    return {**QWEN, "torch_dtype": torch_dtype, "quantization_config": qc}


def lines(model: Any) -> tuple[int, int]:
    """(weights, quantization_metadata) of a default inference budget (TP = 1, one device)."""
    w = workload(kind="inference", model={"source": "preset", "id": "qwen2.5-0.5b"})
    budget = estimate((msgspec.structs.replace(w, model=model),))
    assert len(budget.devices) == 1
    by = {line.component: line.bytes for line in budget.devices[0].lines}
    return by[Component.WEIGHTS], by.get(Component.QUANTIZATION_METADATA, 0)


def header_path(config: dict[str, Any], tensors: list[StoredTensor]) -> tuple[int, int]:
    ckpt = Checkpoint(tensors=tuple(tensors))
    return lines(resolve_config(config, name="header", origin="test", checkpoint=ckpt))


def formula_path(config: dict[str, Any]) -> tuple[int, int]:
    return lines(resolve_config(config, name="formula", origin="test"))


# --- AWQ ----------------------------------------------------------------------------------------

# The Qwen3-32B-AWQ quantization_config (bits 4, group 128, gemm, zero points); AutoAWQ saves
# fp16 checkpoints ("torch_dtype": "float16", e.g. LDCC/Qwen2.5-72B-Instruct-ko-AWQ config.json).
AWQ_CONFIG = qwen("float16", QWEN3_32B_AWQ)
# Per layer, groups of 128 along `in` (896 -> 7 groups, 4864 -> 38):
#   qzeros int32 (groups, out / 8) = groups x out / 2 B;
#   scales fp16 (groups, out) = groups x out x 2 B
AWQ_LAYER_META = (
    2 * (7 * 896 // 2 + 7 * 896 * 2)  # q, o: 3,136 + 12,544
    + 2 * (7 * 128 // 2 + 7 * 128 * 2)  # k, v: 448 + 1,792
    + 2 * (7 * 4864 // 2 + 7 * 4864 * 2)  # gate, up: 17,024 + 68,096
    + (38 * 896 // 2 + 38 * 896 * 2)  # down: 17,024 + 68,096
)
AWQ_WEIGHTS = UNQUANTIZED + PACKED_4BIT  # qweight int32 (in, out / 8): in x out / 2 B


def test_awq_gemm_header() -> None:
    assert AWQ_LAYER_META == 291_200
    assert (AWQ_WEIGHTS, 24 * AWQ_LAYER_META) == (451_325_696, 6_988_800)
    assert Checkpoint(tensors=tuple(awq_gemm_header())).stored_bytes == 451_325_696 + 6_988_800
    assert header_path(AWQ_CONFIG, awq_gemm_header()) == (451_325_696 + ROTARY, 6_988_800)


def test_awq_formula_path_is_the_header_less_the_rotary_buffers() -> None:
    assert formula_path(AWQ_CONFIG) == (451_325_696, 6_988_800)


# --- GPTQ ---------------------------------------------------------------------------------------

GPTQ_CONFIG = qwen("float16", QWEN25_CODER_GPTQ_INT4)
# AWQ's qzeros and scales, and g_idx int32 (in,): 896 x 4 = 3,584 (x 6), 4864 x 4 = 19,456 (down).
GPTQ_LAYER_META = AWQ_LAYER_META + 6 * 896 * 4 + 4864 * 4


def test_gptq_header() -> None:
    assert GPTQ_LAYER_META == 332_160
    assert 24 * GPTQ_LAYER_META == 7_971_840
    # qweight int32 (in / 8, out): in x out / 2 B, as AWQ's.
    assert header_path(GPTQ_CONFIG, gptq_header()) == (451_325_696 + ROTARY, 7_971_840)


def test_gptq_formula_path_is_the_header_less_the_rotary_buffers() -> None:
    assert formula_path(GPTQ_CONFIG) == (451_325_696, 7_971_840)


# --- bitsandbytes NF4, double quantization -----------------------------------------------------

BNB_CONFIG = qwen("bfloat16", LLAMA3_8B_BNB_4BIT)
# What loading puts on the device per 4-bit weight (bitsandbytes 0.50.2 functional.py 494-543,
# QuantState.from_dict, through transformers 5.23.0 integrations/bitsandbytes.py 64-96 and
# Params4bit.from_prequantized, nn/modules.py 356-379): absmax uint8 (blocks), nested_absmax
# fp32 (ceil(blocks / 256)), nested_quant_map fp32 (256) = 1,024 B, quant_map fp32 (16) = 64 B,
# and the offset, torch.tensor(float(nested_offset)) fp32 = 4 B (functional.py 523). The JSON
# blob is unpacked into Python values (functional.py 515-518) and never reaches the device.
#   q, o: 802,816 values -> 12,544 blocks, 49 nested: 12,544 + 49 x 4 + 1,024 + 64 + 4 = 13,832
#   k, v: 114,688 -> 1,792 blocks, 7 nested: 1,792 + 28 + 1,092 = 2,912
#   gate, up, down: 4,358,144 -> 68,096 blocks, 266 nested: 68,096 + 1,064 + 1,092 = 70,252
BNB_LAYER_META = 2 * 13_832 + 2 * 2_912 + 3 * 70_252
# The checkpoint stores the JSON instead of the offset: 164 bytes for the 3-digit shapes
# ([896, 896], [128, 896]) and 165 for [4864, 896] and [896, 4864].
BNB_LAYER_STORED_META = BNB_LAYER_META - 7 * 4 + 4 * 164 + 3 * 165


def test_bnb_state_json_lengths() -> None:
    shape_896 = (
        '{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [896, 896], '
        '"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.02783203125}'
    )
    assert bnb_state_json(896, 896) == shape_896
    assert len(shape_896) == 164
    assert [len(bnb_state_json(o, n)) for o, n in ((128, 896), (4864, 896), (896, 4864))] == [
        164,
        165,
        165,
    ]
    nf4 = BitsAndBytes4bit(quant_type="nf4", double_quant=True, prequantized=True)
    assert bnb_serialized_state_bytes(nf4, (896, 896), "bfloat16", OFFSET) == 164


def test_bnb_nf4_header_is_the_published_llama_count() -> None:
    # unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit (research corpus; huggingface.js counts the U8
    # weights x 2 and leaves out the quant-state tensors): U8 6,979,321,856 = 3,489,660,928
    # packed bytes x 2. The same builder at Llama 3.1 8B's dimensions stores exactly that.
    llama = bnb_nf4_header((4096, 14_336, 1024, 32, 128_256))
    packed = sum(t.nbytes for t in llama if t.name.endswith(".weight"))
    assert packed * 2 == 6_979_321_856


def test_bnb_formula_path() -> None:
    assert BNB_LAYER_META == 244_244
    assert formula_path(BNB_CONFIG) == (451_325_696, 24 * 244_244)


def test_bnb_header_stores_the_json_not_the_offset() -> None:
    assert BNB_LAYER_STORED_META == 245_367
    stored = Checkpoint(tensors=tuple(bnb_nf4_header())).stored_bytes
    assert stored == 451_325_696 + 24 * 245_367


def test_bnb_header_path_is_what_loading_keeps() -> None:
    assert header_path(BNB_CONFIG, bnb_nf4_header()) == (451_325_696 + ROTARY, 24 * 244_244)


# --- fp8, 128 x 128 blocks ---------------------------------------------------------------------

FP8_CONFIG = qwen("bfloat16", DEEPSEEK_V3_FP8)
# weight one byte per element; weight_scale_inv fp32 (ceil(out/128), ceil(in/128)):
#   q, o 7 x 7; k, v 1 x 7; gate, up 38 x 7; down 7 x 38
FP8_LAYER_META = (2 * 7 * 7 + 2 * 1 * 7 + 3 * 38 * 7) * 4
FP8_WEIGHTS = UNQUANTIZED + 24 * LAYER_LINEAR


def test_fp8_block_header() -> None:
    assert (FP8_LAYER_META, FP8_WEIGHTS) == (3_640, 630_238_976)
    assert header_path(FP8_CONFIG, fp8_block_header()) == (630_238_976 + ROTARY, 24 * 3_640)


def test_fp8_formula_path_is_the_header_less_the_rotary_buffers() -> None:
    assert formula_path(FP8_CONFIG) == (630_238_976, 87_360)


# --- MXFP4 (gpt-oss-20b) -----------------------------------------------------------------------

GPT_OSS: dict[str, Any] = next(
    e["config"] for e in corpus_entries() if e["repo_id"] == "openai/gpt-oss-20b"
)


def gpt_oss_header() -> list[StoredTensor]:
    # transformers 5.23.0: models/gpt_oss/modeling_gpt_oss.py 74-77 (experts gate_up_proj
    # (E, H, 2F), down_proj (E, F, H), biases (E, 2F), (E, H)); quantizers/quantizer_mxfp4.py
    # 221-222 (stored as {proj}_blocks and {proj}_scales); integrations/mxfp4.py 199, 245-249,
    # 285 (blocks = the transposed weight, 16 bytes (32 fp4 values) per block: (E, out, in / 32,
    # 16) uint8; scales (E, out, in / 32) uint8 e8m0). Attention, router, sinks, norms,
    # embeddings and lm_head bf16 (modules_to_not_convert).
    h, e, f, v = 2880, 32, 2880, 201_088
    out = [
        tensor("model.embed_tokens.weight", "BF16", (v, h)),
        tensor("model.norm.weight", "BF16", (h,)),
        tensor("lm_head.weight", "BF16", (v, h)),
    ]
    for i in range(24):
        p = f"model.layers.{i}."
        out += [
            tensor(p + "input_layernorm.weight", "BF16", (h,)),
            tensor(p + "post_attention_layernorm.weight", "BF16", (h,)),
            tensor(p + "self_attn.q_proj.weight", "BF16", (64 * 64, h)),
            tensor(p + "self_attn.q_proj.bias", "BF16", (64 * 64,)),
            tensor(p + "self_attn.k_proj.weight", "BF16", (8 * 64, h)),
            tensor(p + "self_attn.k_proj.bias", "BF16", (8 * 64,)),
            tensor(p + "self_attn.v_proj.weight", "BF16", (8 * 64, h)),
            tensor(p + "self_attn.v_proj.bias", "BF16", (8 * 64,)),
            tensor(p + "self_attn.o_proj.weight", "BF16", (h, 64 * 64)),
            tensor(p + "self_attn.o_proj.bias", "BF16", (h,)),
            tensor(p + "self_attn.sinks", "BF16", (64,)),
            tensor(p + "mlp.router.weight", "BF16", (e, h)),
            tensor(p + "mlp.router.bias", "BF16", (e,)),
            tensor(p + "mlp.experts.gate_up_proj_blocks", "U8", (e, 2 * f, h // 32, 16)),
            tensor(p + "mlp.experts.gate_up_proj_scales", "U8", (e, 2 * f, h // 32)),
            tensor(p + "mlp.experts.gate_up_proj_bias", "BF16", (e, 2 * f)),
            tensor(p + "mlp.experts.down_proj_blocks", "U8", (e, h, f // 32, 16)),
            tensor(p + "mlp.experts.down_proj_scales", "U8", (e, h, f // 32)),
            tensor(p + "mlp.experts.down_proj_bias", "BF16", (e, h)),
        ]
    return out


# bf16 elements: embed + lm_head 2 x 201,088 x 2,880 = 1,158,266,880; final norm 2,880; per
# layer norms 5,760, q 4,096 x 2,880 + 4,096 = 11,800,576, k and v 512 x 2,880 + 512 =
# 1,475,072 each, o 2,880 x 4,096 + 2,880 = 11,799,360, sinks 64, router 32 x 2,880 + 32 =
# 92,192, expert biases 32 x 5,760 + 32 x 2,880 = 276,480 -> 26,924,576 per layer.
GPT_OSS_BF16 = (
    1_158_266_880
    + 2_880
    + 24 * (5_760 + 11_800_576 + 2 * 1_475_072 + 11_799_360 + 64 + 92_192 + 276_480)
)
# U8 blocks: 24 x 32 x (5,760 x 90 x 16 + 2,880 x 90 x 16); scales: 24 x 32 x (5,760 + 2,880) x 90
GPT_OSS_BLOCKS = 24 * 32 * (5_760 * 90 * 16 + 2_880 * 90 * 16)
GPT_OSS_SCALES = 24 * 32 * (5_760 + 2_880) * 90
GPT_OSS_ROTARY = 2 * 32 * 4  # inv_freq and original_inv_freq, fp32, head_dim 64 / 2


def test_mxfp4_header_is_the_published_count() -> None:
    # huggingface.js parse-safetensors-metadata.spec.ts (openai/gpt-oss-20b @ bbf09307):
    # { BF16: 1_804_459_584, U8: 19_110_297_600 } (U8 x 2), "Previously 21_511_953_984, which
    # counted the 597_196_800 `..._scales` UE8M0 block exponents as parameters".
    assert (GPT_OSS_BF16, GPT_OSS_BLOCKS * 2, GPT_OSS_SCALES) == (
        1_804_459_584,
        19_110_297_600,
        597_196_800,
    )
    header = gpt_oss_header()
    by_dtype: dict[str, int] = {}
    for t in header:
        if not t.name.endswith("_scales"):
            by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.numel
    assert by_dtype == {"BF16": 1_804_459_584, "U8": 9_555_148_800}
    assert Checkpoint(tensors=tuple(header)).stored_bytes == 13_761_264_768


def test_mxfp4_header_and_formula_paths() -> None:
    weights = 1_804_459_584 * 2 + 9_555_148_800 + GPT_OSS_ROTARY
    assert weights == 13_164_068_224
    # gpt_oss has no closed form: both paths budget the framework's inventory, so the rotary
    # buffers are in both and the paths agree to the byte.
    assert header_path(GPT_OSS, gpt_oss_header()) == (13_164_068_224, 597_196_800)
    assert formula_path(GPT_OSS) == (13_164_068_224, 597_196_800)


# --- what a model does not load ----------------------------------------------------------------

# bf16, unquantized: per layer 14,909,440 x 2 + biases 2,304 + norms 2 x 896 x 2 = 29,824,768
BF16_LAYER = 14_909_440 * 2 + 2_304 + 3_584


def _stored_layers(tensors: list[StoredTensor]) -> tuple[tuple[tuple[int, int] | None, int], ...]:
    inv = cached_inventory(QWEN)
    arch = with_stored_tensors(arch_from_inventory(inv), collapse(tensors), inv)
    assert arch.num_layers == 24
    return tuple((layer.stored, n) for layer, n in arch.layer_runs)


def _mtp_only() -> list[StoredTensor]:
    # DeepSeek-V3's multi-token-prediction tensors under an index past the stack (its layer 61;
    # here 24): enorm, hnorm, eh_proj, shared_head.norm, shared_head.head.
    p = "model.layers.24."
    return [
        tensor(p + "enorm.weight", "BF16", (H,)),
        tensor(p + "hnorm.weight", "BF16", (H,)),
        tensor(p + "eh_proj.weight", "BF16", (H, 2 * H)),
        tensor(p + "shared_head.norm.weight", "BF16", (H,)),
        tensor(p + "shared_head.head.weight", "BF16", (V, H)),
    ]


def _inv_freq() -> list[StoredTensor]:
    # Older Llama checkpoints store one rotary table per layer.
    return [
        tensor(f"model.layers.{i}.self_attn.rotary_emb.inv_freq", "F32", (32,)) for i in range(L)
    ]


def test_stored_bytes_per_layer_of_a_bf16_header() -> None:
    assert BF16_LAYER == 29_824_768
    assert _stored_layers(bf16_header()) == (((29_824_768, 0), 24),)


def test_extra_layer_tensors_and_inv_freq_are_not_loaded() -> None:
    inv = cached_inventory(QWEN)
    dropped = collapse(_mtp_only() + _inv_freq())
    assert len(dropped) == 6  # the MTP layer's 5 groups and the inv_freq group
    loaded = loaded_by(inv.stack, 24, inv)
    assert [loaded(g) for g in dropped] == [False] * len(dropped)
    assert _stored_layers(bf16_header() + _mtp_only() + _inv_freq()) == (((29_824_768, 0), 24),)
    config = qwen("bfloat16", {})
    del config["quantization_config"]
    plain = header_path(config, bf16_header())
    assert plain == (UNQUANTIZED + 24 * LAYER_LINEAR * 2 + ROTARY, 0)
    assert header_path(config, bf16_header() + _mtp_only() + _inv_freq()) == plain


def test_an_extra_layer_shaped_like_the_stack_is_dropped_alone() -> None:
    copy = [
        tensor(t.name.replace("model.layers.0.", "model.layers.24."), t.dtype, t.shape)
        for t in bf16_header()
        if t.name.startswith("model.layers.0.")
    ]
    assert _stored_layers(bf16_header() + copy + _mtp_only()) == (((29_824_768, 0), 24),)


# --- a run that loads the weights in another format than stored ---------------------------------


def _qlora(model: Any) -> Any:
    w = workload(
        kind="training",
        model={"source": "preset", "id": "qwen2.5-0.5b"},
        method={"kind": "qlora"},
        sequence_length=512,
    )
    return msgspec.structs.replace(w, model=model)


@pytest.mark.parametrize(
    ("config", "header"),
    [
        (GPTQ_CONFIG, gptq_header),
        (
            {k: v for k, v in qwen("bfloat16", {}).items() if k != "quantization_config"},
            bf16_header,
        ),
    ],
    ids=["gptq", "bf16"],
)
def test_qlora_budgets_its_nf4_base_not_the_stored_bytes(config: Any, header: Any) -> None:
    """QLoRA quantizes the base to NF4 at load whatever the checkpoint stores, so the stored
    bytes are not the loaded bytes; deploying is idempotent (the solver and the trace deploy
    again). Weights by hand: the 4-bit linears packed two per byte, and everything else cast to
    fp32 by PEFT's prepare_model_for_kbit_training (twice its bf16 bytes), and the rotary
    buffers the headers count (fp32 either way)."""
    model = resolve_config(
        config, name="h", origin="test", checkpoint=Checkpoint(tensors=tuple(header()))
    )
    once = deploy(_qlora(model))
    assert once.model.stored is None
    assert deploy(once) is once
    weights = {line.component: line.bytes for line in estimate((_qlora(model),)).devices[0].lines}
    assert weights[Component.WEIGHTS] == 2 * UNQUANTIZED + PACKED_4BIT + ROTARY == 723_738_368


@pytest.mark.parametrize(
    ("config", "header", "meta"),
    [(GPTQ_CONFIG, gptq_header, 7_971_840), (AWQ_CONFIG, awq_gemm_header, 6_988_800)],
)
def test_header_bytes_of_a_buffer_quantized_base_stay_whole_on_every_rank(
    config: dict[str, Any], header: Any, meta: int
) -> None:
    """LoRA over a GPTQ / AWQ checkpoint read from its headers, two FSDP ranks: the packed
    weights, the q/k/v biases (QuantLinear buffers), the rotary buffers and all the metadata
    stay whole on each GPU; only the fp16 embedding and norms are halved."""
    model = resolve_config(
        config, name="header", origin="test", checkpoint=Checkpoint(tensors=tuple(header()))
    )
    w = workload(
        kind="training",
        model={"source": "preset", "id": "qwen2.5-0.5b"},
        method={"kind": "lora", "rank": 8},
        parallelism={"data": 2, "zero_stage": 3},
    )
    budget = estimate((msgspec.structs.replace(w, model=model),))
    by = {line.component: line.bytes for line in budget.devices[0].lines}
    biases = 24 * (896 + 128 + 128) * 2
    plain = 151_936 * 896 * 2 + (2 * 24 + 1) * 896 * 2
    assert by[Component.WEIGHTS] == PACKED_4BIT + biases + ROTARY + plain // 2
    assert by[Component.QUANTIZATION_METADATA] == meta
