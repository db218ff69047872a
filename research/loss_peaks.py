"""What transformers' causal-LM loss holds, measured on the released code: the live bytes of
every storage over the forward and the loss, and over the backward, per token x vocabulary
element, with the training loop dropping the model's output before the backward (the Trainer)
and holding it through the backward (a hand-written loop that keeps ``output = model(...)``).

The model is a one-layer Llama (hidden 64) with a 32,000-token vocabulary in bf16, on CPU
tensors, so the logits dominate every number; a ``TorchDispatchMode`` sees each op's outputs
and a weak reference on each storage sees its release (as ``vrambudget.trace.recorder``).
The figures run about 0.3 byte per element above the formulas': storages seen first as an
op's output other than the loss's (the layer's activations, gradients) count too. It checks
``vrambudget/core/formulas/logits.py`` (behaviours ``loss_head_freed`` and
``loop_holds_output``): forward 12 bytes per element before 4.46, 14 for 4.46 - 4.48, 10 from
4.49; the backward's start 12 dropping the output, 16 / 14 / 14 holding it.

Run against a release installed apart from the project's own (its tokenizers and
huggingface_hub of that time), e.g.:
    pip install --no-deps --target /tmp/tf4.45.2 transformers==4.45.2 tokenizers==0.20.3 \\
        huggingface_hub==0.26.2
    PYTHONPATH=/tmp/tf4.45.2:$PWD .venv/bin/python -m research.loss_peaks

Measured 2026-12-07 (torch 2.13.0 CPU; forward / backward dropping / backward holding):
    4.35.2  12.53 / 12.50 / 16.51    (tokenizers 0.15.2, huggingface_hub 0.19.4)
    4.40.2  12.32 / 12.31 / 16.31    (tokenizers 0.19.1, huggingface_hub 0.23.0)
    4.45.2  12.32 / 12.31 / 16.31    (tokenizers 0.20.3, huggingface_hub 0.26.2)
    4.46.0  14.32 / 12.31 / 14.31    (the same)
    5.23.0  10.35 / 12.35 / 14.35    (the project's own)
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

BATCH, TOKENS, VOCAB = 2, 256, 32_000


class _Live(TorchDispatchMode):
    """Bytes of live storages first seen as an op's output, and their peak."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key, n = st.data_ptr(), st.nbytes()
                if n == 0 or key in self._seen:
                    continue
                self._seen.add(key)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(st, self._free, key, n)
        return out

    def _free(self, key: int, n: int) -> None:
        self.live -= n
        self._seen.discard(key)


def measure(hold: bool) -> tuple[float, float]:
    """(forward peak, backward peak) in bytes per token x vocabulary element."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=1024,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS))
    elements = BATCH * TOKENS * VOCAB
    live = _Live()
    with live:
        output = model(input_ids=ids, labels=ids)
        loss = output.loss
        if not hold:
            del output
        forward = live.peak
        live.peak = live.live
        loss.backward()
    return forward / elements, live.peak / elements


def main() -> None:
    import transformers

    fwd, drop = measure(hold=False)
    _, hold = measure(hold=True)
    print(
        f"transformers {transformers.__version__}: forward {fwd:.2f}, backward "
        f"{drop:.2f} dropping the output, {hold:.2f} holding it (bytes per token x vocabulary "
        "element)"
    )


if __name__ == "__main__":
    main()
