"""The serving answers against published engine startup logs (research/engine_logs.py): what is
exact stays exact, and the errors that remain are pinned so they can only shrink."""

from __future__ import annotations

import statistics

import pytest

from research.engine_logs import checks, kv_errors_by_release

ROWS = checks()


def _errors(engine: str, quantity: str) -> list[float]:
    return [r.error for r in ROWS if (r.engine, r.quantity) == (engine, quantity)]


def _gguf(quantity: str, held_out_set: str = "") -> list:
    return [
        r
        for r in ROWS
        if r.engine in ("ollama", "llama_cpp")
        and r.quantity == quantity
        and r.held_out_set == held_out_set
    ]


@pytest.mark.parametrize("quantity", ["model buffer", "model buffer (CPU)", "KV buffer"])
def test_gguf_buffers_are_exact_to_the_printed_mib(quantity):
    rows = _gguf(quantity)
    assert len(rows) >= 6
    for r in rows:
        # llama.cpp prints MiB to two decimals
        assert abs(r.predicted - r.measured) <= 0.0051, r


def test_gguf_compute_buffers_never_fall_short_by_more_than_print_rounding():
    """18.0% and 15.0%: the single-GPU Llama 3.1 70B logs of Ollama 0.13.5 (6.3% on 0.15.2's
    Llama 3.2 1B; 3.0% on b8179's Qwen 2.5 3B), builds whose f32 KQ mask the estimate takes as
    copied to the GPU, as b7780's and Ollama 0.21 / 0.22's logs print it; these show no copy
    there (where the scheduler puts the mask's cast depends on the graph's order). The two-GPU
    logs: the second GPU's 346.55 MiB within print rounding, the pipeline's first GPU 5.1%
    over (its f32 mask copies), the two-GPU eager 70B 1.7% over (the copies of its f32 mask,
    which the emulation shows and these logs do not)."""
    rows = _gguf("compute buffer")
    assert all(r.predicted - r.measured >= -0.06 for r in rows), rows
    assert max(abs(r.error) for r in rows) <= 0.181
    assert all(abs(r.error) <= 0.001 for r in rows if r.measured == 346.55)
    assert all(abs(r.error) <= 0.052 for r in rows if r.measured in (316.04, 688.02, 688.03))


# Held-out set H (research/engine_logs.py HELD_OUT_H): 11 llama.cpp and Ollama logs on one
# NVIDIA GPU, collected after the GGUF rules were fixed. Where llama.cpp places the layers
# itself (every layer offloaded, or llama-server's -ngl) the model and KV buffers are exact.
_OLLAMA_PARTIAL = (
    "ollama-tfg-01110-llama31-70b-q4km-a40-partial-32k",
    "ollama-audiointel-0212-llama31-8b-q4km-rtx4050laptop-partial",
)
_GPU_LAYERS_NONE = (
    "llamacpp-alpy-b5285-qwen3-4b-q6k-1660ti-ngl0",
    "llamacpp-alpy-b5285-qwen3-8b-q4km-1660ti-ngl0",
)


@pytest.mark.parametrize("quantity", ["model buffer", "KV buffer", "model buffer (CPU)"])
def test_held_out_set_h_buffers_exact_where_llama_cpp_places_the_layers(quantity):
    rows = [r for r in _gguf(quantity, "H") if r.log not in _OLLAMA_PARTIAL + _GPU_LAYERS_NONE]
    assert len(rows) == 7
    for r in rows:
        assert abs(r.predicted - r.measured) <= 0.0051, r


