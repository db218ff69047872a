"""Model states per device (vrambudget/core/statics.py) against the ZeRO paper's hand counts."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.workloads import workload
from vrambudget.core.deployed import deploy
from vrambudget.core.resolve import resolve_model
from vrambudget.core.statics import statics_for


def train(model_id, **kw):
    return workload(kind="training", model={"source": "preset", "id": model_id}, **kw)


PSI = 6_738_415_616  # Llama-2-7B


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        # Rajbhandari et al. 2020, Fig. 1: mixed-precision Adam keeps 2 (fp16 params) + 2
        # (grads) + 12 (fp32 params, momentum, variance) bytes per parameter.
        (0, 16 * PSI),
        (1, 4 * PSI + 12 * PSI // 8),
        (2, 2 * PSI + 14 * PSI // 8),
        (3, 16 * PSI // 8),
    ],
)
def test_zero_model_states(stage, expected):
    w = train(
        "llama-2-7b", gradient_accumulation_steps=2, parallelism={"data": 8, "zero_stage": stage}
    )
    # The persistent model states (the optimizer step adds fp32 gradients and temporaries on
    # top, see tests/trace/test_oracle.py).
    (st,) = statics_for(deploy(w), resolve_model(w.model))
    total = st.weights_bytes + st.gradient_bytes + st.master_bytes + st.optimizer_bytes
    assert total == expected


def test_buffers_are_not_parameters() -> None:
    """A framework-built model's buffers (GPT-NeoX's rotary inv_freq tables) take memory but
    are not parameters: the autocast weight cache and ZeRO-3's gathered layer count parameters.
    GPT-NeoX, hidden 128, 2 layers, MLP 512, vocab 1000, untied, by hand: embed_in and
    embed_out 128,000 each; per layer two LayerNorms 256 each, query_key_value 128 x 384 + 384
    = 49,536, dense 16,512, dense_h_to_4h 66,048, dense_4h_to_h 65,664 (198,272); final norm
    256: 652,800."""
    from vrambudget.workloads.hf.resolve import resolve_config

    config = {
        "model_type": "gpt_neox",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "max_position_embeddings": 256,
        "torch_dtype": "float16",
    }
    model = resolve_config(config, name="neox", origin="test")
    arch = resolve_model(model)
    assert any(g.buffer for g in arch.extras)  # the rotary tables are in the inventory
    w = train("llama-2-7b", mixed_precision="autocast")
    w = deploy(msgspec.structs.replace(w, model=model))
    (st,) = statics_for(w, arch)
    assert st.num_params == arch.num_params == 652_800
