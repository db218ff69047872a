"""SDPA's math path in the analytic tier: which device and stack leave transformers' SDPA call
no fused kernel (torch 2.13 ``sdp_utils.cpp``; transformers 5.23 ``use_gqa_in_sdpa``), and what
the math path holds (``attention.cpp`` ``_scaled_dot_product_attention_math``), against hand
computations. tests/trace/test_sdpa.py checks the same bytes against the path itself, run op by
op on fake tensors, and a framework trace of transformers' code on a T4."""

from __future__ import annotations

import pytest

from tests.support.workloads import TINY_BF16, attention_dims, budget_of, preset_body, workload
from vrambudget.core.arch import attention_run
from vrambudget.core.components import Component
from vrambudget.core.deployed import deploy
from vrambudget.core.formulas.activations import training_activations
from vrambudget.core.formulas.activations.inference import math_path_bytes
from vrambudget.core.formulas.activations.training import (
    MATH_PROBABILITIES_PART,
    eager_softmax_backward_bytes,
)
from vrambudget.core.formulas.allocator_overhead import (
    EAGER_INFERENCE_FRAGMENTATION_FRACTION,
    INFERENCE_FRAGMENTATION_FRACTION,
)
from vrambudget.core.formulas.sdpa import flash_hardware, transformers_sdpa_backend
from vrambudget.core.overheads import device_overheads, with_software
from vrambudget.core.resolve import resolve_model
from vrambudget.core.spec import Software
from vrambudget.core.statics import statics_for

LLAMA8 = {"heads": 32, "kv_heads": 8, "head_dim": 128, "v_head_dim": 128}


@pytest.mark.parametrize(
    ("cc", "vendor", "flash"),
    [("7.5", "nvidia", False), ("7.0", "nvidia", False), ("8.0", "nvidia", True),
     ("8.6", "nvidia", True), ("9.0", "nvidia", True), (None, "nvidia", True),
     (None, "amd", True)],
)  # fmt: skip
def test_flash_hardware_is_sm80_and_later(cc: str | None, vendor: str, flash: bool) -> None:
    assert flash_hardware(cc, vendor) is flash


@pytest.mark.parametrize(
    ("dtype", "heads", "kv_heads", "native", "flash_hw", "backend"),
    [
        ("fp16", 32, 8, True, False, "math"),  # Llama 3 8B on a T4
        ("fp16", 32, 8, True, True, "flash"),  # on an A10
        ("fp32", 32, 8, True, True, "math"),  # fp32 on an A100: no flash, no GQA in mem-eff
        ("fp16", 32, 8, False, False, "mem_efficient"),  # transformers < 4.54 repeats K/V
        ("bf16", 32, 8, False, False, "math"),  # ... but bf16 has no kernel below sm80
        ("fp16", 12, 12, True, False, "mem_efficient"),  # GPT-2 on a T4
        ("bf16", 12, 12, True, False, "math"),
        ("fp32", 12, 12, True, True, "mem_efficient"),
    ],
)
def test_transformers_sdpa_backend(
    dtype: str, heads: int, kv_heads: int, native: bool, flash_hw: bool, backend: str
) -> None:
    got = transformers_sdpa_backend(
        dtype=dtype,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=128 if heads == 32 else 64,
        v_head_dim=128 if heads == 32 else 64,
        native_gqa=native,
        flash_hw=flash_hw,
    )
    assert got == backend