def test_held_out_set_h_what_the_rules_miss_is_pinned():
    """Ollama's runners before v0.30 and llama.cpp before ggml-org/llama.cpp#18148 offload the
    last N repeating layers and keep the output layer on the host (the rules read at first gave
    it the GPU first): with that placement both partial Ollama logs are exact. A mapped model's
    host buffer is printed as the span of the file its host tensors lie in (40,543 MiB, the
    whole file, for the 70B with its first and last tensors on the host), not their sum. With no
    layer on the GPU (b5285) the host buffer is 9.7% over and 3.1% under the recipe's Q6_K /
    Q4_K_M mixes of Qwen3. Pinned so that they can only shrink."""
    rows = {(r.log, r.quantity): r.error for r in ROWS if r.held_out_set == "H"}
    by_mib = {(r.log, r.quantity): r.predicted - r.measured for r in ROWS}
    for log in _OLLAMA_PARTIAL:
        # llama.cpp prints MiB to two decimals
        assert (
            abs(by_mib[log, "KV buffer"]) <= 0.0051 and abs(by_mib[log, "model buffer"]) <= 0.0051
        )
    tfg, laptop = _OLLAMA_PARTIAL
    assert rows[tfg, "model buffer (CPU)"] >= -0.767  # the file's span, 40,543 MiB printed
    assert abs(by_mib[laptop, "model buffer (CPU)"]) <= 0.0051
    q6k_4b, q4km_8b = (rows[k, "model buffer (CPU)"] for k in _GPU_LAYERS_NONE)
    assert abs(q6k_4b) <= 0.097 and abs(q4km_8b) <= 0.031


# each set-H compute buffer's error, pinned: (log, lowest, highest)
_SET_H_COMPUTE = {
    "llamacpp-fsd-b7896-qwen25-14b-q4km-3090-np4-32k": (0.0, 0.274),
    "ollama-angela-0177-qwen25-14b-q4km-t4-6k-ub256": (0.0, 0.105),
    "llamacpp-rusteze-b7780-qwen25-coder-7b-q8-rtx5080-32k-fa": (-0.0001, 0.0001),
    "ollama-agenticmalgen-0221-qwen25-coder-32b-q4km-a100-40gb-32k": (-0.0001, 0.0001),
    "ollama-robustness-0210-llama31-8b-q4km-a100-80gb-128k": (-0.0001, 0.0001),
    "ollama-materialagent-060-llama31-8b-q4km-v100-np4": (-0.108, 0.0),
    "ollama-audiointel-0212-llama31-8b-q4km-rtx4050laptop-partial": (-0.0001, 0.0001),
    "ollama-tfg-01110-llama31-70b-q4km-a40-partial-32k": (-0.001, 0.0),
    "ollama-tfg-03010-llama-server-qwen25-coder-32b-q4km-a40-partial-4k": (0.0, 0.058),
    "llamacpp-alpy-b5285-qwen3-4b-q6k-1660ti-ngl0": (-0.0001, 0.0001),
    "llamacpp-alpy-b5285-qwen3-8b-q4km-1660ti-ngl0": (-0.0001, 0.0001),
}


def test_held_out_set_h_compute_buffers_are_pinned():
    """The compute buffer on one GPU. Set H was read before the rules were rewritten from
    llama.cpp's own scheduler (bench/llamacpp_rpc.py), so these are not a blind test any more
    (docs/ACCURACY.md says so); the rules fit no number on them. Exact to the 0.01 MiB:

    - builds before b9410 with flash attention at long context, the f32 mask copied to the
      GPU: b7780's Qwen 2.5 7B at 32K cells (the logits past the copy's hole), Ollama 0.22.1's
      Qwen 2.5 32B at 32K, Ollama 0.21.0's Llama 3.1 8B at 128K (6 n_kv + 16 n_embd);
    - the head on the host (Ollama 0.21.2's partial offload) and no layer on the GPU (b5285):
      the head's weight copied to the GPU beside the logits and the normed input.

    Over: b7896's four-slot Qwen 2.5 14B (27.4%) and Ollama 0.17.7 (10.4%) show no mask copy
    on the GPU; Ollama 0.30.10's llama-server (b9672: the f16 mask, the logits of its one
    slot) 5.7%, a host layer's largest weight copied beside an FFN matmul's input and output.
    Under: Ollama 0.6.0 ran its one V100 as a pipeline ("pipeline parallelism enabled
    (n_copies=4)"), which the rules give two or more GPUs only: 10.7% (72 MiB)."""
    rows = {r.log: r.error for r in _gguf("compute buffer", "H")}
    assert set(rows) == set(_SET_H_COMPUTE)
    for log, (low, high) in _SET_H_COMPUTE.items():
        assert low - 1e-9 <= rows[log] <= high + 1e-9, (log, rows[log])


