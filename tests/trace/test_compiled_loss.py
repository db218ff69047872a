"""What torch.compile's chunked loss saves for backward, on the real torch: the fact behind the
``loss_compiled`` stack behaviour (vrambudget/core/stack.py, research/stack_behaviours.md 2b).

torchtune's ``compile_loss`` compiles ``CEWithChunkedOutputLoss.compute_cross_entropy``,
``F.cross_entropy(logits.float(), labels, reduction="sum")``. Eager, autograd keeps the fp32
log-softmax of the chunk; compiled, inductor's partitioner keeps the low-precision chunk and
two fp32 numbers per token, and recomputes the rest in backward. The partition does not depend
on the device, so the CPU build shows what a GPU run keeps."""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(
        shutil.which("cc") is None and shutil.which("gcc") is None,
        reason="inductor's CPU code generation needs a C compiler",
    ),
    # torch's own import of torch.jit inside inductor, not this project's code.
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


def _saved(fn, x, y) -> list[tuple[object, tuple[int, ...]]]:
    seen: list[tuple[object, tuple[int, ...]]] = []

    def pack(t):
        seen.append((t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(x, y)
    loss.backward()
    return seen


def test_a_compiled_chunked_cross_entropy_keeps_the_chunk_not_its_fp32_log_softmax() -> None:
    import torch.nn.functional as F

    def compute_cross_entropy(logits, labels):  # torchtune 0.6.1, verbatim but ignore_index
        return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")

    tokens, vocab = 64, 1000
    x = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, vocab, (tokens,))
    eager = _saved(compute_cross_entropy, x, y)
    compiled = _saved(torch.compile(compute_cross_entropy, dynamic=False), x, y)
    fp32_full = (torch.float32, (tokens, vocab))
    assert fp32_full in eager
    assert fp32_full not in compiled
    assert (torch.bfloat16, (tokens, vocab)) in compiled
    per_token_fp32 = [s for s in compiled if s == (torch.float32, (tokens, 1))]
    assert len(per_token_fp32) == 2  # the row max and the log of the sum of exponentials
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
