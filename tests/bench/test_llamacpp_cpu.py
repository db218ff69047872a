"""vrambudget's llama.cpp buffers against 345 real llama.cpp loads on the CPU backend
(bench/results/llamacpp_cpu.json, written by bench/llamacpp_cpu.py; compared by
bench/llamacpp_compare.py)."""

from __future__ import annotations

from bench.llamacpp_compare import load

ROWS = load()


def test_kv_buffers_are_exact():
    kv = [r.kv_mib for r in ROWS if r.kv_mib]
    assert len(kv) >= 300
    assert all(abs(p - m) <= 0.0051 for p, m in kv)  # printed to 0.01 MiB (15.375 -> 15.38)


def test_model_buffers_are_the_tensor_bytes():
    """The one miss is a memory-mapped Q4_0 model that the CPU backend also repacks
    (CPU_REPACK holds a second copy): CPU-only, not a GPU buffer."""
    model = [r.model_mib for r in ROWS if r.model_mib]
    off = [pm for pm in model if abs(pm[0] - pm[1]) > 0.0051]
    assert len(model) >= 300 and len(off) <= 1


def test_compute_buffers():
    by_class: dict[str, list[float]] = {}
    for r in ROWS:
        if r.compute_mib:
            p, m = r.compute_mib
            by_class.setdefault(r.klass, []).append((p - m) / m)
    exact = by_class["f16/f16 cache, flash attention on"]
    assert len(exact) >= 100 and max(abs(e) for e in exact) < 1e-4
    assert max(abs(e) for e in by_class["f16/f16 cache, flash attention off"]) <= 0.045
    for klass, errs in by_class.items():
        if "q" in klass.split("/")[0]:
            # quantized caches: the budget errs high, never low
            assert min(errs) >= -1e-4, klass
