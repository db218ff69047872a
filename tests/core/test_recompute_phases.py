"""Training with full recomputation: when the recomputed layer is live, the loss's tensors of
soft-capped logits, Liger's fused SwiGLU and QLoRA's fp32 residual stream -- each number by
hand, and the two published readings they were checked against."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.components import Component
from vrambudget.core.deployed import deploy
from vrambudget.core.estimate import estimate
from vrambudget.core.formulas.activations import (
    RECOMPUTE_GRADS_PART,
    eager_softmax_backward_bytes,
    eager_softmax_fp32,
    recompute_backward_bytes,
    training_activations,
    training_saved,
)
from vrambudget.core.formulas.logits import SOFTCAP_PART
from vrambudget.core.resolve import resolve_model
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest, Software, TrainingWorkload
from vrambudget.core.stack import resolve_stack
from vrambudget.core.statics import statics_for

# Mistral-7B: h 4,096, f 14,336, 32 layers, vocab 32,000.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
H, F, L, V = 4_096, 14_336, 32, 32_000


def _fms_lora(batch: int, **extra: Any) -> dict[str, Any]:
    """fms-acceleration's A100 benchmark, 1 GPU (refs/a100_80gb.csv, commit 24bdadb): Mistral-7B,
    LoRA r 16 on q, k, v, o over a bf16 base without autocast, 4,096 packed tokens per sample,
    flash attention, gradient checkpointing, transformers 4.48.1 (research/data/corpus,
    training_reports.json)."""
    return {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": "mistral-7b-v0.1"},
                "precision": {"weights": "bf16"},
                "micro_batch_size": batch,
                "sequence_length": 4096,
                "mixed_precision": "pure",
                "checkpointing": "full",
                "attention": "flash",
                "method": {
                    "kind": "lora",
                    "rank": 16,
                    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                    "adapter_dtype": "fp32",
                    "dropout": 0.1,
                },
                **extra,
            }
        ],
        "device": {"source": "catalog", "id": "a100-sxm4-80gb"},
        "headroom": {"fraction": 0.0},
        "software": {"framework_version": "4.48.1"},
    }


def _budget(body: dict[str, Any]) -> Budget:
    req = msgspec.convert(body, BudgetRequest)
    return estimate(req.workloads, req.device, req.headroom, software=req.software)


def _phases(b: Budget) -> dict[str, int]:
    return {p.name: p.total_bytes for p in b.devices[0].phases}


def _parts(b: Budget, c: Component) -> dict[str, int]:
    line = next(x for x in b.devices[0].lines if x.component == c)
    return {p.name: p.bytes for p in line.parts or ()}


def test_the_recomputed_layer_is_not_live_at_the_loss() -> None:
    """The forward ends at the loss with every layer input kept, the final norm's inputs and
    the loss's tensors; the recomputed layer exists only once the LM head's backward has
    consumed them."""
    b = _budget(_fms_lora(8))
    d = b.devices[0]
    assert d.peak_phase == "forward"
    tokens = 8 * 4096
    acts = _parts(b, Component.ACTIVATIONS)
    assert acts == {
        "layer inputs (full recomputation)": L * tokens * H * 2,  # 8,589,934,592
        "final norm and LM-head inputs": tokens * H * (4 + 2),  # fp32 norm input, bf16 normed
    }
    # bf16 logits, the fp32 upcast, the shifted fp32 copy (transformers < 4.49), log-softmax
    assert sum(_parts(b, Component.LOGITS).values()) == tokens * V * (2 + 4 + 4 + 4)
    # The recompute: layer inputs + the layer's saved set + its backward's intermediates'
    # gradients, no loss tensors and no final-norm inputs.
    w = deploy(msgspec.convert(_fms_lora(8)["workloads"][0], TrainingWorkload))
    arch = resolve_model(w.model)
    (st,) = statics_for(w, arch)
    _, one_layer, _ = training_activations(w, arch, st.stage, st.dims, resolve_stack(None).rms_norm)
    grads = tokens * 2 * (2 * F + 4 * H) + tokens * 8 * H  # fp32 adapters: + 8 h per token
    assert recompute_backward_bytes(st.dims, tokens, 2, w.method) == grads == 4_026_531_840
    ph = _phases(b)
    at_loss = sum(acts.values()) + tokens * V * 14
    assert ph["backward_recompute"] - ph["forward"] == (
        L * tokens * H * 2 + one_layer + grads - at_loss
    )


def test_the_fms_acceleration_readings_are_met() -> None:
    """torch.cuda.max_memory_allocated as the benchmark reports it (mem_peak_torch_mem_alloc_in
    _bytes): 26,704,571,904 B (batch 4) and 38,742,912,512 B (batch 8). The estimate's
    allocated view (its total less the CUDA context, allocator overhead and headroom) is
    within 0.2% of both; it was 12-19% above them while the recomputed layer was counted at
    the loss."""
    for batch, measured in ((4, 26_704_571_904), (8, 38_742_912_512)):
        lines = {x.component: x.bytes for x in _budget(_fms_lora(batch)).devices[0].lines}
        allocated = sum(
            v
            for c, v in lines.items()
            if c not in (Component.CUDA_CONTEXT, Component.ALLOCATOR_OVERHEAD, Component.HEADROOM)
        )
        assert allocated == pytest.approx(measured, rel=0.002)


def test_a_recompute_peak_itemizes_the_backward_gradients() -> None:
    """A small vocabulary and long sequences: the recompute is the peak, and its parts say
    so."""
    body = _fms_lora(16)
    body["workloads"][0]["model"] = {
        "source": "dimensions",
        "hidden_size": H,
        "num_layers": 8,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": F,
        "vocab_size": 1_024,
    }
    d = _budget(body).devices[0]
    assert d.peak_phase == "backward_recompute"
    acts = _parts(_budget(body), Component.ACTIVATIONS)
    assert "final norm and LM-head inputs" not in acts
    assert acts[RECOMPUTE_GRADS_PART] == 16 * 4096 * (2 * (2 * F + 4 * H) + 8 * H)
    assert {x.component: x.bytes for x in d.lines}[Component.LOGITS] == 0
    assert _parts(_budget(body), Component.LOGITS) == {}
    # LitGPT's loop holds its fp32 logits through fabric.backward (litgpt 0.4.5 finetune/
    # lora.py lines 304-308): they are still there when the layers are recomputed.
    body["software"] = {"framework": "litgpt", "framework_version": "0.4.5"}
    lit = _budget(body)
    assert lit.devices[0].peak_phase == "backward_recompute"
    logits = {x.component: x.bytes for x in lit.devices[0].lines}[Component.LOGITS]
    assert logits == 16 * 4096 * 1_024 * 4


def _gemma(model: str, loss: str | None = None) -> Budget:
    body: dict[str, Any] = {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": model},
                "precision": {"weights": "bf16"},
                "mixed_precision": "pure",
                "micro_batch_size": 2,
                "sequence_length": 1024,
                "checkpointing": "full",
                "method": {"kind": "lora"},
            }
        ],
        "headroom": {"fraction": 0.0},
    }
    if loss:
        body["software"] = {"loss": loss}
    return _budget(body)


def test_gemma_2_keeps_its_soft_capped_logits() -> None:
    """Gemma 2 caps the LM head's output, tanh(logits / 30) x 30, and tanh saves its bf16
    output until its backward: 2,048 tokens x 256,000 x 2 = 1,048,576,000 B beside the loss's
    tensors (the trace tier of transformers' own Gemma2ForCausalLM: 13,126,225,920 B allocated
    at its peak, the estimate within 0.3% of it with this part, 8% below without)."""
    logits = _parts(_gemma("gemma-2-2b"), Component.LOGITS)
    assert logits[SOFTCAP_PART] == 2 * 1024 * 256_000 * 2 == 1_048_576_000
    assert SOFTCAP_PART not in _parts(_gemma("gemma-3-4b"), Component.LOGITS)
    # A fused linear cross-entropy caps inside its kernel: no logits at all.
    fused = _gemma("gemma-2-2b", "fused_linear_cross_entropy")
    assert sum(_parts(fused, Component.LOGITS).values()) == 0


def test_liger_swiglu_saves_gate_and_up_only() -> None:
    """Liger's LigerSiLUMulFunction saves a and b and writes their gradients into them: one
    tensor of width f fewer per layer than SiLU then mul (Llama 3.1 8B: f 14,336, 32 layers,
    4,096 tokens, bf16: 32 x 4,096 x 14,336 x 2 = 3,758,096,384 B), and one fewer gradient in
    the recomputed layer's backward."""
    w = deploy(
        msgspec.convert(
            {
                "kind": "training",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "precision": {"weights": "bf16"},
                "mixed_precision": "pure",
                "sequence_length": 4096,
                "attention": "flash",
            },
            TrainingWorkload,
        )
    )
    arch = resolve_model(w.model)
    (st,) = statics_for(w, arch)

    def mlp(fused: bool) -> int:
        _, _, parts = training_activations(w, arch, st.stage, st.dims, fused_swiglu=fused)
        return dict(parts)["mlp intermediates"]

    assert mlp(False) - mlp(True) == 32 * 4096 * 14_336 * 2 == 3_758_096_384
    assert (
        recompute_backward_bytes(st.dims, 4096, 2, w.method)
        - recompute_backward_bytes(st.dims, 4096, 2, w.method, fused_swiglu=True)
        == 4096 * 14_336 * 2
    )
    liger = resolve_stack(msgspec.convert({"libraries": {"liger_kernel": "0.5.10"}}, Software))
    assert liger.fused_swiglu
    assert "fused kernel" in {b.name: b.assumed for b in liger.behaviours}["swiglu"]
    assert not resolve_stack(None).fused_swiglu


