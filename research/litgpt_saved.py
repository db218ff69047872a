"""What LitGPT's own model code saves for backward, against the formulas' training activations
(research/stack_behaviours.md section 2d).

Runs a small LitGPT LoRA model (4 layers, hidden 1,024, bf16, 2 x 512 tokens) on the CPU under
``torch.autograd.graph.saved_tensors_hooks`` and sums the distinct storages its forward and
loss save, parameters and buffers excluded; the loss's log-softmax is left out (the logits are
the ``logits`` component, compared by hand in the section). The formulas' side is the
``activations`` line of the same dimensions as a Llama ``config.json``, framework ``litgpt``.

LitGPT is not a dependency of this project: point the script at an unpacked wheel
(``pip download --no-deps litgpt==0.4.5`` and unzip it). Its ``utils.py`` imports lightning;
only three functions of it are needed, so they are loaded from the file without the module.

Run from the repository root:
    python -m research.litgpt_saved /path/to/unpacked/litgpt-0.4.5
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path
from typing import Any

import msgspec

from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, BATCH, SEQ = 1024, 2816, 4, 32000, 2, 512

# (query heads, key/value heads, LoRA on every projection, on the LM head, lora_dropout)
CASES = (
    (16, 16, False, False, 0.0),
    (16, 4, False, False, 0.0),
    (16, 16, True, False, 0.0),
    (16, 1, True, True, 0.0),
    (16, 4, False, False, 0.05),
)


def _load_litgpt(root: Path) -> Any:
    """``litgpt.lora`` from an unpacked wheel, with a ``litgpt.utils`` holding only the
    functions the model and the loss use (the real module imports lightning)."""
    src = (root / "litgpt" / "utils.py").read_text()
    wanted = {"find_multiple", "map_old_state_dict_weights", "chunked_cross_entropy"}
    tree = ast.parse(src)
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    utils = types.ModuleType("litgpt.utils")
    # the released functions' own source
    exec(
        "import torch\nfrom typing import *\n" + "\n".join(ast.unparse(n) for n in body),
        utils.__dict__,
    )
    package = types.ModuleType("litgpt")
    package.__path__ = [str(root / "litgpt")]
    sys.modules["litgpt"] = package
    sys.modules["litgpt.utils"] = utils
    importlib.import_module("litgpt.model")  # litgpt.config imports the model first
    lora = importlib.import_module("litgpt.lora")

    return lora, utils


def saved_by_litgpt(lora: Any, utils: Any, case: tuple[int, int, bool, bool, float]) -> int:
    import torch

    heads, groups, every, head, dropout = case
    cfg = lora.Config(
        name="probe",
        block_size=SEQ,
        vocab_size=VOCAB,
        padded_vocab_size=VOCAB,
        n_layer=LAYERS,
        n_head=heads,
        n_query_groups=groups,
        n_embd=HIDDEN,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        intermediate_size=INTERMEDIATE,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=dropout,
        lora_query=True,
        lora_key=every,
        lora_value=True,
        lora_projection=every,
        lora_mlp=every,
        lora_head=head,
    )
    torch.manual_seed(0)
    model = lora.GPT(cfg).to(torch.bfloat16)
    model.max_seq_length = SEQ
    lora.mark_only_lora_as_trainable(model)
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}
    loss_saved: dict[int, int] = {}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            into = loss_saved if t.dim() == 2 and t.size(-1) == VOCAB else saved
            into[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    y = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(x, lm_head_chunk_size=128)  # finetune/lora.py fit
        logits[-1] = logits[-1][..., :-1, :]
        utils.chunked_cross_entropy(logits, y[..., 1:])
    return sum(saved.values())


def formula_activations(case: tuple[int, int, bool, bool, float]) -> int:
    heads, groups, every, head, dropout = case
    targets = ["q_proj", "v_proj"]
    if every:
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    if head:
        targets.append("lm_head")
    config = {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_attention_heads": heads,
        "num_key_value_heads": groups,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    body = {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "hf_config", "config": config},
                "precision": {"weights": "bf16"},
                "mixed_precision": "pure",
                "micro_batch_size": BATCH,
                "sequence_length": SEQ,
                "optimizer": {"name": "adamw"},
                "attention": "sdpa",
                "method": {
                    "kind": "lora",
                    "rank": 8,
                    "target_modules": targets,
                    "adapter_dtype": "bf16",
                    "dropout": dropout,
                },
            }
        ],
        "headroom": {"fraction": 0.0},
        "software": {"framework": "litgpt", "framework_version": "0.4.5", "torch_version": "2.3.0"},
    }
    req = msgspec.convert(body, BudgetRequest)
    budget = estimate(req.workloads, req.device, req.headroom, software=req.software)
    lines = {line.component: line for line in budget.devices[0].lines}
    acts = lines["activations"]  # type: ignore[index]
    return sum(p.bytes for p in acts.parts)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    lora, utils = _load_litgpt(Path(argv[0]))
    print("| attention | LoRA on | lora_dropout | saved by LitGPT (B) | formula (B) | difference |")
    print("|---|---|---:|---:|---:|---:|")
    for case in CASES:
        heads, groups, every, head, dropout = case
        real, formula = saved_by_litgpt(lora, utils, case), formula_activations(case)
        kind = "MHA" if heads == groups else "MQA" if groups == 1 else "GQA"
        targets = ("every projection" if every else "q, v") + (" + LM head" if head else "")
        print(
            f"| {kind} {heads}/{groups} | {targets} | {dropout} | {real:,} | {formula:,} | "
            f"{(formula - real) / real:+.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
