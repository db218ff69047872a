"""What the recomputed layer's own backward adds under full recomputation: transformers' code
(and PEFT's LoRA) traced on fake tensors, the activation peak against the recompute phase's
saved tensors (every layer input and one layer's saved set), per token in bf16 elements.

    .venv/bin/python bench/recompute_backward.py

A small vocabulary (1,000) and 4 Llama layers make the recompute the activation peak; the
hidden size and the MLP width vary so that the gap's coefficients of ``h`` and ``f`` can be
read off (research/stack_behaviours.md section 2e; the formula:
``vrambudget.core.formulas.activations.recompute_backward_bytes``).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from bench.framework_allocations import trace  # noqa: E402
from vrambudget.core.deployed import deploy  # noqa: E402
from vrambudget.core.formulas.activations import (  # noqa: E402
    HEAD_INPUTS_PART,
    eager_softmax_backward_bytes,
    recompute_backward_bytes,
    training_activations,
)
from vrambudget.core.resolve import resolve_model  # noqa: E402
from vrambudget.core.spec import TrainingWorkload  # noqa: E402
from vrambudget.core.stack import resolve_stack  # noqa: E402
from vrambudget.core.statics import statics_for  # noqa: E402
from vrambudget.trace.events import ALLOC  # noqa: E402

TOKENS = 2048
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _spec(h: int, f: int, method: str, adapter: str, attention: str = "sdpa") -> dict[str, object]:
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": h,
        "intermediate_size": f,
        "num_hidden_layers": 4,
        "num_attention_heads": h // 128,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    spec: dict[str, object] = {
        "kind": "training",
        "model": {"source": "hf_config", "config": config},
        "sequence_length": TOKENS,
        "checkpointing": "full",
        "precision": {"weights": "bf16"},
        "mixed_precision": "pure",
        "attention": attention,
    }
    if method == "lora":
        spec["method"] = {"kind": "lora", "adapter_dtype": adapter, "target_modules": TARGETS}
    return spec


def _activation_peak(spec: dict[str, object]) -> int:
    t = trace(spec, framework=True).trace
    sizes: dict[int, int] = {}
    live = best = 0
    for kind, handle, nbytes, _ in t.events:
        if t.tags.get(handle, "activations") != "activations":
            continue
        if kind == ALLOC:
            sizes[handle] = nbytes
            live += nbytes
            best = max(best, live)
        else:
            live -= sizes.pop(handle, 0)
    return best


def main() -> int:
    print(
        "| method | attention | h | f | trace peak | recompute saved | gap | formula's gradients |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    grid = [
        (method, adapter, h, f, "sdpa")
        for method, adapter in (("full", "bf16"), ("lora", "bf16"), ("lora", "fp32"))
        for h, f in ((1024, 2816), (1024, 5632), (2048, 2816))
    ] + [
        (method, adapter, h, 2816, "eager")
        for method, adapter in (("full", "bf16"), ("lora", "bf16"), ("lora", "fp32"))
        for h in (1024, 2048)
    ]
    for method, adapter, h, f, attention in grid:
        spec = _spec(h, f, method, adapter, attention)
        w = deploy(msgspec.convert(spec, TrainingWorkload))
        arch = resolve_model(w.model)
        (st,) = statics_for(w, arch)
        acts, _, parts = training_activations(
            w, arch, st.stage, st.dims, resolve_stack(None).rms_norm
        )
        saved = acts - dict(parts).get(HEAD_INPUTS_PART, 0)
        peak = _activation_peak(spec)
        grads = recompute_backward_bytes(
            st.dims, TOKENS, 2, w.method, eager_bytes=eager_softmax_backward_bytes(w, arch, st.dims)
        )
        unit = TOKENS * 2  # bf16 elements per token
        label = method if method == "full" else f"lora ({adapter} adapters)"
        print(
            f"| {label} | {attention} | {h} | {f} | {peak // unit} | {saved // unit} | "
            f"{(peak - saved) // unit} | {grads // unit} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
