"""The output-quality check's metrics and emulated formats (vrambudget/workloads/quality.py)
against hand computations, and its evaluation of a tiny model in-process."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest
import torch

from vrambudget.core.probe_quality import QualityCheck
from vrambudget.core.spec import InferenceWorkload
from vrambudget.workloads.quality import (
    FP4_CODE,
    NF4_CODE,
    Scores,
    blockwise_4bit,
    compare,
    dynamic_map,
    evaluate,
    fp8_round,
    fp8_weight,
    int8_rowwise,
    judge,
    kl_divergence,
    load_passages,
    perplexity,
    rtn,
    tokenize,
    top1_agreement,
)

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}


def _logits(*probs: list[float]) -> torch.Tensor:
    """Logits whose softmax is ``probs`` (float64, so the hand values hold to 1e-12)."""
    return torch.tensor(probs, dtype=torch.float64).log()


# ----------------------------------------------------------------------------- metrics --


def test_kl_of_a_three_token_vocabulary_is_the_hand_value() -> None:
    """p = (1/2, 1/4, 1/4), q = (1/4, 1/2, 1/4): KL(p||q) = 1/2 ln 2 - 1/4 ln 2 = ln 2 / 4."""
    kl = kl_divergence(_logits([0.5, 0.25, 0.25]), _logits([0.25, 0.5, 0.25]))
    assert kl.dtype == torch.float64
    assert kl.tolist() == pytest.approx([math.log(2) / 4], abs=1e-12)
    # and not symmetric in general: KL(q||p) = 1/4 ln(1/2) + 1/2 ln 2 = ln 2 / 4 here too, so
    # a lopsided pair shows the direction: p = (0.9, 0.1), q = (0.5, 0.5).
    forward = kl_divergence(_logits([0.9, 0.1]), _logits([0.5, 0.5])).item()
    assert forward == pytest.approx(0.9 * math.log(1.8) + 0.1 * math.log(0.2), abs=1e-12)


def test_identical_logits_give_zero_kl_and_full_agreement() -> None:
    torch.manual_seed(1)
    logits = torch.randn(37, 50)
    targets = torch.randint(0, 50, (37,))
    s = compare(logits, logits.clone(), targets)
    assert s.mean_kl == 0.0 and s.p99_kl == 0.0
    assert s.token_agreement == 1.0
    assert s.perplexity == s.reference_perplexity
    assert s.perplexity_increase == 0.0
    assert s.positions == 37


def test_agreement_perplexity_and_p99_by_hand() -> None:
    ref = _logits([0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.6, 0.3, 0.1])
    cand = _logits([0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.3, 0.3, 0.4], [0.2, 0.7, 0.1])
    assert top1_agreement(ref, cand) == 0.5  # positions 0 and 2 agree
    uniform = torch.zeros(4, 3)
    assert perplexity(uniform, torch.tensor([0, 1, 2, 0])) == pytest.approx(3.0, abs=1e-12)
    # probabilities 0.7, 0.8, 0.4, 0.6 of the targets: exp(-mean ln p)
    expect = math.exp(-(math.log(0.7) + math.log(0.8) + math.log(0.4) + math.log(0.6)) / 4)
    assert perplexity(ref, torch.tensor([0, 1, 2, 0])) == pytest.approx(expect, rel=1e-6)
    # 99 identical positions and one with KL ln2/4: the mean is k/100, the 99th percentile
    # (linear interpolation between the 99th and 100th of 100 sorted values) 0.01 k.
    k = math.log(2) / 4
    same = torch.zeros(99, 3, dtype=torch.float64)
    r = torch.cat([same, _logits([0.5, 0.25, 0.25])])
    c = torch.cat([same, _logits([0.25, 0.5, 0.25])])
    s = compare(r, c, torch.zeros(100, dtype=torch.long))
    assert s.mean_kl == pytest.approx(k / 100, abs=1e-12)
    assert s.p99_kl == pytest.approx(0.01 * k, abs=1e-12)


def _check(**fields: object) -> QualityCheck:
    base: dict[str, object] = {
        "reference": {"weights": "fp32"},
        "candidates": [{"label": "bf16", "precision": {"weights": "bf16"}}],
    }
    return msgspec.convert(base | fields, QualityCheck)


def test_judge_names_each_missed_threshold() -> None:
    s = Scores(
        positions=10,
        token_agreement=0.8,
        mean_kl=0.1,
        p99_kl=0.3,
        reference_perplexity=10.0,
        perplexity=11.0,
    )
    ok = judge("x", s, _check(max_mean_kl=0.1, min_token_agreement=0.8), None)
    assert ok.passed and ok.reasons == ()
    bad = judge(
        "x",
        s,
        _check(max_mean_kl=0.05, min_token_agreement=0.9, max_perplexity_increase=0.05),
        "how",
    )
    assert not bad.passed and bad.emulated == "how"
    assert bad.perplexity_increase == pytest.approx(0.1, abs=1e-12)
    assert bad.reasons == (
        "mean KL 0.1 nats per token is over max_mean_kl 0.05",
        "top-1 agreement 0.8000 is under min_token_agreement 0.9",
        "perplexity 11 is 10 % over the reference's 10 (max_perplexity_increase 0.05)",
    )


# ----------------------------------------------------------------------------- formats --


def test_fp8_rounding_of_known_values() -> None:
    x = torch.tensor([1.0, 0.3, 500.0, -1000.0, 0.0013])
    # e4m3: 0.3 -> 0.3125 (1.25 x 2^-2), saturated at 448, 0.0013 -> the smallest subnormal 2^-9
    assert fp8_round(x, 1.0).tolist() == [1.0, 0.3125, 448.0, -448.0, 2.0**-9]
    # per tensor: scale = amax / 448 = 2; 0.3 / 2 = 0.15 -> 0.15625 (1.25 x 2^-3), times 2
    w = torch.tensor([[896.0, 1.0], [0.3, -2.0]])
    assert fp8_weight(w, "tensor").tolist() == [[896.0, 1.0], [0.3125, -2.0]]
    # per channel: row 2's scale is 2 / 448; 0.3 / scale = 67.2 -> 64 (e4m3 steps of 8 there)
    assert fp8_weight(w, "channel")[1].tolist() == pytest.approx([64 * 2 / 448, -2.0], abs=1e-7)


def test_int8_rowwise_is_round_of_127_over_absmax() -> None:
    x = torch.tensor([[127.0, 63.6, -1.0, 0.4], [2.0, 1.0, -0.5, 0.0]])
    out = int8_rowwise(x)
    assert out[0].tolist() == [127.0, 64.0, -1.0, 0.0]
    # row 2: absmax 2, q = round(x * 63.5) = (127, 64 (63.5 rounds to even), -32, 0)
    assert out[1].tolist() == pytest.approx([2.0, 64 * 2 / 127, -32 * 2 / 127, 0.0], abs=1e-7)


def test_rtn_int_of_a_known_group() -> None:
    # AWQ: min -1, max 2, 2 bits: scale 1, zero 1, q = clamp(round(w) + 1, 0, 3)
    w = torch.tensor([[-1.0, 0.0, 0.3, 2.0]])
    assert rtn(w, 2, 4).tolist() == [[-1.0, 0.0, 0.0, 2.0]]
    # min 0.5 > 0: AWQ keeps it (scale 2.5 / 3, zero -round(0.6) clamped to 0), GPTQ widens the
    # range to [0, 3] (scale 1, zero 0; round(0.5) is 0, to even)
    w = torch.tensor([[0.5, 1.0, 2.0, 3.0]])
    s = 2.5 / 3
    assert rtn(w, 2, 4)[0].tolist() == pytest.approx([s, s, 2 * s, 3 * s], abs=1e-6)
    assert rtn(w, 2, 4, zero_in_range=True).tolist() == [[0.0, 1.0, 2.0, 3.0]]
    # groups of 4, each its own range: [0, 3] (scale 1, zero 0) and [-8, 4] (scale 4, zero 2)
    # both land on the grid; one group of 8 (scale 4) rounds the first four to 0, 0, 0, 4
    w = torch.tensor([[0.0, 1.0, 2.0, 3.0, -8.0, -4.0, 0.0, 4.0]])
    assert rtn(w, 2, 4).tolist() == w.tolist()
    assert rtn(w, 2, -1).tolist() == [[0.0, 0.0, 0.0, 4.0, -8.0, -4.0, 0.0, 4.0]]
    # symmetric int4: scale = absmax / 7
    w = torch.tensor([[7.0, 3.4, -7.0, 0.2]])
    assert rtn(w, 4, -1, symmetric=True).tolist() == [[7.0, 3.0, -7.0, 0.0]]


def test_nf4_and_fp4_code_tables_and_blockwise_rounding() -> None:
    # bitsandbytes functional.py get_4bit_type: the NF4 table as listed, FP4 normalized by 12
    assert NF4_CODE[0] == -1.0 and NF4_CODE[7] == 0.0 and NF4_CODE[15] == 1.0
    assert NF4_CODE[1] == -0.6961928009986877 and NF4_CODE[8] == 0.07958029955625534
    assert sorted(FP4_CODE)[-1] == 1.0 and FP4_CODE[1] == 0.0625 / 12 and FP4_CODE[6] == 2 / 12
    code = torch.tensor(NF4_CODE)
    # code values times the block's absmax come back exactly
    assert torch.equal(blockwise_4bit(code * 2, "nf4", 16), code * 2)
    # nearest code value: 0.03 -> 0 (midpoint 0.0398), 0.05 -> 0.0796, -0.65 -> -0.696
    # (midpoint -0.611), absmax 1 from the 1.0
    out = blockwise_4bit(torch.tensor([1.0, 0.03, 0.05, -0.65]), "nf4", 64)
    assert out.tolist() == pytest.approx([1.0, 0.0, NF4_CODE[8], NF4_CODE[1]], abs=1e-7)
    # blocks: each block of 2 its own absmax; a ragged last block too
    out = blockwise_4bit(torch.tensor([4.0, -4.0, 0.5, 0.25, 3.0]), "nf4", 2)
    # 0.25 / 0.5 = 0.5 -> 0.4407 (midpoint with 0.5626 is 0.5017)
    assert out.tolist() == pytest.approx([4.0, -4.0, 0.5, 0.5 * NF4_CODE[12], 3.0], abs=1e-6)
    # fp4: with absmax 12, the FP4 values 12, 6, 3, -8 are code points and come back exactly
    fp4 = blockwise_4bit(torch.tensor([12.0, 6.0, 3.0, -8.0]), "fp4", 4)
    assert fp4.tolist() == [12.0, 6.0, 3.0, -8.0]


def test_double_quantized_absmax_stays_close() -> None:
    m = dynamic_map()
    assert m.numel() == 256 and m[-1].item() == 1.0 and bool((m[1:] >= m[:-1]).all())
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.02
    single = blockwise_4bit(w, "nf4", 64)
    double = blockwise_4bit(w, "nf4", 64, double_quant=True)
    assert not torch.equal(single, double)
    # the 8-bit absmax moves each block's scale by well under 1 %
    assert (double - single).abs().max().item() < 0.01 * w.abs().max().item()


# -------------------------------------------------------------------------- evaluation --


def test_shipped_passages_and_byte_tokens(tmp_path: Path) -> None:
    passages = load_passages()
    assert len(passages) == 20
    assert passages[0].startswith("It is a truth universally acknowledged")
    assert not any(p.startswith("#") for p in passages)
    assert tokenize("Ab", 256, 10) == [65, 98]
    assert tokenize("Ab", 64, 10) == [65 % 64, 98 % 64]
    assert tokenize("abcdef", 256, 3) == [97, 98, 99]
    own = tmp_path / "mine.txt"
    own.write_text("# a comment\nfirst line\nsecond line\n\n\nnext one\n")
    assert load_passages(own) == ["first line second line", "next one"]


def _workload(config: dict[str, object] | None = None) -> InferenceWorkload:
    return msgspec.convert(
        {
            "kind": "inference",
            "model": {"source": "hf_config", "config": config or LLAMA},
            "prompt_tokens": 16,
            "generated_tokens": 1,
            "precision": {"weights": "fp32", "compute": "fp32"},
        },
        InferenceWorkload,
    )


def test_a_candidate_equal_to_the_reference_is_exact_and_formats_order() -> None:
    check = _check(
        reference={"weights": "fp32", "compute": "fp32"},
        candidates=[
            {"label": "same", "precision": {"weights": "fp32", "compute": "fp32"}},
            {"label": "bf16", "precision": {"weights": "bf16"}},
            {
                "label": "int4",
                "precision": {
                    "weights": "fp16",
                    "quantization": {"scheme": "gptq", "bits": 4, "group_size": 32},
                },
            },
            {
                "label": "kv8",
                "precision": {"weights": "fp32", "compute": "fp32", "kv_cache": "fp8_e4m3"},
            },
        ],
        max_sequences=4,
        sequence_tokens=64,
        max_mean_kl=0.0,
    )
    report = evaluate(_workload(), check, torch.device("cpu"))
    assert report.weights == "synthetic" and report.sequences == 4 and report.tokens == 4 * 63
    same, bf16, int4, kv8 = report.candidates
    assert same.mean_kl == 0.0 and same.token_agreement == 1.0 and same.passed
    assert same.emulated is None and bf16.emulated is None
    assert 0.0 < bf16.mean_kl < int4.mean_kl
    assert not bf16.passed and bf16.reasons[0].startswith("mean KL ")
    assert int4.emulated is not None and "14 linear layers" in int4.emulated
    assert kv8.emulated is not None and "k_proj / v_proj" in kv8.emulated
    assert kv8.mean_kl > 0.0
    assert report.reference_perplexity == pytest.approx(256, rel=0.1)  # near-uniform: N(0, 0.02)


def test_checkpoint_weights_give_the_same_numbers(tmp_path: Path) -> None:
    """A checkpoint saved from the same seeded draw: identical report but for its weights."""
    from vrambudget.workloads.hf.config import build_config, model_class

    cfg = build_config(LLAMA)
    torch.manual_seed(0)
    model = model_class(cfg, LLAMA)._from_config(cfg, dtype=torch.float32)
    model.save_pretrained(tmp_path)
    check = _check(max_sequences=2, sequence_tokens=32)
    synthetic = evaluate(_workload(), check, torch.device("cpu"))
    loaded = evaluate(_workload(), check, torch.device("cpu"), checkpoint=str(tmp_path))
    assert loaded.weights == "checkpoint"
    assert msgspec.structs.replace(loaded, weights="synthetic") == synthetic


def test_kv_emulation_needs_separate_k_and_v_projections() -> None:
    gpt2 = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 32,
        "n_layer": 1,
        "n_head": 2,
        "vocab_size": 128,
        "n_positions": 128,
    }
    check = _check(
        candidates=[{"label": "kv", "precision": {"weights": "fp32", "kv_cache": "fp8_e4m3"}}],
        max_sequences=1,
    )
    with pytest.raises(ValueError, match="k_proj / v_proj"):
        evaluate(_workload(gpt2), check, torch.device("cpu"))
