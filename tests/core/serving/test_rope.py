"""Rotary tables vLLM builds per model (vrambudget/core/serving/rope.py): rows per rope type, which
tables a model has, lenient reading of published configs."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.catalog import preset_arch


def _hf(model_type: str = "llama", **keys: object):
    from vrambudget.core.families import arch_from_hf_config
    from vrambudget.core.hf_config import HFConfig

    base = {
        "model_type": model_type,
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "intermediate_size": 2048,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
    }
    return arch_from_hf_config(msgspec.convert({**base, **keys}, HFConfig))


@pytest.mark.parametrize(
    ("rope", "rows"),
    [
        (None, 4096),
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 4096),
        ({"rope_type": "linear", "factor": 8.0}, 4096 * 8),
        ({"type": "linear", "factor": 2.5}, 10_240),  # the older key; 4096 x 2.5
        ({"rope_type": "dynamic", "factor": 2.0}, 8192),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 4096),
        ({"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 2048}, 6144),
        (
            {
                "rope_type": "longrope",
                "factor": 32.0,
                "original_max_position_embeddings": 1024,
                "short_factor": [1.0],
                "long_factor": [2.0],
            },
            1024 + 4096,
        ),
    ],
)
def test_rotary_table_rows_follow_the_rope_type(rope, rows):
    from vrambudget.core.serving.rope import rope_table_positions, rotary_cache_bytes

    arch = _hf(**({} if rope is None else {"rope_scaling": rope}))
    assert rope_table_positions(arch) == rows
    assert rotary_cache_bytes(arch, 2) == rows * 128 * 2  # head_dim 1024 / 8 = 128, bf16


def test_gemma3_rotary_tables_local_and_linear_global():
    # Two tables: local layers' default rope (131,072 rows) and the global layers' linear x 8
    # (1,048,576 rows), x head_dim 256 x 2 bytes. 27B has head_dim 128.
    from vrambudget.core.serving.rope import rotary_cache_bytes

    assert rotary_cache_bytes(preset_arch("gemma-3-4b"), 2) == (131_072 + 1_048_576) * 256 * 2
    assert rotary_cache_bytes(preset_arch("gemma-3-4b"), 2) == 603_979_776
    assert rotary_cache_bytes(preset_arch("gemma-3-27b"), 2) == (131_072 + 1_048_576) * 128 * 2


def test_rope_scaling_as_published_is_read_leniently():
    from vrambudget.core.serving.rope import rope_table_positions

    # A factor that is absent or not above 0 scales nothing (no 422: configs are pasted).
    assert rope_table_positions(_hf(rope_scaling={"rope_type": "linear", "factor": 0})) == 4096
    assert rope_table_positions(_hf(rope_scaling={"rope_type": "linear"})) == 4096
    # yarn without an original length: transformers takes max_position_embeddings.
    assert rope_table_positions(_hf(rope_scaling={"rope_type": "yarn", "factor": 2.0})) == 8192
    # Phi-3 128k: longrope ("su" in older files) with factor lists and the original length at
    # the top level: the short (4096) and long (max) tables.
    for kind in ("longrope", "su"):
        arch = _hf(
            "phi3",
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            rope_scaling={"type": kind, "short_factor": [1.0], "long_factor": [1.5]},
        )
        assert rope_table_positions(arch) == 4096 + 131072
    with pytest.raises(msgspec.ValidationError, match=r"rope_scaling\.factor"):
        _hf(rope_scaling={"rope_type": "linear", "factor": "eight"})  # not a number: 422
