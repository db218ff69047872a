"""torchtune 0.1's QLoRA model init (vrambudget.core.allocator.nf4_init): every NF4 weight
quantized on the GPU three times by torchao 0.1's unchunked to_nf4, replayed through the
caching-allocator model."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.allocator.nf4_init import replay_nf4_init
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

H, F, V = 4_096, 11_008, 32_000
LLAMA2_7B = ((H, H, True),) * 4 + ((H, F, True), (F, H, True), (H, F, True))


def test_the_replay_matches_torchtunes_published_init_peak() -> None:
    """torchtune's QLoRA tutorial (docs/source/tutorials/qlora_finetune.rst, commit 0914d5c,
    Llama-2-7B, qlora_llama2_7b): "Peak memory reserved, model init 9.13 GB" (bytes / 1e9).
    The replay lands within 0.5% of it (the printed value has three digits)."""
    r = replay_nf4_init(LLAMA2_7B, 32, 8, 2 * V * H, 2 * V * H, H)
    assert r.peak_reserved_bytes == pytest.approx(9.13e9, rel=0.005)
    # The loaded model's own tensors, by hand: per NF4 weight of n elements the packed data
    # n / 2, the int8 block scalers n / 64, the quantization factor's storage n / 32 (a view
    # of the (n / 16384, 256) bf16 tensor) and the 16-value table; LoRA A and B in bf16; two
    # norms per layer, the final one, the embedding and the head.
    own = 0
    for n_in, n_out, _ in LLAMA2_7B:
        n = n_in * n_out
        own += 32 * (n // 2 + n // 64 + n // 32 + 32 + 2 * 8 * (n_in + n_out))
    own += 32 * 2 * 2 * H + 2 * H + 2 * 2 * V * H
    assert own < r.end_allocated_bytes < own * 1.02  # the allocator's 512-byte rounding
    # The temporaries' peak: far above the model's own bytes.
    assert r.peak_reserved_bytes > 2 * r.end_allocated_bytes


def _qlora(version: str, compute: str = "bf16", model: str = "llama-2-7b") -> dict:
    req = {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": model},
                "precision": {"weights": "bf16", "compute": compute},
                "mixed_precision": "pure",
                "micro_batch_size": 2,
                "sequence_length": 512,
                "optimizer": {"name": "adamw"},
                "checkpointing": "full",
                "method": {
                    "kind": "qlora",
                    "rank": 8,
                    "target_modules": [
                        "q_proj",
                        "k_proj",
                        "v_proj",
                        "o_proj",
                        "gate_proj",
                        "down_proj",
                        "up_proj",
                    ],
                },
            }
        ],
        "device": {"source": "catalog", "id": "a100-sxm4-80gb"},
        "software": {"framework": "torchtune", "framework_version": version},
    }
    r = msgspec.convert(req, BudgetRequest)
    return msgspec.to_builtins(estimate(r.workloads, r.device, r.headroom, software=r.software))


def test_torchtune_0_1_peaks_at_model_init() -> None:
    b = _qlora("0.1.1")
    (dev,) = b["devices"]
    assert dev["peak_phase"] == "model_init"
    lines = {ln["component"]: ln["bytes"] for ln in dev["lines"]}
    r = replay_nf4_init(LLAMA2_7B, 32, 8, 2 * V * H, 2 * V * H, H)
    # The model's tensors, the temporaries live at the init's allocated peak, then what the
    # allocator reserves beyond it: together the replay's reserved peak.
    held = lines["weights"] + lines["quantization_metadata"] + lines["adapters"]
    assert lines["runtime_workspace"] == r.peak_allocated_bytes - held
    assert held + lines["runtime_workspace"] + lines["allocator_overhead"] == r.peak_reserved_bytes
    for c in ("optimizer_state", "gradients", "activations", "logits"):
        assert lines[c] == 0, c
    names = [x["name"] for x in b["stack"]["behaviours"]]
    assert "quantized_model_init" in names


def test_torchtune_0_2_has_no_model_init_phase() -> None:
    """torchao 0.2 quantizes in chunks of 2**20 elements: no such peak."""
    (dev,) = _qlora("0.2.0")["devices"]
    assert "model_init" not in [p["name"] for p in dev["phases"]]


def test_only_the_adapted_projections_are_quantized() -> None:
    """torchtune 0.1 keeps the projections LoRA does not adapt as bf16 nn.Linear: built and
    cloned on the GPU (2 bytes an element), loaded in place, no NF4 temporaries."""
    qv = ((H, H, True), (H, H, False), (H, H, True), (H, H, False))
    mlp = ((H, F, False), (F, H, False), (H, F, False))
    r = replay_nf4_init(qv + mlp, 32, 8, 2 * V * H, 2 * V * H, H)
    plain = 32 * 2 * (2 * H * H + 3 * H * F)
    assert r.end_allocated_bytes > plain
    everything = replay_nf4_init(LLAMA2_7B, 32, 8, 2 * V * H, 2 * V * H, H)
    assert r.end_allocated_bytes > everything.end_allocated_bytes  # bf16 MLP weights


def test_no_phase_where_torchao_0_1_cannot_quantize() -> None:
    """to_nf4 asserts a bf16 input: an fp32 torchtune 0.1 QLoRA gets no model-init phase."""
    b = _qlora("0.1.1", compute="fp32")
    assert "model_init" not in [p["name"] for p in b["devices"][0]["phases"]]


def test_torchtune_before_0_3_says_its_unadapted_projections_are_not_counted_bf16() -> None:
    """torchtune < 0.3 leaves the projections LoRA does not adapt in bf16; the estimate
    quantizes them all and says so (0.3.0 builds FrozenNF4Linear for them)."""
    for version, gap in (("0.2.1", True), ("0.3.1", False)):
        b = _qlora(version)
        (kbit,) = [x for x in b["stack"]["behaviours"] if x["name"] == "qlora_unquantized_dtype"]
        assert ("estimate is low" in kbit["assumed"]) is gap, version


def test_no_phase_for_a_biased_adapted_projection() -> None:
    """torchtune 0.1's quantized LoRALinear raises on a bias (modules/peft/lora.py:
    'Quantized LoRALinear does not support bias at the moment'): Qwen2.5's q/k/v have one."""
    b = _qlora("0.1.1", model="qwen2.5-0.5b")
    assert "model_init" not in [p["name"] for p in b["devices"][0]["phases"]]