def test_liger_leaves_the_families_it_does_not_patch_eager() -> None:
    """Liger's model table (monkey_patch.py MODEL_TYPE_TO_APPLY_LIGER_FN) patches the MLP of the
    families it lists; a model it does not know keeps transformers' MLP and saves 3 f'."""

    def mlp_line(model: dict[str, Any], libraries: dict[str, str]) -> int:
        b = _budget(
            {
                "workloads": [
                    {
                        "kind": "training",
                        "model": model,
                        "precision": {"weights": "bf16"},
                        "mixed_precision": "pure",
                        "sequence_length": 4096,
                        "checkpointing": "none",
                        "attention": "flash",
                        "method": {"kind": "lora", "target_modules": TARGETS},
                    }
                ],
                "headroom": {"fraction": 0.0},
                "software": {"libraries": libraries, "loss": "cross_entropy"},
            }
        )
        return _parts(b, Component.ACTIVATIONS)["mlp intermediates"]

    dims = {
        "source": "dimensions",
        "hidden_size": 2048,
        "num_layers": 4,
        "num_attention_heads": 16,
        "intermediate_size": 5632,
        "vocab_size": 32_000,
    }
    liger = {"liger_kernel": "0.5.10"}
    assert mlp_line(dims, liger) == mlp_line(dims, {})
    llama = {"source": "preset", "id": "llama-3.1-8b"}
    assert mlp_line(llama, {}) - mlp_line(llama, liger) == 32 * 4096 * 14_336 * 2


