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
KNOWN: dict[tuple[str, str], str] = {
    ("qwen0.5b train foreach", "total"): "fragmentation after foreach temporaries (replay 59%)",
    ("qwen0.5b train for-loop", "total"): "fragmentation of per-tensor temporaries (replay 69%)",
    ("qwen0.5b train fp16", "total"): "as foreach: fragmentation after step temporaries",
    ("qwen0.5b train 8-bit AdamW", "total"): "fragmentation of the upcast fp32 gradients (46%)",
    ("qwen0.5b train autocast fp32", "total"): "autocast weight casts are freed per layer in "
    "backward; their segments stay cached (replay 68%)",
    ("qwen0.5b train autocast fp32", "activations"): "casts of the fp32 weights saved for "
    "backward are counted as workspace by the formula, as activations by the trace",
    ("qwen0.5b train full ckpt", "activations"): "the recomputed layer's backward temporaries "
    "(gradients of its intermediates) are not in the formula",
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
    ("gemma2-2b infer 8k sliding", "total"): "sliding-window ring buffers and 8k prefill "
    "fragment more (replay 79%)",
    ("gpt2 train dropout", "gradients"): "GPT-2's last parameters in module order differ from "
    "the formula's (tied head)",
    ("bert-base train", "gradients"): "BERT's pooler is registered after the layers",
}


def _params() -> list[object]:
    return [pytest.param(name, spec, id=name) for name, spec in GRID]


@pytest.mark.parametrize(("name", "spec"), _params())
def test_trace_agrees_with_formulas(name: str, spec: dict[str, object]) -> None:
    assert len(GRID) >= 30
    failures = []
    known = []
    for row in compare(name, spec):
        ok = abs(row.error) <= row.tolerance
        if (name, row.component) in KNOWN:
            known.append((row, ok))
        elif not ok:
            failures.append(
                f"{row.component}: analytic {row.analytic:,} trace {row.traced:,} "
                f"({row.error:+.2%}, tolerance {row.tolerance:.1%})"
            )
    assert not failures, failures
    for row, ok in known:
        if ok:  # a fixed formula: remove it from KNOWN
            pytest.fail(f"{row.component} now within tolerance ({row.error:+.2%}): update KNOWN")
    if known:
        pytest.xfail("; ".join(KNOWN[(name, r.component)] for r, _ in known))
