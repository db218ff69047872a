"""What an MLP's activation keeps for backward when transformers' model code runs it.

transformers writes several GELUs as Python compositions of elementwise ops (``activations.py``:
``NewGELUActivation`` is ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``), and
autograd saves each op's operands: GPT-2's ``gelu_new`` keeps x, 0.5 x, the tanh and 1 + tanh
-- four tensors of the MLP's width where ``F.gelu`` keeps one. The analytic tier counts the
three extra tensors under stacks that run transformers' modules, and not under LitGPT or
torchtune, which call torch's GELU kernel.
"""

from __future__ import annotations

import pytest

from tests.support.workloads import budget_of, preset_body
from vrambudget.core.components import Component
from vrambudget.core.formulas.activations import ACTIVATION_PART, MODEL_CODE_ACTIVATIONS

GPT2_SMALL = {  # openai-community/gpt2's config.json, its activation named explicitly
    "model_type": "gpt2",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
    "activation_function": "gelu_new",
}


def _training(model: dict[str, object], software: dict[str, object] | None = None) -> dict:
    body = preset_body(
        "training",
        "gpt2",
        software=software,
        micro_batch_size=4,
        sequence_length=512,
        precision={"weights": "bf16"},
        mixed_precision="pure",
        method={"kind": "full"},
    )
    body["workloads"][0]["model"] = model
    return body


def _activation_parts(body: dict) -> dict[str, int]:
    d = budget_of(body).devices[0]
    (line,) = (x for x in d.lines if x.component is Component.ACTIVATIONS)
    return {p.name: p.bytes for p in line.parts}


def test_gelu_new_keeps_three_more_tensors_of_the_mlp_width() -> None:
    parts = _activation_parts(_training({"source": "hf_config", "config": GPT2_SMALL}))
    # by hand: 12 layers x (4 x 512 tokens) x (4 - 1) tensors x 3,072 (4 x 768) x 2 B (bf16)
    assert parts[ACTIVATION_PART] == 12 * 2048 * 3 * 3072 * 2 == 452_984_832


def test_a_gpt2_config_naming_no_activation_runs_gelu_new() -> None:
    # GPT2Config's default activation_function is gelu_new: a config that names none gets it
    config = {k: v for k, v in GPT2_SMALL.items() if k != "activation_function"}
    parts = _activation_parts(_training({"source": "hf_config", "config": config}))
    assert parts[ACTIVATION_PART] == 452_984_832


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "relu", "silu"])
def test_one_kernel_keeps_its_input_only(act: str) -> None:
    config = {**GPT2_SMALL, "activation_function": act}
    parts = _activation_parts(_training({"source": "hf_config", "config": config}))
    assert ACTIVATION_PART not in parts


@pytest.mark.parametrize("framework", ["litgpt", "torchtune"])
def test_frameworks_with_their_own_model_code_call_the_kernel(framework: str) -> None:
    body = _training({"source": "hf_config", "config": GPT2_SMALL}, {"framework": framework})
    assert ACTIVATION_PART not in _activation_parts(body)


def test_gelu_fast_keeps_seven() -> None:
    config = {**GPT2_SMALL, "activation_function": "gelu_fast"}
    parts = _activation_parts(_training({"source": "hf_config", "config": config}))
    assert parts[ACTIVATION_PART] == 12 * 2048 * 6 * 3072 * 2


def test_under_autocast_the_pow_compositions_keep_fp32_copies() -> None:
    """CUDA autocast runs ``torch.pow`` in fp32 (torch's AMP op reference): ``gelu_new`` then
    keeps an fp32 x, the fp32 tanh and 1 + tanh, and 0.5 x in bf16 -- 12 + 2 bytes per element
    where the formula's base counts x in bf16 (2): 12 more, not 3 x 2."""
    model = {"source": "hf_config", "config": GPT2_SMALL}
    body = _training(model)
    body["workloads"][0]["mixed_precision"] = "autocast"
    body["workloads"][0]["precision"] = {"weights": "fp32", "compute": "bf16"}
    parts = _activation_parts(body)
    assert parts[ACTIVATION_PART] == 12 * 2048 * 12 * 3072 == 905_969_664
    # gelu_fast has no pow: its seven tensors stay in bf16
    fast = {"source": "hf_config", "config": {**GPT2_SMALL, "activation_function": "gelu_fast"}}
    body["workloads"][0]["model"] = fast
    assert _activation_parts(body)[ACTIVATION_PART] == 12 * 2048 * 6 * 3072 * 2


def test_the_table_is_what_autograd_saves() -> None:
    """Every activation transformers names (``ACT2CLS``), recounted on its own module with
    torch's saved-tensor hooks: the storages of the activation's width that its backward
    keeps, the table's count or 1 (``linear`` keeps none)."""
    torch = pytest.importorskip("torch")
    activations = pytest.importorskip("transformers.activations")
    n = 1 << 12
    for name in activations.ACT2CLS:
        count = 0 if name == "linear" else MODEL_CODE_ACTIVATIONS.get(name, 1)
        x = torch.randn(n, requires_grad=True) * 1.0  # a non-leaf, as a projection's output
        kept: dict[int, int] = {}

        def pack(t: object, kept: dict[int, int] = kept) -> object:
            s = t.untyped_storage()  # type: ignore[attr-defined]
            kept[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            activations.ACT2FN[name](x)
        assert sum(1 for b in kept.values() if b >= n * 4) == count, name