def test_held_out_set_i_buffers():
    """Set I (research/engine_logs.py HELD_OUT_I), collected after the rules were rewritten:
    five checked logs. Model and KV buffers exact to the printed MiB, the output layer on the
    host under partial offload (llama-cpp-python of 2025-09, Ollama 0.5.11, 0.6.1, 0.19.0).
    Compute buffers: the head's copy exact on all four partial logs (Mistral 7B at 20 of 33
    layers; Qwen 2.5 32B shapes at 33, 43 and 49 of 65, one at 32K cells with flash
    attention), 16.0% over on Ollama 0.5.11's four-slot full offload without flash attention.
    One detail was settled with these logs in view: the emulation suggested a layer's weight
    copy beside the head's, which all nine such published logs lack (docs/ACCURACY.md)."""
    rows = [r for r in ROWS if r.held_out_set == "I"]
    assert len({r.log for r in rows}) == 5
    for r in rows:
        if r.quantity in ("model buffer", "KV buffer"):
            assert abs(r.predicted - r.measured) <= 0.0051, r
    compute = sorted(r.error for r in rows if r.quantity == "compute buffer")
    assert len(compute) == 5
    assert all(abs(e) <= 0.0001 for e in compute[:4]) and 0 < compute[4] <= 0.16


def test_vllm_weights_within_target():
    errs = _errors("vllm", "weights")
    assert len(errs) >= 10
    assert statistics.median(abs(e) for e in errs) <= 0.005  # target: 0.5%
    # ratchet: 1.11%, set F's Qwen3-4B fine-tune on vLLM 0.30 (V2 model runner, through
    # Xinference, WSL2): 0.085 GiB more printed than the parameters and rotary table (its log:
    # "falling back to device memory for UVA buffers", a likely source not counted)
    assert max(abs(e) for e in errs) <= 0.012


def test_vllm_kv_tokens_ratchet():
    errs = _errors("vllm", "KV tokens")
    assert len(errs) == 43
    assert statistics.median(abs(e) for e in errs) <= 0.0095  # 0.92%
    # 36.46%: set G's 0.29.0 launch on a WSL2 desktop GPU, over (see
    # test_vllm_kv_tokens_targets); next, 15.24%: set F's first RTX 3060 launch, the safe side
    assert max(abs(e) for e in errs) <= 0.365
    assert sorted(abs(e) for e in errs)[-2] <= 0.153


def test_vllm_kv_tokens_per_release():
    """Median KV-token error per vLLM minor release <= 3% (the target), every release with logs.
    0.19 had one log (an RTX 3090 under WSL, 3.99% low) until set F added six: 0.59%. The 0.22
    and 0.26 launches ran with 64 and 16 sequences and capture 30 and 12 CUDA graphs instead of
    102: with the graph memory per graph, 0.65% and 0.48% (2.5% and 7.7% when the default 102
    graphs were subtracted). 0.31 has set G's five A40 launches: 1.18%."""
    by = kv_errors_by_release(ROWS)
    assert len(by) >= 10 and "0.31" in by
    assert sum(map(len, by.values())) == 43
    for minor, errs in by.items():
        med = statistics.median(abs(e) for e in errs)
        assert med <= 0.03, (minor, errs)


