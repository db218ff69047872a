"""The trace tier as the formulas' oracle: every workload of the grid (tests/support/trace_grid.py)
is
traced on fake tensors and estimated analytically; model states must agree within 0.5%,
activations and logits within 10%, the device total within 5%.

Rows outside the tolerance are listed in KNOWN with the reason; docs/ACCURACY.md explains each.
They are strict xfails: when a formula is fixed the test reports it and the entry must go.
"""

from __future__ import annotations

import pytest

from tests.support.trace_grid import GRID, compare

pytestmark = pytest.mark.trace_grid

# (workload, component) -> why the formula and the trace still disagree.
_GPT2_FRAGMENTS = (
    "the fragmentation line's fraction (0.21 of the largest transient bytes, the oracle grid's "
    "median) reads 0.98 GB where the replay reserves 0.39 GB beyond its allocated peak: the "
    "analytic total is 6-7% above the trace's, on the safe side (activations agree within 5%)"
)
KNOWN: dict[tuple[str, str], str] = {
    ("qwen0.5b train foreach", "total"): "fragmentation after foreach temporaries (replay 59%)",
    ("qwen0.5b train for-loop", "total"): "fragmentation of per-tensor temporaries (replay 69%)",
    ("qwen0.5b train fp16", "total"): "as foreach: fragmentation after step temporaries",
    ("qwen0.5b train autocast fp32", "total"): "autocast weight casts are freed per layer in "
    "backward; their segments stay cached (replay 68%)",
    ("qwen0.5b train QLoRA", "activations"): "frozen 4-bit projections save their input in the "
    "bitsandbytes model; the formula treats them like frozen bf16 layers",
    ("qwen0.5b train QLoRA", "total"): "PEFT's fp32 norms and embeddings are cast to bf16 at "
    "each use by the built-in builder (runtime workspace the formula does not count)",
    ("qwen1.5-moe train", "activations"): "router softmax/top-k and expert padding buffers",
    ("deepseek-v2-lite train LoRA", "activations"): "MLA's internal latent tensors (q_a, kv_a "
    "norms) under LoRA are not itemized by the formula",
    ("qwen1.5-moe infer", "activations"): "balanced routing without the gathered-input copy",
    ("qwen0.5b infer logits all", "total"): "inference fragmentation fraction is a median; "
    "large logits fragment less (replay 9%)",
    ("qwen0.5b infer fp8 KV", "total"): "as above (replay 20%)",
    ("gemma2-2b infer 8k sliding", "activations"): "the built-in builders run SDPA for Gemma 2, "
    "whose soft-capped logits transformers and LitGPT cannot pass to SDPA: the formula follows "
    "them (eager, the 8k x 8k scores per head; Arch.attention_softcap)",
    ("gemma2-2b infer 8k sliding", "total"): "as its activations",
    ("gpt2 train dropout", "gradients"): "GPT-2's last parameters in module order differ from "
    "the formula's (tied head)",
    ("gpt2 train dropout", "total"): _GPT2_FRAGMENTS,
    ("bert-base train", "gradients"): "BERT's pooler is registered after the layers",
    ("phi3-mini train LoRA bf16", "activations"): "Phi-3's fused gate_up_proj: the SiLU and "
    "the product save views of one 2f-wide output, which keep its whole storage (Phi3MLP "
    "chunks it); the formula counts gate and up as separate tensors, and with the default "
    "targets only o_proj is adapted",
}


def _params() -> list[object]:
    return [pytest.param(name, spec, id=name) for name, spec in GRID]


def _check(
    name: str, spec: dict[str, object], code: str, known_rows: dict[tuple[str, str], str]
) -> None:
    """Fail on any component outside its tolerance that `known_rows` does not explain; xfail
    with the explanations when only known rows are out; fail when a known row is back within
    tolerance (the formula was fixed: remove the entry)."""
    failures = []
    known = []
    for row in compare(name, spec, code=code):
        ok = abs(row.error) <= row.tolerance
        if (name, row.component) in known_rows:
            known.append((row, ok))
        elif not ok:
            failures.append(
                f"{row.component}: analytic {row.analytic:,} trace {row.traced:,} "
                f"({row.error:+.2%}, tolerance {row.tolerance:.1%})"
            )
    assert not failures, failures
    for row, ok in known:
        if ok:
            pytest.fail(f"{row.component} now within tolerance ({row.error:+.2%}): update KNOWN")
    if known:
        pytest.xfail("; ".join(known_rows[(name, r.component)] for r, _ in known)[:300])


@pytest.mark.parametrize(("name", "spec"), _params())
def test_trace_agrees_with_formulas(name: str, spec: dict[str, object]) -> None:
    assert len(GRID) >= 30
    _check(name, spec, "builtin", KNOWN)


