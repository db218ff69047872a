"""llm_serving KV cache (vrambudget/core/serving/kv.py): golden arithmetic against hand
computation."""

from __future__ import annotations

import pytest

from vrambudget.core.catalog import preset_arch
from vrambudget.core.resolve import resolve_model
from vrambudget.core.serving import kv
from vrambudget.core.spec import DimensionsModel

# ----------------------------------------------------------------- golden KV arithmetic --


def test_gqa_llama3_8b_is_131072_bytes_per_token():
    # 32 layers x 2 (K, V) x 8 KV heads x 128 head_dim x 2 bytes.
    specs = kv.layer_specs(preset_arch("llama-3.1-8b"), 1, 2)
    assert kv.per_token_bytes(specs) == 32 * 2 * 8 * 128 * 2 == 131_072
    assert kv.page_size_bytes(specs[0], 16) == 2 * 16 * 8 * 128 * 2 == 65_536
    # TP 2 halves the KV heads; TP 16 > 8 KV heads keeps one (replicated) head per rank.
    assert kv.per_token_bytes(kv.layer_specs(preset_arch("llama-3.1-8b"), 2, 2)) == 65_536
    assert kv.per_token_bytes(kv.layer_specs(preset_arch("llama-3.1-8b"), 16, 2)) == 16_384


def test_mqa_one_kv_head():
    arch = resolve_model(
        DimensionsModel(
            hidden_size=4096,
            num_layers=10,
            num_attention_heads=32,
            num_key_value_heads=1,
            intermediate_size=11008,
            vocab_size=32000,
        )
    )
    # 10 layers x 2 x 1 head x 128 x 2 bytes; any TP keeps the one head on every rank.
    assert kv.per_token_bytes(kv.layer_specs(arch, 1, 2)) == 10 * 2 * 1 * 128 * 2 == 5_120
    assert kv.per_token_bytes(kv.layer_specs(arch, 4, 2)) == 5_120


@pytest.mark.parametrize(("model", "layers"), [("deepseek-v2-lite", 27), ("deepseek-v3", 61)])
def test_mla_caches_the_latent_not_split_by_tp(model, layers):
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes per layer, one "head", any TP.
    arch = preset_arch(model)
    for t in (1, 4):
        assert kv.per_token_bytes(kv.layer_specs(arch, t, 2)) == (512 + 64) * 2 * layers
    assert kv.page_size_bytes(kv.layer_specs(arch, 1, 2)[0], 16) == 16 * 576 * 2 == 18_432


def test_sliding_window_gemma2_groups_and_blocks():
    # Gemma 2 9B: 21 sliding (4096) + 21 full layers, 8 KV heads x 256: page 16 x 2 x 8 x 256 x
    # 2 = 131,072 B. Equal counts: group_size 21, two groups.
    g = kv.kv_groups(preset_arch("gemma-2-9b"), 1, 1, 2, 16, True)
    assert g.num_groups == 2 and g.stage_group_size(0) == 21 and g.page_bytes == 131_072
    # A request of 8,192 tokens: full 8192/16 = 512 blocks; sliding min(4095 + 8192, 8192)/16
    # + 1 = 513 blocks.
    assert kv.blocks_per_request(g, 8192, 8192) == 512 + 513
    # The hybrid manager off caches the sliding layers as full attention: one group.
    assert kv.kv_groups(preset_arch("gemma-2-9b"), 1, 1, 2, 16, False).num_groups == 1


def test_sliding_window_gemma3_five_to_one():
    # Gemma 3 27B: 52 sliding (1024) + 10 full; group_size 10 -> 6 sliding groups + 1 full.
    g = kv.kv_groups(preset_arch("gemma-3-27b"), 1, 1, 2, 16, True)
    assert g.num_groups == 7 and g.stage_group_size(0) == 10
    # vLLM 0.19.0 logged 15,997 blocks -> 15,997 // 7 x 16 = 36,560 tokens; 15,997 / (512 +
    # 6 x 513) = 4.46x.
    assert kv.num_tokens(15_997, g) == 36_560
    assert round(kv.max_concurrency(15_997, g, 8192, 8192), 2) == 4.46


def test_mistral_all_sliding_is_one_sliding_group():
    g = kv.kv_groups(preset_arch("mistral-7b-v0.1"), 1, 1, 2, 16, True)
    assert g.num_groups == 1
    # min(4095 + 2048, 32768) = 6143 tokens -> cdiv(6143, 16) + 1 = 385 blocks per request.
    assert kv.blocks_per_request(g, 32768, 2048) == 385


def test_block_alignment():
    # get_num_blocks floors to whole blocks of all layers: one byte short of 10 blocks is 9.
    page, layers = 65_536, 32
    assert kv.num_blocks(10 * page * layers - 1, page, layers) == 9
    assert kv.num_blocks(10 * page * layers, page, layers) == 10
    g = kv.kv_groups(preset_arch("llama-3.1-8b"), 1, 1, 2, 16, True)
    assert kv.num_tokens(10, g) == 160  # tokens are whole blocks
    # A request of 8,193 tokens needs 513 blocks, not 512.0625.
    assert kv.blocks_per_request(g, 8193, 8192) == 513
