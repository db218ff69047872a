"""One SDPA backend rule (vrambudget/core/formulas/sdpa.py) for the analytic walk of image
generation, the frameworks' emulated ``F.scaled_dot_product_attention`` and the built-in
builders: each backend's allocations on fake tensors against the walk and hand counts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vrambudget.core.diffusion.blocks import sdpa
from vrambudget.core.diffusion.walk import Walk
from vrambudget.core.formulas.sdpa import sdpa_backend
from vrambudget.trace.events import ALLOC
from vrambudget.trace.recorder import Recorder
from vrambudget.workloads import kernels

_DTYPES = {2: torch.float16, 4: torch.float32}

# (b, heads, s, head dim, bytes, backend, peak above the inputs, output bytes), by hand:
CASES = [
    # flash: the output 2 x 50 x 3 x 64 x 2 = 38,400 + the lse 2 x 3 x 50 x 4 = 1,200
    (2, 3, 50, 64, 2, "flash", 39_600, 38_400),
    # memory-efficient (fp32): the output 76,800 + the lse padded to 64 rows: 2 x 3 x 64 x 4
    (2, 3, 50, 64, 4, "mem_efficient", 78_336, 76_800),
    # math (head dim 20: not a multiple of 8): fp32 copies of q, k, v (3 x 24,000), scaled q and
    # k (48,000), the scores 6 x 50 x 50 x 4 = 60,000 -> 180,000; k freed (156,000), softmax
    # (216,000), scores freed (156,000), probabilities in fp16 (30,000), the fp32 output
    # (24,000), its fp16 cast (12,000): 222,000
    (2, 3, 50, 20, 2, "math", 222_000, 12_000),
    # math in fp32 (head dim 18: not a multiple of 4): scaled q and k (2 x 21,600), the scores
    # (60,000) -> 103,200; k freed, softmax (60,000): 141,600
    (2, 3, 50, 18, 4, "math", 141_600, 21_600),
]


def _walked(b: int, h: int, s: int, d: int, e: int) -> tuple[int, int]:
    w = Walk()
    w.phase("test")
    out = sdpa(w, b, h, s, s, d, e)
    return w.peak, w.size(out)


def _traced(fn: Any, *shapes: tuple[int, ...], dtype: torch.dtype) -> tuple[int, int]:
    """(peak bytes above the inputs, output bytes) of ``fn`` on fake tensors of ``shapes``."""
    r = Recorder()
    with FakeTensorMode(), kernels.emulation(), r.recording(), torch.no_grad():
        inputs = [torch.empty(*s, dtype=dtype) for s in shapes]
        base = r.peak_bytes = r.live_bytes
        out = fn(*inputs)
        return r.peak_bytes - base, out.untyped_storage().nbytes()


@pytest.mark.parametrize(("b", "h", "s", "d", "e", "backend", "peak", "out"), CASES)
def test_the_walk_and_the_emulation_allocate_the_same(
    b: int, h: int, s: int, d: int, e: int, backend: str, peak: int, out: int
) -> None:
    assert sdpa_backend(half=e == 2, head_dim=d, v_head_dim=d, mask=False, gqa=False) == backend
    assert _walked(b, h, s, d, e) == (peak, out)
    shape = (b, h, s, d)
    # flash's rng_state (2 x int64 = 16 B) is traced; the walk leaves tensors that small out
    rng = 16 if backend == "flash" else 0
    traced = _traced(kernels.emulated_sdpa, shape, shape, shape, dtype=_DTYPES[e])
    assert traced == (peak + rng, out)


def test_the_builders_fp32_attention_is_the_memory_efficient_kernel() -> None:
    """fp32 has no flash kernel: the built-in builders get SDPA's memory-efficient backend, as
    the frameworks do. b 1, s 100, 2 heads of 16, fp32: forward the output (1 x 100 x 2 x 16 x
    4 = 12,800) and the lse padded to 128 rows (1 x 2 x 128 x 4 = 1,024); backward dq, dk, dv
    (12,800 each) and the fp32 delta (1 x 2 x 100 x 4 = 800) -- not FlashAttention-2's
    softmax_d (1,024) and dq_accum (1 x 128 x 2 x 32 x 4 = 32,768)."""
    r = Recorder()
    with FakeTensorMode(), kernels.emulation(), r.recording():
        q, k, v = (torch.empty(1, 100, 2, 16, requires_grad=True) for _ in range(3))
        start = len(r.trace.events)
        out = kernels.flash_attention(q, k, v, causal=False)
        middle = len(r.trace.events)
        grad = torch.empty_like(out)
        after_grad = len(r.trace.events)
        out.backward(grad)
        end = len(r.trace.events)
    forward = sorted(n for kind, _, n, _ in r.trace.events[start:middle] if kind == ALLOC)
    backward = sorted(n for kind, _, n, _ in r.trace.events[after_grad:end] if kind == ALLOC)
    assert forward == [1_024, 12_800]
    assert backward == [800, 12_800, 12_800, 12_800]


def test_the_builders_fp32_gqa_attention_is_math() -> None:
    """fp32 with fewer kv heads: neither flash (dtype) nor memory-efficient (no native GQA):
    the math path materializes the fp32 scores, 1 x 4 heads x 64 x 64 x 4 = 65,536 B."""
    r = Recorder()
    with FakeTensorMode(), kernels.emulation(), r.recording(), torch.no_grad():
        q = torch.empty(1, 64, 4, 16)
        k, v = torch.empty(1, 64, 2, 16), torch.empty(1, 64, 2, 16)
        start = len(r.trace.events)
        kernels.flash_attention(q, k, v, causal=False)
    sizes = [n for kind, _, n, _ in r.trace.events[start:] if kind == ALLOC]
    assert 65_536 in sizes