def test_peft_qlora_keeps_fp32_layer_inputs() -> None:
    """PEFT's prepare_model_for_kbit_training casts the embeddings and norms to fp32, so the
    residual stream -- each checkpointed layer input -- is fp32 (fms-acceleration's QLoRA run
    at batch 8 read 37,002,646,016 B allocated; the estimate is within 2% of it with fp32
    inputs and 22% below with bf16 ones). torchtune keeps them bf16."""
    body = _fms_lora(8)
    body["workloads"][0]["method"] = {
        "kind": "qlora",
        "rank": 16,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    }
    del body["workloads"][0]["precision"], body["workloads"][0]["mixed_precision"]
    tokens = 8 * 4096
    b = _budget(body)
    peft = _parts(b, Component.ACTIVATIONS)
    assert peft["layer inputs (full recomputation)"] == L * tokens * H * 4
    lines = {x.component: x.bytes for x in b.devices[0].lines}
    outside = (Component.CUDA_CONTEXT, Component.ALLOCATOR_OVERHEAD, Component.HEADROOM)
    allocated = sum(v for c, v in lines.items() if c not in outside)
    assert allocated == pytest.approx(37_002_646_016, rel=0.02)
    body["software"] = {"framework": "torchtune"}
    tune = _parts(_budget(body), Component.ACTIVATIONS)
    assert tune["layer inputs (full recomputation)"] == L * tokens * H * 2