def test_vllm_cuda_graph_memory_diagnostic_is_pinned():
    """The graph memory the logs print after capture ("Graph capturing finished ... took") is a
    diagnostic of the per-graph rule, not a KV check: 46.7% median, 138.8% largest (set F's
    0.30.0 launch through Xinference and set G's 0.29.0 launch of the same model: 0.33 GiB
    printed), pinned so it can only shrink. Set G's 0.31.0 launches (+76% .. +84%) print the
    profiling capture that precedes the KV sizing; the median was 45.3% before them. Set J's
    0.10.0 launch on an A100 (2.49 GiB printed, 0.66 counted, like set F's A100 launches)
    moved it from 58.9% to 59.5%. Set F's three A100 launches name their driver (535, before
    R550): with the driver rule they count 2.64 GiB against 2.44 printed (+8.2%, was -67.7%),
    which brought the median to 46.7%; set K's L40S launch (+16.1%) to 45.9%."""
    errs = _errors("vllm", "CUDA graphs (capture)")
    assert len(errs) >= 20
    assert statistics.median(abs(e) for e in errs) <= 0.468
    assert max(abs(e) for e in errs) <= 1.39


def test_vllm_kv_tokens_held_out_sets_b_to_j():
    """Sets B, C, E, F, G, J and K (15 + 3 + 4 + 6 + 6 + 1 + 1 checked launches collected after
    the vLLM rules were fixed, research/engine_logs.py HELD_OUT_B, _C, _E, _F, _G, _J and _K): the
    median within
    the KV-token target; the largest are set G's WSL2 desktop launch and set F's first RTX 3060
    launch (test_vllm_kv_tokens_targets). The sort-path sampler rule was found on set B
    (docs/ACCURACY.md says so); it is counted from vLLM's and torch's source, nothing fitted.
    Set C (Qwen3-4B on an H100 and an RTX A6000, vLLM 0.10.2 and 0.11.2) came after every rule:
    -0.2% .. -0.6%. Set G's five 0.31.0 launches on an A40, the first logs of that release:
    -1.2% .. +2.2%. Set J's 0.10.0 launch of Qwen3-14B on an A100 80GB (2026-12-07): -0.7%.
    Set K's 0.16.0 launch of an AWQ Llama 3 70B at TP2 on two L40S (2026-12-07): -1.0%."""
    errs = [r.error for r in ROWS if r.fresh and (r.engine, r.quantity) == ("vllm", "KV tokens")]
    assert len(errs) == 36
    assert statistics.median(abs(e) for e in errs) <= 0.009  # 0.76% (target 3%)
    assert max(abs(e) for e in errs) <= 0.365  # 36.46% (target 10%)
    g = [r.error for r in ROWS if "synapse" in r.log and r.quantity == "KV tokens"]
    assert len(g) == 5 and max(abs(e) for e in g) <= 0.023


@pytest.mark.xfail(
    strict=True,
    reason="vLLM held-out KV tokens: median 0.9% (met), but two launches on desktop GPUs shared "
    "with other processes miss the 10%: +36.5% on set G's 0.29.0 launch under WSL2 (an RTX "
    "5060 Ti with about 1.1 GiB held by others, vLLM's non-torch memory 0.95 GiB against the "
    "estimate's, 1.45 GiB of KV cache left) and -15.2% on set F's first RTX 3060 launch, whose "
    "printed numbers break vLLM's own arithmetic (8.03 GiB of KV cache beside 1.12 GiB of "
    "weights under a 0.75 x 11.63 = 8.72 GiB budget) and which ran out of memory right after "
    "(docs/ACCURACY.md)",
)
def test_vllm_kv_tokens_targets():
    """Every vLLM log together: <= 3% median, <= 10% largest. vLLM 0.10.1's tensor-parallel A100
    launches print that custom all-reduce is off (no GPU P2P; one pair across two nodes): with
    ``parallelism.peer_access`` false, as their lines say, 1.5-4.0% low (9-26% with the NVLink
    fabric's cost)."""
    errs = _errors("vllm", "KV tokens")
    assert statistics.median(abs(e) for e in errs) <= 0.03
    assert max(abs(e) for e in errs) <= 0.10


