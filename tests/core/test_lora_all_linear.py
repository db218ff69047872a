"""PEFT's ``target_modules="all-linear"`` (peft 0.21.2 tuners/tuners_utils.py
``_maybe_include_all_linear_layers``: every nn.Linear / Conv1D but the output embedding): the
request's ``["all-linear"]`` adapts every projection of the layers, the LM head excepted."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from tests.support.workloads import LLAMA_PROJECTIONS, budget_of, preset_body
from vrambudget.core.components import Component
from vrambudget.service.app import Settings, create_app


def _body(model: str, targets: list[str], kind: str = "lora", **software: Any) -> dict[str, Any]:
    return preset_body(
        "training",
        model,
        "a100-sxm4-80gb",
        software,
        micro_batch_size=2,
        sequence_length=2048,
        checkpointing="full",
        method={"kind": kind, "rank": 16, "target_modules": targets},
    )


def _lines(body: dict[str, Any]) -> dict[Component, int]:
    return {line.component: line.bytes for line in budget_of(body).devices[0].lines}


def test_llama_adapters_to_the_byte() -> None:
    """Llama 3.1 8B (hidden 4,096, 8 KV heads of 128, MLP 14,336, 32 layers), rank 16, fp32
    adapters: A (r x in) + B (out x r) per projection. Per layer r x (q 4,096 + 4,096, k and v
    4,096 + 1,024 each, o 4,096 + 4,096, gate and up 4,096 + 14,336 each, down 14,336 + 4,096)
    = 16 x 81,920; x 32 layers x 4 B = 167,772,160 B."""
    per_layer = (
        (4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 14336)
    )  # in + out of each
    assert per_layer == 81_920
    lines = _lines(_body("llama-3.1-8b", ["all-linear"]))
    assert lines[Component.ADAPTERS] == 16 * per_layer * 32 * 4 == 167_772_160


@pytest.mark.parametrize(
    ("kind", "framework"),
    [("lora", None), ("qlora", None), ("lora", "unsloth"), ("qlora", "unsloth")],
)
def test_all_linear_is_every_projection_listed(kind: str, framework: str | None) -> None:
    """The whole budget (activations, the QLoRA base, Unsloth's patched functions) is the one
    of the seven names listed by hand."""
    sw = {"framework": framework} if framework else {}
    assert _lines(_body("llama-3.1-8b", ["all-linear"], kind, **sw)) == _lines(
        _body("llama-3.1-8b", list(LLAMA_PROJECTIONS), kind, **sw)
    )


def test_gpt2_conv1d_projections_are_linear_layers() -> None:
    """GPT-2's projections are Conv1D, which PEFT's all-linear includes: c_attn, c_proj (both),
    c_fc; the tied LM head is not adapted."""
    assert _lines(_body("gpt2", ["all-linear"])) == _lines(
        _body("gpt2", ["c_attn", "c_proj", "c_fc"])
    )


def test_transformers_5_fused_experts_get_no_adapter() -> None:
    """transformers >= 5 keeps Mixtral's experts as fused 3-D parameters (5.0
    modeling_mixtral.py MixtralExperts), which target_modules do not reach: all-linear adapts
    the attention only, 16 x (q 4,096 + 4,096, k and v 4,096 + 1,024, o 4,096 + 4,096) x 32
    layers x 4 B = 54,525,952 B, and the answer says the experts were named but not reached."""
    b = budget_of(_body("mixtral-8x7b", ["all-linear"]))
    lines = {line.component: line.bytes for line in b.devices[0].lines}
    assert lines[Component.ADAPTERS] == 16 * 26_624 * 32 * 4 == 54_525_952
    (note,) = [w for w in b.warnings if "routed experts" in w]
    assert "transformers 5.23.0 keeps them as fused 3-D parameters" in note
    assert "(w1, w2, w3)" in note  # Mixtral's expert modules
    # the same names listed by hand: the same budget
    mixtral = ["q_proj", "k_proj", "v_proj", "o_proj", "w1", "w2", "w3"]
    assert lines == _lines(_body("mixtral-8x7b", mixtral))


def test_transformers_4_adapts_every_expert_and_says_the_router_is_not_counted() -> None:
    """Under transformers 4.46 each expert is nn.Linear modules: attention r x 26,624 and 8
    experts x 3 x r x 18,432 per layer, 32 layers, fp32: 16 x 468,992 x 32 x 4 = 960,495,616 B;
    the router (an nn.Linear there) also gets an adapter under all-linear, not counted."""
    body = _body(
        "mixtral-8x7b", ["all-linear"], framework="transformers", framework_version="4.46.0"
    )
    b = budget_of(body)
    lines = {line.component: line.bytes for line in b.devices[0].lines}
    assert lines[Component.ADAPTERS] == 16 * (26_624 + 8 * 3 * 18_432) * 32 * 4 == 960_495_616
    assert not [w for w in b.warnings if "routed experts" in w]
    (note,) = [w for w in b.warnings if "all-linear" in w]
    assert "router" in note and "not counted" in note


def test_dense_models_get_no_all_linear_note() -> None:
    assert not [
        w for w in budget_of(_body("llama-3.1-8b", ["all-linear"])).warnings if "all-linear" in w
    ]


def test_all_linear_beside_other_names_is_a_422_naming_the_field() -> None:
    with TestClient(create_app(Settings())) as client:
        r = client.post("/v1/budgets", json=_body("llama-3.1-8b", ["all-linear", "q_proj"]))
        ok = client.post("/v1/budgets", json=_body("llama-3.1-8b", ["all-linear"]))
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert "method.target_modules: 'all-linear' stands alone" in error["message"]
    assert error["field"] == "$.workloads[0]"
    assert ok.status_code == 200, ok.status_code
