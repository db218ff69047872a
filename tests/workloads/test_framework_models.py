"""Families without a closed form, built by transformers (issue 14 item 1): the inventory and
its cache profile, and the analytic answer from them -- recurrent state sized as the model keeps
it, a hybrid's attention layers with their KV cache, sliding windows of the model's own cache.

Configs: state-spaces/mamba-130m-hf (hidden 768, 24 layers, state 16, conv 4, expand 2, vocab
50,280: its config.json); openai/gpt-oss-20b's dimensions from research/data/
published_checkpoints.json; Qwen3-Next-80B-A3B from transformers 5.23.0's Qwen3NextConfig
defaults (the published model's dimensions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest
from vrambudget.trace.models import resolve_models
from vrambudget.workloads.hf.inventory import inventory

MAMBA_130M = {
    "model_type": "mamba",
    "architectures": ["MambaForCausalLM"],
    "hidden_size": 768,
    "num_hidden_layers": 24,
    "state_size": 16,
    "conv_kernel": 4,
    "expand": 2,
    "vocab_size": 50280,
    "torch_dtype": "bfloat16",
}
CORPUS = Path(__file__).resolve().parents[2] / "research" / "data" / "published_checkpoints.json"


def _gpt_oss() -> dict[str, Any]:
    entries = json.loads(CORPUS.read_text())["checkpoints"]
    config: dict[str, Any] = next(c["config"] for c in entries if c["repo_id"].endswith("oss-20b"))
    return config


def _kv(config: dict[str, Any], batch: int, prompt: int, generated: int) -> int:
    body = {
        "workloads": [
            {
                "kind": "inference",
                "model": {"source": "hf_config", "config": config},
                "batch_size": batch,
                "prompt_tokens": prompt,
                "generated_tokens": generated,
            }
        ]
    }
    req = msgspec.convert(body, BudgetRequest)
    budget = estimate(resolve_models(req.workloads))
    lines = budget.devices[0].lines
    return next(line.bytes for line in lines if line.component is Component.KV_CACHE)


def test_mamba_keeps_a_fixed_state_per_sequence() -> None:
    """transformers' Mamba cache (LinearAttentionLayer): conv_states (d_inner = 2 x 768 = 1,536
    channels x conv_kernel 4) in the model dtype and recurrent_states (1,536 x state 16) in fp32,
    per layer and sequence, whatever the context: 8 x (24 x 6,144 x 2 + 24 x 24,576 x 4)."""
    inv = inventory(MAMBA_130M)
    assert inv.cache is not None
    layer = inv.cache.layers[0]
    assert (layer.kind, layer.kv_elems_per_token) == ("recurrent", 0)
    assert sorted((s.numel, s.dtype) for s in layer.state) == [
        (1_536 * 4, "bfloat16"),
        (1_536 * 16, "float32"),
    ]
    expected = 8 * (24 * 6_144 * 2 + 24 * 24_576 * 4)
    assert _kv(MAMBA_130M, 8, 512, 64) == expected == 21_233_664
    assert _kv(MAMBA_130M, 8, 8192, 1024) == expected  # no growth with the context


def test_gpt_oss_alternates_sliding_and_full_attention() -> None:
    """gpt-oss-20b: 24 layers alternating a 128-token sliding window and full attention, 8 KV
    heads of 64 -> 2 x 8 x 64 = 1,024 elements per token per layer, bf16."""
    config = _gpt_oss()
    inv = inventory(config)
    assert inv.cache is not None
    kinds = [(layer.kind, layer.window) for layer in inv.cache.layers]
    assert kinds[:2] == [("sliding", 128), ("full", None)] and len(kinds) == 24
    per_token = 1_024 * 2
    context = 4096 + 256
    expected = 2 * per_token * (12 * context + 12 * min(context, 128))
    assert _kv(config, 2, 4096, 256) == expected


def test_a_hybrid_keeps_state_and_kv_cache() -> None:
    """Qwen3-Next: three Gated DeltaNet layers (conv and recurrent state) per full-attention
    layer (KV cache: 2 kv heads x 256 = 1,024 elements per token and layer)."""
    config = {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"]}
    inv = inventory(config)
    assert inv.cache is not None
    kinds = [layer.kind for layer in inv.cache.layers]
    assert kinds[:4] == ["recurrent", "recurrent", "recurrent", "full"]
    full = [layer for layer in inv.cache.layers if layer.kind == "full"]
    assert all(layer.kv_elems_per_token == 2 * 2 * 256 for layer in full)
    short, long_ = _kv(config, 1, 1024, 0), _kv(config, 1, 2048, 0)
    # Doubling the context doubles only the attention layers' KV (12 layers x 1,024 x 2 B).
    assert long_ - short == 12 * 1_024 * 2 * 1024


def test_what_the_framework_may_build_is_bounded() -> None:
    """A config the framework builds: layer counts 0 .. 1024 (nested configs too), layers x
    routed experts at most 65,536 (DeepSeek-V3: 61 x 256) -- a 422 naming the key, before
    anything is built."""
    import pytest

    from vrambudget.core.errors import InvalidWorkload

    too_deep = {"model_type": "phi", "num_hidden_layers": 5000}
    with pytest.raises(InvalidWorkload) as exc:
        _kv(too_deep, 1, 16, 0)
    assert exc.value.field == "workloads[0].model.config.num_hidden_layers"
    nested = {"model_type": "clip", "vision_config": {"num_hidden_layers": 2048}}
    with pytest.raises(InvalidWorkload) as exc:
        _kv(nested, 1, 16, 0)
    assert exc.value.field == "workloads[0].model.config.vision_config.num_hidden_layers"
    wide = {"model_type": "qwen3_next", "num_hidden_layers": 1000, "num_experts": 512}
    with pytest.raises(InvalidWorkload, match="layers x experts"):
        _kv(wide, 1, 16, 0)


def test_falcon_multi_query_keeps_one_kv_head() -> None:
    """tiiuae/falcon-7b-instruct's config.json (research/data/configs): ``multi_query: true``
    without ``new_decoder_architecture``, 71 heads of 64 -- transformers' FalconAttention keeps
    one K/V head (its query_key_value has (71 + 2) x 64 = 4,672 rows). The KV cache of one
    sequence of 1,000 + 24 tokens in bf16: 32 layers x 2 x 1 x 64 x 2 B x 1,024 = 8,388,608 B
    (71 K/V heads would be 71 times that)."""
    path = Path(__file__).resolve().parents[2] / "research" / "data" / "configs"
    config = json.loads((path / "tiiuae--falcon-7b-instruct.json").read_text())["config"]
    assert config["multi_query"] is True and not config.get("new_decoder_architecture")
    assert _kv(config, 1, 1000, 24) == 32 * 2 * 64 * 2 * 1024 == 8_388_608