def test_math_path_bytes_by_hand() -> None:
    """Llama 3 8B, one 1,024-token fp16 prefill. Held to the end: fp32 copies of q (1,024 x 32
    x 128 x 4 = 16,777,216), k and v (2 x 1,024 x 8 x 128 x 4 = 8,388,608), the scaled q
    (16,777,216), k and v on every head (2 x 16,777,216) and the causal mask (1,024^2 x 4 =
    4,194,304): 79,691,776. The softmax's moment: 32 x 1,024^2 scores x 9 B + 32 x 1,024 row
    flags = 302,022,656 (the scores' matmul: 16,777,216 + 134,217,728; the return: 6 B per
    score and the fp32 output with its cast, 201,326,592 + 25,165,824)."""
    held = 16_777_216 + 8_388_608 + 16_777_216 + 2 * 16_777_216 + 4_194_304
    assert held == 79_691_776
    softmax = 32 * 1024 * 1024 * 9 + 32 * 1024
    assert softmax > 16_777_216 + 134_217_728 and softmax > 201_326_592 + 25_165_824
    assert (
        math_path_bytes(attention_dims(32, 8, 128), 1, 1024, 1024, 2)
        == held + softmax
        == 381_714_432
    )
    # fp32 inputs: no copies, no casts back; the same softmax moment.
    fp32 = 16_777_216 + 2 * 16_777_216 + 4_194_304 + softmax
    assert math_path_bytes(attention_dims(32, 8, 128), 1, 1024, 1024, 4) == fp32
    # A decode step over 700 keys, 3 sequences, Qwen 2.5 0.5B's heads (14 on 2, 64): no mask,
    # and the scaled keys dominate: copies (3 x 14 x 64 + 3 x 700 x 2 x 128) x 4 = 2,161,152,
    # scaled q 10,752, K/V on every head 3 x 700 x 14 x 128 x 4 = 15,052,800, the scaled keys
    # 3 x 700 x 14 x 64 x 4 = 7,526,400 and the fp32 scores 3 x 14 x 700 x 4 = 117,600.
    decode = 2_161_152 + 10_752 + 15_052_800 + 7_526_400 + 117_600
    assert math_path_bytes(attention_dims(14, 2, 64), 3, 1, 700, 2) == decode == 24_868_704


TORCH_2_13 = {"torch_version": "2.13.0"}
"""The last torch release whose memory-efficient kernel takes no grouped heads."""


def _activations(gpu: str, software: dict[str, str] | None = None, **fields: object) -> int:
    body = preset_body("inference", "llama-3.1-8b", gpu, software, **fields)
    b = budget_of(body)
    (line,) = [ln for ln in b.devices[0].lines if ln.component is Component.ACTIVATIONS]
    return line.bytes


FP16 = {"weights": "fp16", "compute": "fp16"}


def test_a_t4_budgets_the_math_path_and_an_a10_does_not() -> None:
    """Llama 3.1 8B, one 1,024-token fp16 prefill under torch 2.13: per layer the residual
    stream (4 x 1,024 x 4,096 x 2 = 33,554,432), q, k and v (1,024 x (32 + 2 x 8) x 128 x 2 =
    12,582,912) and the math path (381,714,432) -- larger than the MLP's 1,024 x 3 x 14,336 x 2
    = 88,080,384. bf16 runs it under any torch (no memory-efficient kernel takes bf16 there)."""
    fields = {"prompt_tokens": 1024, "generated_tokens": 1}
    t4 = _activations("t4-16gb", TORCH_2_13, precision=FP16, **fields)
    assert t4 == 33_554_432 + 12_582_912 + 381_714_432
    assert _activations("t4-16gb", precision={"weights": "bf16", "compute": "bf16"}, **fields) == t4
    a10 = _activations("a10-24gb", TORCH_2_13, precision=FP16, **fields)
    # flash: q, k, v, the output and the fp32 log-sum-exp (32 x 1,024 x 4) beside the stream
    attn = 1024 * (2 * 32 * 128 + 2 * 8 * 128) * 2 + 32 * 1024 * 4
    assert a10 == 33_554_432 + max(attn, 88_080_384)
    # fp16 under torch 2.14+ (the default stack's 2.15): the memory-efficient kernel takes the
    # grouped heads; and under 2.13, transformers 4.53 repeats K/V itself: the same kernel
    assert _activations("t4-16gb", precision=FP16, **fields) == a10
    old = _activations(
        "t4-16gb", {**TORCH_2_13, "framework_version": "4.53.0"}, precision=FP16, **fields
    )
    assert old < t4 / 3


def test_the_math_path_takes_the_eager_fragmentation_fraction() -> None:
    ov = with_software(device_overheads("7.5", "nvidia", None), Software())
    assert ov.inference_fragmentation("math") == ov.inference_fragmentation("eager")
    assert ov.inference_fragmentation("math") == round(
        EAGER_INFERENCE_FRAGMENTATION_FRACTION * 1_000_000
    )
    assert ov.inference_fragmentation("sdpa") == round(INFERENCE_FRAGMENTATION_FRACTION * 1_000_000)