# The framework's own code (transformers 5.23.0, PEFT 0.21.2) against the same formulas.
# Each entry is an allocation the framework makes that the formulas do not count, with the
# line that makes it (bench/
# framework_allocations.py attributes every live storage at the peak to its source line;
# docs/ACCURACY.md lists them).
_STEP_FRAGMENTS = (
    "the optimizer step's temporaries fragment the cached segments (the replay's reserved "
    "bytes), as in the built-in grid"
)
_QLORA_FP32 = (
    "QLoRA as PEFT prepares it: prepare_model_for_kbit_training casts norms and embeddings to "
    "fp32, so hidden states flow in fp32 and bitsandbytes computes in fp32 (its "
    "Linear4bit.set_compute_type takes an fp32 input's dtype): every saved activation doubles "
    "(peft/utils/other.py prepare_model_for_kbit_training; bitsandbytes nn/modules.py 575-636)"
)
_HF_CACHE = (
    "DynamicLayer.update grows each layer by torch.cat: the old and the new keys/values are "
    "live together for one layer (transformers cache_utils.py:136-137)"
)
KNOWN_FRAMEWORK: dict[tuple[str, str], str] = {
    ("phi3-mini train LoRA bf16", "activations"): "Phi-3's fused gate_up_proj: the SiLU and "
    "the product save views of one 2f-wide output, which keep its whole storage (Phi3MLP "
    "chunks it); the formula counts gate and up as separate tensors",
    ("gemma2-2b train LoRA", "logits"): "the soft-capped logits (tanh's saved output, "
    "Gemma2ForCausalLM.forward) are made inside the model's forward, which the trace files "
    "under activations; the formula counts them with the logits (the totals agree)",
    ("gemma2-2b train LoRA", "activations"): "Gemma 2 has no SDPA in transformers "
    "(modeling_gemma2.py: _supports_sdpa = False, softcapping): eager attention keeps the fp32 "
    "scores and their low-precision copy per head",
    **{
        (row, "total"): _STEP_FRAGMENTS
        for row in ("qwen0.5b train foreach", "qwen0.5b train for-loop", "qwen0.5b train fp16")
    },
    ("qwen0.5b train full ckpt", "total"): "the replay reserves 2.15 GB beyond its 10.81 GB "
    "allocated peak: the recomputed layers' per-layer temporaries fragment the cached segments "
    "(the formula's fragmentation fraction is a median; activations agree)",
    ("qwen0.5b train QLoRA", "activations"): _QLORA_FP32,
    ("qwen0.5b train QLoRA", "total"): _QLORA_FP32,
    ("qwen0.5b train autocast fp32", "activations"): "torch.autocast casts each fp32 weight "
    "to bf16 per use and saves the casts for backward",
    ("qwen0.5b train autocast fp32", "total"): "as its activations",
    ("gpt2 train dropout", "gradients"): "GPT-2's last parameters in module order differ from "
    "the formula's (tied head)",
    ("gpt2 train dropout", "total"): _GPT2_FRAGMENTS,
    ("bert-base train", "activations"): "BertModel's SDPA path receives an attention mask, so "
    "the memory-efficient kernel runs on every head (not flash), and its pooler, embeddings "
    "LayerNorm and dropout keep their own copies",
    ("bert-base train", "gradients"): "BERT's pooler is registered after the layers",
    ("bert-base train", "total"): "as its activations",
    ("deepseek-v2-lite train LoRA", "activations"): "transformers' DeepseekV2 attention "
    "decompresses K and V per head (kv_b_proj output) and saves them; the formula counts the "
    "latent (vLLM's MLA)",
    **{
        (row, "kv_cache"): _HF_CACHE
        for row in (
            "qwen0.5b infer",
            "qwen0.5b infer eager",
            "mistral-7b infer sliding",
            "deepseek-v2-lite infer MLA",
            "qwen1.5-moe infer",
            "llama8b infer GPTQ",
            "qwen7b infer fp16 concurrency",
            "gpt2 infer",
        )
    },
    ("qwen0.5b infer logits all", "logits"): "a forward without logits_to_keep returns bf16 "
    "logits of every position; the formula adds the fp32 copy sampling takes (vLLM's)",
    ("qwen0.5b infer logits all", "total"): "as its logits",
    ("gemma2-2b infer 8k sliding", "kv_cache"): "DynamicSlidingWindowLayer keeps a view of the "
    "whole prefill's keys/values (cache_utils.py update: full_key_states[:, :, -window+1:]), "
    "so the prefill's storage stays until the next step",
    ("gpt2 infer", "activations"): "GPT-2's eager attention materializes the scores",
    ("bert-base infer", "activations"): "BERT's SDPA with an attention mask: the "
    "memory-efficient kernel, and the encoder's dropout-free copies per layer",
    ("bert-base infer", "total"): "as its activations",
    ("deepseek-v2-lite infer MLA", "activations"): "transformers' DeepseekV2 decompresses K "
    "and V per head for attention (the formula counts vLLM's latent attention)",
    ("qwen1.5-moe infer", "activations"): "transformers' Qwen2-MoE runs the experts it routes "
    "to on gathered tokens only, balanced routing assumed: less than the formula's padded "
    "expert buffers",
    ("qwen0.5b infer fp8 KV", "total"): "transformers keeps the cache in the compute dtype: "
    "the built-in builders run it (as for the built-in grid, fragmentation 20%)",
    ("mistral-7b infer sliding", "logits"): "the last position's logits copied to fp32 "
    "(generation/utils.py _sample) beside the bf16 ones",
}


@pytest.mark.parametrize(("name", "spec"), _params())
def test_framework_trace_agrees_with_formulas(name: str, spec: dict[str, object]) -> None:
    """The trace of the framework's own code against the formulas (issue 14 item 6): rows
    outside the tolerance are allocations the framework makes that the formulas do not count,
    each listed with its source above."""
    _check(name, spec, "framework", KNOWN_FRAMEWORK)
