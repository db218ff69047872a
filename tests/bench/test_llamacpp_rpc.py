"""vrambudget's llama.cpp GPU compute buffers against llama.cpp's own scheduler and allocator run
with a CUDA-like device (bench/results/llamacpp_rpc.json, written by bench/llamacpp_rpc.py;
compared by bench/llamacpp_rpc_compare.py)."""

from __future__ import annotations

import statistics

from bench.llamacpp_rpc_compare import buffers
from vrambudget.core.serving.gguf.llamacpp import PARTIAL_OFFLOAD_SLACK

ROWS = buffers()
MiB = 1 << 20


def test_the_emulation_prints_cudas_single_gpu_logits_term():
    """The data itself: one device, every layer on it, flash attention, the f16 mask: the
    buffer is the logits and the head's input, 512 x (4 x 32,000 + 4 x 1,024) B = 64.50 MiB,
    the `4 n_vocab + 4 n_embd` per token that the published single-GPU CUDA logs print."""
    (b,) = [
        b
        for b in ROWS
        if b.model.startswith("l8_e1024")
        and b.settings
        == {
            "n_ctx": 4096,
            "flash_attn": True,
            "n_ubatch": 512,
            "n_batch": 512,
            "f32_mask": False,
            "ngl": "all",
            "devices": 1,
            "type_k": "f16",
            "type_v": "f16",
        }
    ]
    assert round(b.measured_mib, 2) == round(512 * (4 * 32000 + 4 * 1024) / MiB, 2) == 64.5


def test_compute_buffers_against_the_emulation():
    """1,184 device buffers (36 with llama-server's four outputs, 342 with the KV cache in host
    memory, 120 with --no-op-offload, 392 of two MoE models, 288 of them with --n-cpu-moe): the
    worst under-estimate is
    within the slack the partial-offload warning states (21.7% measured, 22% warned); 13 are
    more than 5% under, all with layers on the host (one of them under --no-kv-offload,
    6.6%); the median absolute error 8.6% (the rules err high on a second GPU, for quantized
    caches at long context and for --no-kv-offload's copies, taken at the largest hole
    measured)."""
    errs = [b.error for b in ROWS]
    assert len(ROWS) == 1184
    assert sum(b.settings.get("kv_offload") is False for b in ROWS) == 342
    moe = [b for b in ROWS if b.model.startswith("moe")]
    assert len(moe) == 392
    assert sum(b.settings.get("n_cpu_moe", 0) > 0 for b in moe) == 288
    assert min(errs) >= -PARTIAL_OFFLOAD_SLACK
    under = [b for b in ROWS if b.error < -0.05]
    assert len(under) <= 13
    assert all(b.settings["ngl"] != "all" for b in under)
    assert statistics.median(map(abs, errs)) <= 0.087
    # every layer on one GPU: never under by more than the print's rounding
    assert all(
        b.error >= -0.001 for b in ROWS if b.settings["ngl"] == "all" and b.settings["devices"] == 1
    )
    # --no-kv-offload with every layer offloaded: never under, one GPU or two
    assert all(
        b.error >= -0.001
        for b in ROWS
        if b.settings.get("kv_offload") is False and b.settings["ngl"] == "all"
    )
    # --no-op-offload: no copy on a GPU; never under but a second GPU's 0.7%
    nopo = [b for b in ROWS if b.settings.get("op_offload") is False]
    assert len(nopo) == 120 and min(b.error for b in nopo) >= -0.007
    # the MoE models, their experts in host memory or not, partial offload included: under
    # by at most 0.7% (a second GPU's small buffer without flash attention), 4.8% over in
    # median (an upper bound too, so that a rule counting too much shows)
    assert min(b.error for b in moe) >= -0.007
    assert statistics.median(b.error for b in moe) <= 0.05
    moved = [b for b in moe if b.settings.get("n_cpu_moe") and b.settings["devices"] == 2]
    assert statistics.median(b.error for b in moved) <= 0.16


def test_the_hosts_buffer_against_the_emulation():
    """The host's compute buffer where the rules for it changed: under --no-kv-offload (228
    loads: the new K and V rows stored there, and without flash attention the attention's f32
    scores), under --no-op-offload (112 loads: the host-resident weights' ops run there) and on
    the CPU alone with the f32 mask of builds before b9410 (24 loads): never
    under by more than the print's rounding (0.01 MiB)."""
    host = buffers(host=True)
    assert len(host) == 228 + 112 + 24
    assert all(b.measured_mib - b.estimated_mib <= 0.011 for b in host)
    alone = [b for b in host if b.settings["devices"] == 0]
    assert len(alone) == 24
    # the f32 mask's rules are exact on the CPU alone but where logits sit past the mask
    exact = [b for b in alone if abs(b.error) <= 0.001]
    assert len(exact) >= 20
