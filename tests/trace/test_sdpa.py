"""One SDPA backend rule (vrambudget/core/formulas/sdpa.py) for the analytic walk of image
generation, the frameworks' emulated ``F.scaled_dot_product_attention`` and the built-in
builders: each backend's allocations on fake tensors against the walk and hand counts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.support.workloads import TINY_BF16, attention_dims
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
    # (216,000) with its isneginf mask (15,000) and row flags (300): 231,300; then scores freed
    # (156,000), probabilities in fp16 (30,000), the fp32 output (24,000), its fp16 cast
    # (12,000): 222,000
    (2, 3, 50, 20, 2, "math", 231_300, 12_000),
    # math in fp32 (head dim 18: not a multiple of 4): scaled q and k (2 x 21,600), the scores
    # (60,000) -> 103,200; k freed, softmax (60,000), its mask (15,000) and flags (300): 156,900
    (2, 3, 50, 18, 4, "math", 156_900, 21_600),
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


# ------------------------------------------------------------------ SDPA's math path ----

# (batch, heads, K/V heads, query tokens, keys, head dim, dtype): prefills in bf16 and fp32
# with grouped heads, bf16 without (a T4's bf16 call), a decode step and a head dim of 96.
MATH_SHAPES = [
    (1, 8, 2, 512, 512, 64, torch.bfloat16),
    (2, 8, 2, 300, 300, 64, torch.float32),
    (1, 8, 8, 256, 256, 64, torch.bfloat16),
    (3, 14, 2, 1, 700, 64, torch.float16),
    (2, 4, 1, 128, 128, 96, torch.float16),
]


@pytest.mark.parametrize(("b", "h", "kv", "sq", "sk", "d", "dtype"), MATH_SHAPES)
def test_the_math_path_allocates_what_the_analytic_tier_counts(
    b: int, h: int, kv: int, sq: int, sk: int, d: int, dtype: torch.dtype
) -> None:
    """Without a flash kernel (a T4), SDPA's emulation runs torch 2.13's math path op by op;
    its peak above q, k and v is :func:`math_path_bytes` to the byte (and torch's own math path
    on real CPU tensors, :func:`test_torchs_own_math_path_allocates_the_same`)."""
    from vrambudget.core.formulas.activations.inference import math_path_bytes

    e = torch.finfo(dtype).bits // 8
    assert sdpa_backend(half=e == 2, bf16=dtype == torch.bfloat16, head_dim=d, v_head_dim=d,
                        mask=False, gqa=kv < h, flash_hw=False) == "math"  # fmt: skip
    r = Recorder()
    with FakeTensorMode(), kernels.emulation(flash_hw=False), r.recording(), torch.no_grad():
        q = torch.empty(b, h, sq, d, dtype=dtype)
        k, v = torch.empty(b, kv, sk, d, dtype=dtype), torch.empty(b, kv, sk, d, dtype=dtype)
        base = r.peak_bytes = r.live_bytes
        kernels.emulated_sdpa(q, k, v, is_causal=sq > 1, enable_gqa=kv < h)
        assert r.peak_bytes - base == math_path_bytes(attention_dims(h, kv, d), b, sq, sk, e)


@pytest.mark.parametrize(("b", "h", "kv", "sq", "sk", "d", "dtype"), MATH_SHAPES)
def test_torchs_own_math_path_allocates_the_same(
    b: int, h: int, kv: int, sq: int, sk: int, d: int, dtype: torch.dtype
) -> None:
    """torch's ``_scaled_dot_product_attention_math`` on real CPU tensors -- the composite
    kernels CUDA runs too (``_safe_softmax`` is one CompositeExplicitAutograd kernel) -- peaks,
    by the profiler's memory events, at :func:`math_path_bytes` above its inputs, plus at most
    the 4-byte scalar ``_safe_softmax`` makes."""
    from torch.profiler import ProfilerActivity, profile

    from vrambudget.core.formulas.activations.inference import math_path_bytes

    q = torch.zeros(b, h, sq, d, dtype=dtype)
    k, v = torch.zeros(b, kv, sk, d, dtype=dtype), torch.zeros(b, kv, sk, d, dtype=dtype)
    math: Any = torch.ops.aten._scaled_dot_product_attention_math
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        math(q, k, v, None, 0.0, sq > 1, None, enable_gqa=kv < h)
    results = getattr(p.profiler, "kineto_results", None)
    if results is None:
        pytest.skip("this torch's profiler keeps no memory events")
    events = sorted(
        (e for e in results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    e_bytes = torch.finfo(dtype).bits // 8
    expected = math_path_bytes(attention_dims(h, kv, d), b, sq, sk, e_bytes)
    assert expected <= peak <= expected + 4


@pytest.mark.parametrize(("b", "h", "kv", "s", "d", "dtype"), [
    (1, 8, 2, 512, 64, torch.bfloat16), (2, 8, 2, 300, 64, torch.float32),
    (1, 8, 8, 256, 64, torch.bfloat16), (2, 14, 2, 128, 64, torch.float16),
])  # fmt: skip
def test_the_math_path_saves_and_backs_up_what_the_training_formulas_count(
    b: int, h: int, kv: int, s: int, d: int, dtype: torch.dtype
) -> None:
    """With autograd the math path keeps its fp32 scaled q, keys and values on every head and
    the fp32 probabilities (``training_saved``'s math items), and its softmax's backward holds
    8 B per score beyond them (``eager_softmax_backward_bytes``)."""
    from vrambudget.core.formulas.activations.training import (
        FULL_TRAINING,
        MATH_PROBABILITIES_PART,
        training_saved,
    )
    from vrambudget.core.resolve import resolve_model
    from vrambudget.core.spec import DimensionsModel

    r = Recorder()
    with FakeTensorMode(), kernels.emulation(flash_hw=False), r.recording():
        q = torch.empty(b, h, s, d, dtype=dtype, requires_grad=True)
        k = torch.empty(b, kv, s, d, dtype=dtype, requires_grad=True)
        v = torch.empty(b, kv, s, d, dtype=dtype, requires_grad=True)
        base = r.live_bytes
        out = kernels.emulated_sdpa(q, k, v, is_causal=True, enable_gqa=kv < h)
        kept = r.live_bytes - base - out.untyped_storage().nbytes()
        grad = torch.empty_like(out)
        start = r.peak_bytes = r.live_bytes
        out.backward(grad)
        backward = r.peak_bytes - start
    e = torch.finfo(dtype).bits // 8
    arch = resolve_model(
        DimensionsModel(
            hidden_size=h * d, num_layers=1, num_attention_heads=h, num_key_value_heads=kv,
            intermediate_size=4 * h * d, vocab_size=1024,
        )
    )  # fmt: skip
    ((layer, _),) = arch.layer_runs
    items = training_saved(
        layer, arch, attention_dims(h, kv, d), seq=s, batch=b, e=e, attention="math",
        dropout=False, sequence_parallel=False, drop_scores=False, trainable=FULL_TRAINING,
    )  # fmt: skip
    saved = items["q"] + items["k"] + items["v"] + items[MATH_PROBABILITIES_PART]
    assert kept == saved
    assert backward == b * h * s * s * 8


def _traced_on(
    gpu: str,
    spec: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    software: dict[str, Any] | None = None,
) -> Any:
    """(the trace's answer, its replay, the analytic answer, the SDPA backends it ran) of one
    workload run as transformers' own code on a catalog GPU."""
    import collections

    import msgspec

    from vrambudget.core.estimate import estimate
    from vrambudget.core.spec import BudgetRequest
    from vrambudget.trace.engine import trace_budget_with_replays

    seen: collections.Counter[tuple[str, bool]] = collections.Counter()

    def spy(**kw: Any) -> Any:
        backend = sdpa_backend(**kw)
        seen[(backend, kw["mask"])] += 1
        return backend

    monkeypatch.setattr(kernels, "sdpa_backend", spy)
    body = {
        "workloads": [spec],
        "method": "trace",
        "trace": {"code": "framework"},
        "device": {"source": "catalog", "id": gpu},
    }
    if software is not None:
        body["software"] = software
    request = msgspec.convert(body, BudgetRequest)
    traced, (replay,) = trace_budget_with_replays(request)
    analytic = estimate(request.workloads, request.device, software=request.software)
    return traced, replay, analytic, seen


def _line(budget: Any, component: str) -> int:
    d = budget.devices[budget.most_loaded]
    (line,) = [ln for ln in d.lines if ln.component.value == component]
    return int(line.bytes)


QWEN_FP16 = {"model": {"source": "preset", "id": "qwen2.5-0.5b"},
             "precision": {"weights": "fp16", "compute": "fp16"}}  # fmt: skip


def test_transformers_sdpa_on_a_t4_runs_the_math_path_the_budget_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Qwen 2.5 0.5B (14 query heads on 2 K/V heads) in fp16 under torch 2.13, transformers'
    own code traced on a T4: every SDPA call runs the math path, unmasked (the trace's batches
    are unpadded, so transformers passes ``is_causal`` and ``enable_gqa``). A 2,048-token
    prefill's activations are the analytic line's within 1% (traced 592.0 MB, budgeted 596.1
    MB on 2026-12-07); a 1,024-token training step's, at the phase the budget peaks in (the
    backward's start), within 0.1% (3,034.0 MB against 3,033.5 MB). Under torch 2.15 (the
    default) the memory-efficient kernel takes the grouped heads."""
    torch_2_13 = {"torch_version": "2.13.0"}
    infer = {"kind": "inference", **QWEN_FP16, "prompt_tokens": 2048, "generated_tokens": 4}
    traced, replay, analytic, seen = _traced_on("t4-16gb", infer, monkeypatch, torch_2_13)
    assert set(seen) == {("math", False)}
    budgeted = _line(analytic, "activations")
    assert abs(replay.component_peaks["activations"] - budgeted) <= 0.01 * budgeted
    train = {"kind": "training", **QWEN_FP16, "sequence_length": 1024}
    traced, replay, analytic, seen = _traced_on("t4-16gb", train, monkeypatch, torch_2_13)
    assert set(seen) == {("math", False)}
    budgeted = _line(analytic, "activations")
    assert abs(_line(traced, "activations") - budgeted) <= 0.001 * budgeted
    _, _, _, seen = _traced_on("t4-16gb", train, monkeypatch)
    assert set(seen) == {("mem_efficient", False)}


def test_transformers_sdpa_on_an_a10_runs_flash_unmasked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same training step on an A10 (sm86): FlashAttention with grouped heads, no mask --
    not the 4-D mask and repeated K/V that fake tensors made transformers build before the
    trace answered its two value tests as a GPU would (``unpadded_batches``)."""
    train = {"kind": "training", **QWEN_FP16, "sequence_length": 1024}
    _, _, _, seen = _traced_on("a10-24gb", train, monkeypatch)
    assert set(seen) == {("flash", False)}


@pytest.mark.parametrize(
    ("gpu", "prompt", "generated", "low", "high"),
    [
        # a 512-token prefill masked beyond the window: the math path over every key on a T4
        # (+1.5% on 2026-12-07), a fused kernel with the mask on an A10 (-1.3%)
        ("t4-16gb", 512, 4, 0.0, 0.05),
        ("a10-24gb", 512, 4, -0.05, 0.05),
        # 2,000 decode steps after a 64-token prompt: the sliding cache holds the window, and
        # one query per step reshapes its heads onto the K/V heads (pack_gqa): +9.0%
        ("t4-16gb", 64, 2000, 0.0, 0.10),
    ],
)
def test_sliding_window_inference_follows_transformers_on_each_gpu(
    gpu: str, prompt: int, generated: int, low: float, high: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = {"kind": "inference", **TINY_BF16, "batch_size": 4, "prompt_tokens": prompt,
            "generated_tokens": generated}  # fmt: skip
    _, replay, analytic, seen = _traced_on(gpu, spec, monkeypatch)
    assert {b for b, _ in seen} == ({"math"} if gpu == "t4-16gb" else {"mem_efficient"})
    traced = replay.component_peaks["activations"]
    assert low <= _line(analytic, "activations") / traced - 1 <= high


@pytest.mark.parametrize(("gpu", "attention"), [("a10-24gb", "eager"), ("t4-16gb", "sdpa")])
def test_sliding_window_training_scores_every_key(
    gpu: str, attention: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eager attention, and SDPA's math path (bf16 on a T4), multiply the queries by every key
    and mask the window: 4 x 1,024 tokens save 4 x 4 heads x 1,024^2 scores per layer, not
    1,024 x 128. The budget's last-layer softmax backward (``backward_attention``) keeps it on
    the safe side of the trace's peak: +6.9% eager, +7.3% math on 2026-12-07 (the layer's MLP
    tensors, freed by then, are still counted)."""
    spec = {"kind": "training", **TINY_BF16, "micro_batch_size": 4, "sequence_length": 1024,
            "attention": attention}  # fmt: skip
    _, replay, analytic, _ = _traced_on(gpu, spec, monkeypatch)
    traced = replay.component_peaks["activations"]
    assert 0.0 <= _line(analytic, "activations") / traced - 1 <= 0.10


def test_a_masked_sliding_window_saves_its_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """SDPA with the window's mask on an A10: transformers repeats K/V, and the
    memory-efficient kernel saves the mask converted to bf16 (4 x 1,024 x 1,024 x 2 B a
    layer). At the phase the budget peaks in, the trace holds the budgeted activations within
    1% (109.6 MB traced, 109.2 MB budgeted on 2026-12-07)."""
    spec = {"kind": "training", **TINY_BF16, "micro_batch_size": 4, "sequence_length": 1024}
    traced, _, analytic, seen = _traced_on("a10-24gb", spec, monkeypatch)
    assert set(seen) == {("mem_efficient", True)}
    parts = dict(
        (p.name, p.bytes)
        for ln in analytic.devices[0].lines
        if ln.component.value == "activations"
        for p in ln.parts
    )
    from vrambudget.core.formulas.activations.training import MASK_BIAS_PART

    assert parts[MASK_BIAS_PART] == 2 * 4 * 1024 * 1024 * 2
    budgeted = _line(analytic, "activations")
    assert abs(_line(traced, "activations") - budgeted) <= 0.01 * budgeted