def test_which_stacks_run_the_math_path() -> None:
    w = workload(kind="inference", model={"source": "preset", "id": "llama-3.1-8b"})
    arch = resolve_model(w.model)  # type: ignore[union-attr]
    t4 = device_overheads("7.5", "nvidia", None)
    a100 = device_overheads("8.0", "nvidia", None)
    current = with_software(t4, Software())  # torch 2.15: memory-efficient takes GQA
    assert not current.sdpa_math(arch, "fp16") and current.sdpa_math(arch, "bf16")
    old = with_software(t4, Software(torch_version="2.13.0"))
    assert old.sdpa_math(arch, "fp16") and old.sdpa_math(arch, "bf16")
    # a sliding-window layer's masked call: K/V repeated, so only the dtype decides
    assert not old.sdpa_math(arch, "fp16", masked=True) and old.sdpa_math(arch, "bf16", masked=True)
    assert not with_software(a100, Software()).sdpa_math(arch, "bf16")
    assert not with_software(a100, Software()).sdpa_math(arch, "fp32")
    assert with_software(a100, Software(torch_version="2.13.0")).sdpa_math(arch, "fp32")
    assert not with_software(t4, Software(torch_version="2.4.1")).sdpa_math(arch, "fp16")
    assert not with_software(t4, Software(framework="litgpt")).sdpa_math(arch, "bf16")
    assert attention_run("sdpa", arch, True) == "math"
    assert attention_run("eager", arch, True) == "eager"
    assert attention_run("flash", arch, True) == "flash"


def test_training_saves_the_math_paths_tensors() -> None:
    """Llama 3.1 8B, full fine-tuning, 1 x 2,048 fp16 tokens, per layer: flash saves q, k, v
    (2,048 x (32 + 16) x 128 x 2) and the fp32 log-sum-exp (32 x 2,048 x 4); the math path its
    fp32 scaled q, keys and values on every head (3 x 2,048 x 32 x 128 x 4) and the fp32
    probabilities (32 x 2,048^2 x 4). Both keep the output for o_proj."""
    w = deploy(
        workload(
            kind="training", model={"source": "preset", "id": "llama-3.1-8b"},
            sequence_length=2048, precision=FP16,
        )
    )  # fmt: skip
    arch = resolve_model(w.model)  # type: ignore[union-attr]
    (st,) = statics_for(w, arch)  # type: ignore[arg-type]
    _, flash, _ = training_activations(w, arch, st.stage, st.dims)  # type: ignore[arg-type]
    _, math, parts_m = training_activations(w, arch, st.stage, st.dims, sdpa_math=True)  # type: ignore[arg-type]
    flash_attn = 2048 * 48 * 128 * 2 + 32 * 2048 * 4
    math_attn = 3 * 2048 * 32 * 128 * 4 + 32 * 2048 * 2048 * 4
    assert math - flash == math_attn - flash_attn
    assert dict(parts_m)[MATH_PROBABILITIES_PART] == 32 * 32 * 2048 * 2048 * 4
    # its softmax's backward: the fp32 gradients of the probabilities and of the scores
    back = eager_softmax_backward_bytes(w, arch, st.dims, sdpa_math=True)  # type: ignore[arg-type]
    assert back == 32 * 2048 * 2048 * 8
    assert eager_softmax_backward_bytes(w, arch, st.dims) == 0  # type: ignore[arg-type]


def test_a_sliding_window_layers_mask_decides_its_kernel() -> None:
    """A sliding-window layer (window 512) at 1,024 tokens gets a mask from transformers, which
    repeats K/V: fp16 then takes the memory-efficient kernel (budgeted as SDPA's fused
    bytes); bf16 below sm80 runs the math path over all 1,024 keys with the mask (1 x 1,024 x
    1,024 x (1 + 2) bytes: the bool mask and its bf16 copy) instead of the causal matrix, on
    K/V already repeated to the 8 heads (copies of every head, nothing expanded)."""
    from vrambudget.core.formulas.activations.inference import inference_working_set
    from vrambudget.core.spec import DimensionsModel

    arch = resolve_model(
        DimensionsModel(
            hidden_size=512, num_layers=2, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=1024, vocab_size=1024, sliding_window=512,
            num_sliding_window_layers=2,
        )
    )  # fmt: skip
    ((layer, _),) = arch.layer_runs
    assert layer.window == 512
    dims = attention_dims(8, 2, 64)
    sdpa = inference_working_set(layer, arch, dims, 1, 1024, 1024, 2, "sdpa")
    assert inference_working_set(layer, arch, dims, 1, 1024, 1024, 2, "math") == sdpa
    masked = inference_working_set(layer, arch, dims, 1, 1024, 1024, 2, "math", True)
    resid = 4 * 1024 * 512 * 2
    qkv = 1024 * (8 * 64 + 8 * 128) * 2  # q; k and v repeated to 8 heads
    copies = (1024 * 8 * 64 + 1024 * 8 * 128) * 4
    scaled_q = 1024 * 8 * 64 * 4
    mask = 1024 * 1024 * 3
    softmax = 8 * 1024 * 1024 * 9 + 8 * 1024
    assert masked == resid + qkv + copies + scaled_q + mask + softmax
    # below the window the call has no mask: the unmasked math path, keys as they are
    short = inference_working_set(layer, arch, dims, 1, 256, 256, 2, "math")
    assert short == 4 * 256 * 512 * 2 + 256 * (8 * 64 + 2 * 128) * 2 + math_path_bytes(
        dims, 1, 256, 256, 2
    )


