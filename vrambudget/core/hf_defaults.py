"""The defaults of the ``transformers`` configuration classes for the keys that change memory:
what a :class:`~vrambudget.core.hf_config.HFConfig` key that is absent (``UNSET``) stands for."""

from __future__ import annotations

from typing import Any

__all__ = ["FAMILY_DEFAULTS", "GEMMA3_VISION_DEFAULTS"]

# Defaults of the transformers configuration classes (``configuration_<family>.py``) for the keys
# that change memory, applied when a config omits them -- as ``AutoConfig`` does.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=2048, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False,
    ),
    "granite": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=2048, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False,
    ),
    "mistral": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32,
        tie_word_embeddings=False, sliding_window=4096,
    ),
    "mixtral": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32,
        tie_word_embeddings=False, num_local_experts=8, num_experts_per_tok=2,
    ),
    "qwen2": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=32768,
        tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096,
        max_window_layers=28,
    ),
    "qwen2_moe": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768,
        tie_word_embeddings=False, use_sliding_window=False, sliding_window=4096,
        max_window_layers=28, decoder_sparse_step=1, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_experts_per_tok=4, num_experts=60,
        mlp_only_layers=(),
    ),
    "qwen3": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, head_dim=128,
        max_position_embeddings=32768, tie_word_embeddings=False, attention_bias=False,
        use_sliding_window=False, sliding_window=4096, max_window_layers=28,
    ),
    "qwen3_moe": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=32768, tie_word_embeddings=False, attention_bias=False,
        use_sliding_window=False, sliding_window=4096, max_window_layers=28,
        decoder_sparse_step=1, moe_intermediate_size=768, num_experts_per_tok=8,
        num_experts=128, mlp_only_layers=(),
    ),
    "gemma": dict(
        vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=16, head_dim=256,
        max_position_embeddings=8192, tie_word_embeddings=True, attention_bias=False,
    ),
    "gemma2": dict(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        max_position_embeddings=8192, tie_word_embeddings=True, attention_bias=False,
        sliding_window=4096,
    ),
    "gemma3_text": dict(
        vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        max_position_embeddings=131072, tie_word_embeddings=True, attention_bias=False,
        sliding_window=4096, sliding_window_pattern=6,
    ),
    "phi3": dict(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=4096, tie_word_embeddings=False,
    ),
    "deepseek_v2": dict(
        vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=30,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048,
        tie_word_embeddings=False, attention_bias=False, moe_intermediate_size=1407,
        n_shared_experts=None, n_routed_experts=None, num_experts_per_tok=None,
        first_k_dense_replace=0, moe_layer_freq=1, kv_lora_rank=512, q_lora_rank=1536,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    ),
    "deepseek_v3": dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
        num_attention_heads=128, num_key_value_heads=128, max_position_embeddings=4096,
        tie_word_embeddings=False, attention_bias=False, moe_intermediate_size=2048,
        n_shared_experts=1, n_routed_experts=256, num_experts_per_tok=8,
        first_k_dense_replace=3, moe_layer_freq=1, kv_lora_rank=512, q_lora_rank=1536,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_nextn_predict_layers=1,
    ),
    "gpt2": dict(
        vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
        tie_word_embeddings=True,
    ),
    "bert": dict(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2,
    ),
}
# Gemma 3's multimodal wrapper takes its language defaults from Gemma3TextConfig.
FAMILY_DEFAULTS["gemma3"] = FAMILY_DEFAULTS["gemma3_text"]

# SiglipVisionConfig as Gemma3Config instantiates it when vision_config is sparse.
GEMMA3_VISION_DEFAULTS: dict[str, Any] = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
    image_size=896, patch_size=14, num_channels=3, vision_use_head=False,
)
