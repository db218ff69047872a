"""What an RMSNorm keeps for backward, by framework (research/stack_behaviours.md section 2c):
the formula's bytes to the byte against a hand count, the stack's choice per framework and
version, and the real transformers module's saved tensors on this torch."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.formulas.activations import (
    Trainable,
    device_dims,
    norm_saved_bytes,
    training_activations,
    training_saved,
)
from vrambudget.core.resolve import resolve_model
from vrambudget.core.spec import DimensionsModel, Software
from vrambudget.core.stack import resolve_stack

S, B, H = 512, 2, 4096
TOKENS = S * B


def _arch(norm: str = "rmsnorm"):
    return resolve_model(
        DimensionsModel(
            hidden_size=H,
            num_layers=2,
            num_attention_heads=32,
            intermediate_size=11008,
            vocab_size=32000,
            mlp="gated",
            norm=norm,  # type: ignore[arg-type]
        )
    )


def _items(
    norm, *, arch=None, e=2, trainable=None, layer=None, fp32_normed=False
) -> dict[str, int]:
    arch = arch or _arch()
    kw = {} if trainable is None else {"trainable": trainable}
    return training_saved(
        layer or arch.layer_runs[0][0],
        arch,
        device_dims(arch, 1, 1),
        seq=S,
        batch=B,
        e=e,
        attention="sdpa",
        dropout=False,
        sequence_parallel=False,
        drop_scores=False,
        norm=norm,
        fp32_normed=fp32_normed,
        **kw,
    )


LORA_FROZEN_NORMS = Trainable(norm_weights=False)


@pytest.mark.parametrize(
    ("norm", "e", "trainable", "inputs", "normalized"),
    [
        # Two norms per layer. transformers' LlamaRMSNorm: the fp32 input (4 bytes) and, for a
        # trained weight, the normalized tensor in the compute dtype.
        ("upcast", 2, None, 2 * TOKENS * H * 4, 2 * TOKENS * H * 2),
        ("upcast", 2, LORA_FROZEN_NORMS, 2 * TOKENS * H * 4, 0),
        # LitGPT >= 0.4.6: the normalized tensor in fp32.
        ("upcast_fp32_normed", 2, None, 2 * TOKENS * H * 4, 2 * TOKENS * H * 4),
        # fp32 training: the upcast is a no-op, the input itself is kept.
        ("upcast", 4, None, 2 * TOKENS * H * 4, 2 * TOKENS * H * 4),
        # A fused kernel: the input in its own dtype (and a per-token rstd, not itemized).
        ("fused", 2, None, 2 * TOKENS * H * 2, 0),
        ("fused", 2, LORA_FROZEN_NORMS, 2 * TOKENS * H * 2, 0),
    ],
)
def test_norm_items_to_the_byte(norm, e, trainable, inputs, normalized) -> None:
    items = _items(norm, e=e, trainable=trainable)
    assert items["norm inputs"] == inputs
    assert items["normalized tensors of the trained norm weights"] == normalized


def test_layernorm_keeps_its_input_in_its_own_dtype_whatever_the_stack() -> None:
    arch = _arch("layernorm")
    for norm in ("upcast", "upcast_fp32_normed", "fused"):
        items = _items(norm, arch=arch)
        assert items["norm inputs"] == 2 * TOKENS * H * 2
        assert items["normalized tensors of the trained norm weights"] == 0


def test_norm_saved_bytes_table() -> None:
    assert norm_saved_bytes("upcast", True, True, 2) == (4, 2)
    assert norm_saved_bytes("upcast", True, False, 2) == (4, 0)
    assert norm_saved_bytes("upcast_fp32_normed", True, True, 2) == (4, 4)
    assert norm_saved_bytes("fused", True, True, 2) == (2, 0)
    assert norm_saved_bytes("upcast", False, True, 2) == (2, 0)


def test_the_final_norm_follows_the_stack() -> None:
    """The last stage keeps the final norm's input (fp32 when upcast), its normalized tensor for
    a trained weight, and the LM head's input: s x b x h x (4 + 2 + 2) in a bf16 full
    fine-tune against s x b x h x (2 + 2) with a fused norm."""
    from tests.support.workloads import workload
    from vrambudget.core.deployed import deploy
    from vrambudget.core.statics import statics_for

    w = workload(
        kind="training",
        model={
            "source": "dimensions",
            "hidden_size": H,
            "num_layers": 2,
            "num_attention_heads": 32,
            "intermediate_size": 11008,
            "vocab_size": 32000,
            "mlp": "gated",
            "norm": "rmsnorm",
        },
        precision={"weights": "bf16"},
        mixed_precision="pure",
        sequence_length=S,
        micro_batch_size=B,
    )
    w = deploy(w)
    arch = resolve_model(w.model)
    (st,) = statics_for(w, arch)
    for norm, per_element in (("upcast", 4 + 2 + 2), ("fused", 2 + 2)):
        _, _, parts = training_activations(w, arch, st.stage, st.dims, norm)
        assert dict(parts)["final norm and LM-head inputs"] == TOKENS * H * per_element


@pytest.mark.parametrize(
    ("software", "expected"),
    [
        ({}, "upcast"),
        ({"framework": "transformers", "framework_version": "4.46.3"}, "upcast"),
        ({"framework": "litgpt", "framework_version": "0.4.5"}, "upcast"),
        ({"framework": "litgpt", "framework_version": "0.4.6"}, "upcast_fp32_normed"),
        ({"framework": "litgpt"}, "upcast_fp32_normed"),
        ({"framework": "torchtune", "framework_version": "0.4.0"}, "upcast"),
        ({"framework": "torchtune", "framework_version": "0.5.0"}, "upcast_fp32_normed"),
        ({"framework": "unsloth"}, "fused"),
        ({"libraries": {"liger_kernel": "0.5.10"}}, "fused"),
        ({"framework": "torchtune", "torch_compile": True}, "fused"),
        ({"norm": "fused"}, "fused"),
        ({"framework": "unsloth", "norm": "fp32_upcast"}, "upcast"),
    ],
)
def test_the_stack_names_its_norm(software, expected) -> None:
    stack = resolve_stack(msgspec.convert(software, Software))
    assert stack.rms_norm == expected
    (behaviour,) = [
        b for b in stack.use(frozenset({"training"})).behaviours if b.name == "rms_norm"
    ]
    assert behaviour.source
    assert not [b for b in stack.use(frozenset({"inference"})).behaviours if b.name == "rms_norm"]


def _saved_bytes(module, x, shape_prefix) -> int:
    """Bytes of the distinct storages autograd keeps for ``module(x)`` whose shape starts with
    ``shape_prefix`` and is as wide as ``x`` (the per-element tensors, not rstd or weights)."""
    import torch

    seen: dict[int, int] = {}

    def pack(t):
        if tuple(t.shape[:2]) == shape_prefix and t.shape[-1] == x.shape[-1]:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x * 1)
    return sum(seen.values())


@pytest.mark.parametrize("trained", [False, True])
def test_transformers_rmsnorm_keeps_what_the_formula_counts(trained) -> None:
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    b, t, h = 2, 64, 256
    norm = llama.LlamaRMSNorm(h).to(torch.bfloat16)
    norm.weight.requires_grad_(trained)
    x = torch.randn(b, t, h, dtype=torch.bfloat16, requires_grad=True)
    kept, normed = norm_saved_bytes("upcast", True, trained, 2)
    assert _saved_bytes(norm, x, (b, t)) == b * t * h * (kept + normed)


def test_norms_per_layer_reads_the_layer() -> None:
    """Two norms (Llama), four (Gemma 2's sandwich norms), one shared by attention and the MLP
    (a parallel residual: Falcon-7B's and Phi-2's input_layernorm with its bias)."""
    from dataclasses import replace

    from vrambudget.core.arch import Role, Split, TensorGroup
    from vrambudget.core.formulas.activations import norms_per_layer
    from vrambudget.core.spec import PresetModel

    llama = _arch()
    assert norms_per_layer(llama.layer_runs[0][0], llama) == 2
    gemma2 = resolve_model(PresetModel(id="gemma-2-2b"))
    assert norms_per_layer(gemma2.layer_runs[0][0], gemma2) == 4
    layer = llama.layer_runs[0][0]
    shared = replace(
        layer,
        tensors=tuple(g for g in layer.tensors if g.role is not Role.NORM)
        + (
            TensorGroup("input_layernorm", H, 1, Role.NORM, Split.REPLICATED),
            TensorGroup("input_layernorm.bias", H, 1, Role.NORM, Split.REPLICATED),
        ),
    )
    assert norms_per_layer(shared, llama) == 1
    # Full training: one norm input, and the MLP reads the attention's input (one tensor).
    items = _items("fused", arch=llama, layer=shared)
    assert items["norm inputs"] == TOKENS * H * 2
    assert items["qkv input"] == TOKENS * H * 2
    assert items["mlp input"] == 0


def test_attention_norms_are_not_layer_norms_and_a_mamba_layer_shares_nothing() -> None:
    """OLMo 2 and Cohere's use_qk_norm normalize q and k over the full width: those q/k norms
    are not counted as the layer's norms. A layer with one norm and no attention projection
    (Mamba) is not a parallel residual."""
    from dataclasses import replace

    from vrambudget.core.arch import Role, Split, TensorGroup
    from vrambudget.core.formulas.activations import norms_per_layer, shares_one_norm

    llama = _arch()
    layer = llama.layer_runs[0][0]
    olmo2 = replace(
        layer,
        tensors=layer.tensors
        + (
            TensorGroup("self_attn.q_norm", H, 1, Role.NORM, Split.REPLICATED),
            TensorGroup("self_attn.k_norm", H, 1, Role.NORM, Split.REPLICATED),
        ),
    )
    assert norms_per_layer(olmo2, llama) == 2
    mamba = replace(
        layer,
        tensors=(
            TensorGroup("norm", H, 1, Role.NORM, Split.REPLICATED),
            TensorGroup("mixer.in_proj", 2 * H, H, Role.LINEAR, Split.COLUMN),
            TensorGroup("mixer.out_proj", H, H, Role.LINEAR, Split.ROW),
        ),
    )
    assert norms_per_layer(mamba, llama) == 1
    assert not shares_one_norm(mamba, llama)


def test_gemma_and_autocast_keep_an_fp32_normalized_tensor() -> None:
    """transformers' Gemma RMSNorm multiplies by (1 + weight.float()); under autocast the
    residual stream is fp32, so hidden_states.to(input_dtype) stays fp32: a trained weight keeps
    4 bytes per element of the normalized tensor in both."""
    from vrambudget.core.formulas.activations.training import fp32_normed_of
    from vrambudget.core.spec import PresetModel

    gemma = resolve_model(PresetModel(id="gemma-2-2b"))
    assert fp32_normed_of(gemma, "pure") and fp32_normed_of(_arch(), "autocast")
    assert not fp32_normed_of(_arch(), "pure")
    assert norm_saved_bytes("upcast", True, True, 2, fp32_normed=True) == (4, 4)
    assert norm_saved_bytes("upcast", True, False, 2, fp32_normed=True) == (4, 0)
    assert norm_saved_bytes("fused", True, True, 2, fp32_normed=True) == (2, 0)
    items = _items("upcast", arch=gemma, fp32_normed=fp32_normed_of(gemma, "pure"))
    # four sandwich norms, 2,304 wide
    assert items["normalized tensors of the trained norm weights"] == 4 * TOKENS * 2_304 * 4