def test_vllm_band_low_end_never_promises_more_kv_than_the_engine_printed():
    """kv_cache_tokens_band on the held-out logs: every printed KV size is at or above the band's
    low end (the low end is what to size for), and all 43 fall inside."""
    band = [r for r in ROWS if r.quantity == "KV tokens inside the band" and r.engine == "vllm"]
    assert len(band) == 43
    assert sum(r.predicted for r in band) == 43
    for r in ROWS:
        if r.engine == "vllm" and r.quantity == "KV tokens":
            log_band = next(b for b in band if b.log == r.log)
            assert log_band.predicted == 1.0 or r.measured > r.predicted, r


def test_sglang_max_running_requests_exact():
    """SGLang's scheduler limit follows from the printed pool and context as each release
    computes it: 0.4.0 - 0.4.6 keep one request slot more than the estimate (the 2025-02 and
    2025-03 launches printed 2049), 0.4.7 on do not (0.4.9's printed 2048); 0.5.18's
    208,651 tokens over a 40,960 context give int(208,651 / 40,960 x 512) = 2,608."""
    from research.engine_logs import HELD_OUT_C, _by_id
    from vrambudget.core.serving.releases import engine_release
    from vrambudget.core.serving.sglang import max_running_requests, sglang_release

    logs = _by_id()
    versions = {
        "sglang-jerryzsj-r1distill-qwen7b-rtx3090": "0.4.2",
        "sglang-didierdurand-qwq32b-4xl4-tp4": "0.4.3.post4",
        **{k: w["engine_version"] for k, (e, w, _) in HELD_OUT_C.items() if e == "sglang"},
    }
    for log, version in versions.items():
        m = logs[log]["measured"]
        release = sglang_release(engine_release("sglang", version).modelled)
        got = max_running_requests(release, m["max_total_num_tokens"], m["context_len"], None)
        assert got == m["max_running_requests"], (log, got)
    rows = [r for r in ROWS if (r.engine, r.quantity) == ("sglang", "max running requests")]
    assert len(rows) == 5


def test_sglang_kv_tokens_ratchet():
    """Held out, pinned so it can only shrink. The start-up context is the GPU's own (the line
    in its resident threads, tests/core/formulas/test_cuda_context_line.py), no longer vLLM
    0.19's H100 value (0.51 GiB) on every GPU: 4 x L4 (PCIe), whose start took 0.19 GiB before
    the distributed start, went from -10.7% to -2.9% (the smallest measured GPU's 0.25 GiB
    context, the floor of the line, and the 0.17 GiB PCIe distributed term); set D's 4 x RTX
    4090 TP4 launch of Qwen3-14B from -0.8% to +0.1%; the H100 stays +0.6% (its line value is
    within 0.2% of vLLM's). The two desktop launches are re-created as their sources state
    the host (Windows with WSL2 / Docker Desktop: `device.desktop_session` "windows"), whose
    hold comes from published nvidia-smi readings, none of them these logs
    (research/desktop_hold.py): the RTX 3090 under WSL2 from +9.8% (a bare card) to -2.7%, the
    RTX 4090 under Docker Desktop from +16.6% to +1.6% (+0.7% and +0.1% given the printed
    free memory)."""
    errs = _errors("sglang", "KV tokens")
    assert len(errs) == 5
    assert statistics.median(abs(e) for e in errs) <= 0.0156  # 1.55%
    assert max(errs) <= 0.0161 and min(errs) >= -0.0291


def test_sglang_desktop_band_holds_the_printed_pool():
    """Where the hold is assumed, SGLang's kv_cache_tokens_band (the pools beside the two ends
    of the readings' band) holds the pool each desktop launch printed."""
    band = [r for r in ROWS if r.quantity == "KV tokens inside the band" and r.engine == "sglang"]
    assert {r.log for r in band} == {
        "sglang-jerryzsj-r1distill-qwen7b-rtx3090",
        "sglang-maxuhl98-llama31-8b-rtx4090-tp1",
    }
    assert all(r.predicted == 1.0 for r in band)