def test_the_answer_names_the_attention_that_runs() -> None:
    fields = {"prompt_tokens": 1024, "generated_tokens": 1}
    for gpu, software, runs in (
        ("t4-16gb", TORCH_2_13, "math"),
        ("t4-16gb", None, "sdpa"),
        ("a10-24gb", TORCH_2_13, "sdpa"),
    ):
        b = budget_of(
            preset_body("inference", "llama-3.1-8b", gpu, software, precision=FP16, **fields)
        )
        assert b.devices[0].inputs["attention_runs"] == runs


def test_layer_keys_follow_transformers_sliding_cache() -> None:
    """DynamicSlidingWindowLayer.get_mask_sizes: the window less one past token plus the
    queries; masked from the window on (_ignore_causal_mask_sdpa). The docstring's cases."""
    from vrambudget.core.formulas.activations.inference import layer_keys

    (layer, _), *_ = resolve_model(
        workload(kind="inference", model={"source": "preset", "id": "mistral-7b-v0.1"}).model  # type: ignore[union-attr]
    ).layer_runs
    assert layer.window == 4096
    assert layer_keys(layer, 8192, 8192) == (8192, True)  # a prefill: its whole prompt
    assert layer_keys(layer, 1, 10_000) == (4096, True)  # a decode step past the window
    assert layer_keys(layer, 1, 1000) == (1000, False)
    assert layer_keys(layer, 4096, 4096) == (4096, True)  # the window itself is masked
    assert layer_keys(layer, 8192, 1000) == (1000, False)  # a chunk larger than the prompt


def _train(checkpointing: str, **extra: object) -> object:
    body = {
        "workloads": [
            {"kind": "training", **TINY_BF16, "micro_batch_size": 4, "sequence_length": 1024,
             "attention": "eager", "checkpointing": checkpointing, **extra}
        ],
        "device": {"source": "catalog", "id": "a10-24gb"},
    }  # fmt: skip
    return budget_of(body)


@pytest.mark.parametrize("checkpointing", ["none", "selective", "full"])
def test_the_last_layers_softmax_backward_is_a_phase_without_full_recomputation(
    checkpointing: str,
) -> None:
    """Eager attention, a two-layer Mistral (4 heads), 4 x 1,024 bf16 tokens: the last layer's
    softmax backward (4 x 4 x 1,024^2 scores x 6 B = 100,663,296 B) beside every saved
    activation -- and, under selective recomputation, that layer's scores brought back (x 6 B
    again); full recomputation counts it in its recomputed layer. Every line's parts add up."""
    b = _train(checkpointing)
    d = b.devices[0]  # type: ignore[attr-defined]
    names = [p.name for p in d.phases]
    assert ("backward_attention" in names) == (checkpointing != "full")
    if checkpointing == "full":
        return
    assert max(d.phases, key=lambda p: p.total_bytes).name == "backward_attention"
    for line in d.lines:
        if line.parts:
            assert sum(p.bytes for p in line.parts) == line.bytes, line.component
    parts = {p.name: p.bytes for ln in d.lines for p in ln.parts}
    from vrambudget.core.budget.training import SCORES_BACKWARD_PART, SCORES_RECOMPUTED_PART

    assert parts[SCORES_BACKWARD_PART] == 4 * 4 * 1024 * 1024 * 6 == 100_663_296
    recomputed = parts.get(SCORES_RECOMPUTED_PART, 0)
    assert recomputed == (100_663_296 if checkpointing == "selective" else 0)