@pytest.mark.parametrize(("weights", "per_score"), [("bf16", 6), ("fp32", 8)])
def test_an_eager_attentions_backward_holds_the_fp32_softmax_gradients(
    weights: str, per_score: int
) -> None:
    """Llama 2 7B LoRA, 4 x 2,048 tokens, eager attention (transformers'
    eager_attention_forward: fp32 softmax, cast back): one layer's scores are 4 x 32 x 2,048^2 =
    536,870,912 elements. The softmax's backward holds the fp32 gradients of its output and
    input beside the saved fp32 probabilities, the bf16 probabilities released: 12 - 6 = 6 B per
    score over the saved set, 3,221,225,472 B, more than the MLP's moment (8,192 x (2 x 11,008
    x 2 + 4 x 4,096 x 2) = 629,145,600 B). In fp32 the probabilities are one tensor: 12 - 4 = 8
    B. SDPA's fused kernels keep the MLP's moment."""
    spec = {
        "kind": "training",
        "model": {"source": "preset", "id": "llama-2-7b"},
        "precision": {"weights": weights},
        "micro_batch_size": 4,
        "sequence_length": 2048,
        "checkpointing": "full",
        "attention": "eager",
        "method": {"kind": "lora", "rank": 8, "adapter_dtype": weights},
    }
    w = deploy(msgspec.convert(spec, TrainingWorkload))
    arch = resolve_model(w.model)
    (st,) = statics_for(w, arch)
    scores = 4 * 32 * 2048 * 2048
    assert scores == 536_870_912
    eager = eager_softmax_backward_bytes(w, arch, st.dims)
    assert eager == scores * per_score
    e = 2 if weights == "bf16" else 4
    assert recompute_backward_bytes(st.dims, 8192, e, w.method, eager_bytes=eager) == eager
    sdpa = deploy(msgspec.convert({**spec, "attention": "sdpa"}, TrainingWorkload))
    assert eager_softmax_backward_bytes(sdpa, arch, st.dims) == 0
    if weights == "bf16":
        assert recompute_backward_bytes(st.dims, 8192, 2, sdpa.method) == 629_145_600


@pytest.mark.parametrize(
    ("mixed_precision", "saved", "backward"), [("pure", 2, 4), ("autocast", 4 + 2, 6)]
)
def test_gpt2s_softmax_runs_in_the_scores_dtype_unless_autocast(
    mixed_precision: str, saved: int, backward: int
) -> None:
    """GPT-2's eager attention calls ``softmax(attn_weights, dim=-1)`` without a dtype
    (transformers modeling_gpt2.py eager_attention_forward): a pure fp16 model saves fp16
    probabilities (2 B per score) and its softmax backward holds two fp16 gradients (4 B);
    under autocast softmax runs in fp32 (autocast's fp32 list) and is cast back, as Llama's.
    GPT-2 124M, 2 x 1,024 tokens: 2 x 12 x 1,024^2 = 25,165,824 scores per layer."""
    spec = {
        "kind": "training",
        "model": {"source": "preset", "id": "gpt2"},
        "precision": {"weights": "fp16", "compute": "fp16"},
        "mixed_precision": mixed_precision,
        "micro_batch_size": 2,
        "sequence_length": 1024,
        "checkpointing": "full",
        "attention": "eager",
        "method": {"kind": "full"},
    }
    if mixed_precision == "autocast":
        spec["precision"] = {"weights": "fp32", "compute": "fp16"}
    w = deploy(msgspec.convert(spec, TrainingWorkload))
    arch = resolve_model(w.model)
    (st,) = statics_for(w, arch)
    scores = 2 * 12 * 1024 * 1024
    assert scores == 25_165_824
    assert eager_softmax_fp32(w, arch) is (mixed_precision == "autocast")
    layer, _ = arch.layer_runs[0]
    items = training_saved(
        layer,
        arch,
        st.dims,
        seq=1024,
        batch=2,
        e=2,
        attention="eager",
        dropout=False,
        sequence_parallel=False,
        drop_scores=False,
        softmax_fp32=eager_softmax_fp32(w, arch),
    )
    name = "softmax output (fp32 and its cast)" if saved == 6 else "softmax output"
    assert items[name] == scores * saved
    assert eager_softmax_backward_bytes(w, arch, st.dims) == scores * backward


def test_a_sliding_window_does_not_bound_the_eager_softmax_backward() -> None:
    """Mistral 7B v0.1 (every layer a 4,096-token sliding window, its config.json) at 8,192
    tokens: transformers' eager attention multiplies the queries by every key and masks the
    window (``eager_attention_forward``), so its scores are 1 x 32 x 8,192 x 8,192 =
    2,147,483,648, as the saved set counts them, x 6 B in bf16 = 12,884,901,888 B (the trace
    tier of a window-128 model agrees: tests/trace/test_sdpa.py)."""
    spec = {
        "kind": "training",
        "model": {"source": "preset", "id": "mistral-7b-v0.1"},
        "precision": {"weights": "bf16"},
        "micro_batch_size": 1,
        "sequence_length": 8192,
        "checkpointing": "full",
        "attention": "eager",
        "method": {"kind": "lora", "rank": 8},
    }
    w = deploy(msgspec.convert(spec, TrainingWorkload))
    arch = resolve_model(w.model)
    (st,) = statics_for(w, arch)
    assert {layer.window for layer, _ in arch.layer_runs} == {4096}
    assert eager_softmax_backward_bytes(w, arch, st.dims) == 32 * 8192 * 8192 * 6 == 12_884_901_888