def test_sglang_weights_are_the_reserved_segments_of_the_loaded_weights():
    """SGLang's "Load weight end ... mem usage" (free memory before less after, the cache
    emptied): the tensors as SGLang fuses them and the FP32 rotary table, as the caching
    allocator reserves them (vrambudget/core/serving/load.py, the replay vLLM's weights line
    uses, read as the segments left once the cache is emptied). Each log's printed
    value, two decimals of GiB: Llama 3.1 8B on an RTX 4090 15.02 (its projections are whole
    2 MiB multiples: no rounding); Qwen3-14B over 4 RTX 4090s 7.08 (6.90 GiB of tensors, 4.5
    MiB of segment rounding a layer); Qwen2.5-32B's shapes over 4 L4s 15.54 (15.32, 3.5 MiB a
    layer over 64); the Qwen3 0.6B reranker on an H100 1.18 (its 1-10 MiB projections share 20
    MiB segments). Within 0.5%: the printed value's own rounding is up to 0.42% at 1.18."""
    rows = {r.log: r for r in ROWS if (r.engine, r.quantity) == ("sglang", "weights")}
    assert len(rows) == 4
    assert abs(rows["sglang-maxuhl98-llama31-8b-rtx4090-tp1"].error) < 0.001
    assert abs(rows["sglang-didierdurand-qwq32b-4xl4-tp4"].error) < 0.001
    assert abs(rows["sglang-ugyhybnb-qwen3-14b-4x4090-tp4-mfs0.8"].error) < 0.0015
    assert all(abs(r.error) <= 0.005 for r in rows.values())


def test_sglang_kv_tokens_targets():
    """Issue 16's targets for SGLang's held-out logs: KV tokens within 3% at the median and 10%
    at most (the desktop launches with their stated host)."""
    errs = _errors("sglang", "KV tokens")
    assert statistics.median(abs(e) for e in errs) <= 0.03
    assert max(abs(e) for e in errs) <= 0.10


def test_sglang_pool_rule_given_the_printed_free_memory():
    """Where the log prints the free memory before loading (or its weights' usage and what was
    left after), that memory in place of the modelled start leaves the pool rule's own error:
    +0.7% (RTX 3090), +0.1% (RTX 4090), +0.3% (H100) with the weights as the allocator
    reserves them (+2.6%, +0.1%, +0.6% with the tensors' sum and SGLang's FP32 rotary table;
    +3.7%, +1.4%, +0.6% without the table), and +0.03% on 4 x RTX 4090 (whose log printed more
    free memory than the modelled start left while that start took vLLM's H100 context, and
    so had no row). The 4 x L4 log still prints more free memory than the modelled start
    leaves (the smallest measured GPU's context is its floor), so it has none. The desktops'
    +9.8% and +16.6% on a bare card are the start-up footprint (the desktop's memory), not the
    pool. A
    diagnostic, not a test of the model: the printed free memory comes from the log."""
    from research.engine_logs import PRINTED_FREE

    errs = _errors("sglang", PRINTED_FREE)
    assert len(errs) == 4
    assert statistics.median(abs(e) for e in errs) <= 0.0035
    assert max(abs(e) for e in errs) <= 0.0075


def test_ngram_speculative_decoding_changes_nothing_the_logs_print():
    """Set E: the same Qwen3-8B launch on a 48 GB RTX 4090 with and without n-gram speculative
    decoding, vLLM 0.18.0 and 0.29.0. 0.18 prints the same weights, KV memory and tokens; 0.29
    0.03 GiB less KV memory with n-gram (which runs on the V1 model runner, not V2). The
    estimate is the same for both, 0.6-0.8% low."""
    by_log = {(r.log, r.quantity): r for r in ROWS if "vllmlab" in r.log}
    assert len({log for log, _ in by_log}) == 4
    for v in ("018", "029"):
        base = by_log[(f"vllm-vllmlab-qwen3-8b-4090-48g-v{v}-base", "KV tokens")]
        ngram = by_log[(f"vllm-vllmlab-qwen3-8b-4090-48g-v{v}-ngram4", "KV tokens")]
        assert base.predicted == ngram.predicted
        for r in (base, ngram):
            assert -0.01 <= r.error <= 0, r
