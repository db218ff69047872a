"""llama.cpp / Ollama deployments of GGUF models: the ggml type table, the quantization recipe,
layer placement, KV and compute buffers (exact numbers computed by hand below), the release
rules, and the answers through the service's entry points."""

from __future__ import annotations

import math

import msgspec
import pytest

from vrambudget.core.catalog import gpu as catalog_gpu
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import fit
from vrambudget.core.resolve import resolve_model
from vrambudget.core.result import GGUFDetails
from vrambudget.core.serving.gguf.engine import gguf_account
from vrambudget.core.serving.gguf.llamacpp import (
    LlamaSettings,
    compute_buffer,
    kv_cells,
    kv_layer_bytes,
    layer_devices,
    llama_account,
    pipeline_parallel,
)
from vrambudget.core.serving.gguf.ollama_estimate import ollama_estimate
from vrambudget.core.serving.gguf.recipe import file_type_default
from vrambudget.core.serving.gguf.tensors import gguf_tensors
from vrambudget.core.serving.gguf.types import BLOCKS, row_bytes
from vrambudget.core.serving.releases import engine_release
from vrambudget.core.spec import BudgetRequest, FitRequest, GGUFOptions, PresetModel

MiB = 1 << 20
LLAMA8B = PresetModel(id="llama-3.1-8b")


def _settings(**kw: object) -> LlamaSettings:
    base: dict[str, object] = dict(
        n_ctx=8192,
        n_ctx_seq=8192,
        n_parallel=1,
        kv_unified=False,
        n_gpu_layers=33,
        flash_attn=True,
        n_ubatch=512,
        n_batch=2048,
        type_k="f16",
        type_v="f16",
        devices=1,
        splits=(1.0,),
        kv_offload=True,
    )
    base.update(kw)
    return LlamaSettings(**base)  # type: ignore[arg-type]


def test_type_table_matches_the_gguf_package():
    gguf = pytest.importorskip("gguf")
    theirs = {t.name: v for t, v in gguf.GGML_QUANT_SIZES.items()}
    for name, blocks in BLOCKS.items():
        if name == "Q8_1":
            # never stored in files; gguf 0.19.0 says 40 bytes, ggml's block_q8_1 is 36
            # (ggml/src/ggml-common.h static_assert)
            assert blocks == (32, 36)
            continue
        assert theirs[name] == blocks, name


def test_row_bytes_refuse_partial_blocks():
    assert row_bytes("Q4_K", 4096) == 16 * 144
    assert row_bytes("Q8_0", 4096) == 128 * 34
    with pytest.raises(ValueError):
        row_bytes("Q4_K", 4000)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def test_llama_8b_q4_k_m_by_hand():
    """Q4_K_M: Q4_K everywhere, Q6_K for the output head and for attn_v / ffn_down of the
    layers use_more_bits picks (16 of 32), F32 norms; the token embeddings stay Q4_K."""
    arch = resolve_model(LLAMA8B)
    tensors = {t.name: t for t in gguf_tensors(arch, "Q4_K_M")}
    more = [i for i in range(32) if _use_more_bits(i, 32)]
    assert len(more) == 16
    for i in range(32):
        want = "Q6_K" if i in more else "Q4_K"
        assert tensors[f"blk.{i}.attn_v.weight"].type == want
        assert tensors[f"blk.{i}.ffn_down.weight"].type == want
        assert tensors[f"blk.{i}.attn_q.weight"].type == "Q4_K"
    assert tensors["output.weight"].type == "Q6_K"
    assert tensors["token_embd.weight"].type == "Q4_K"
    # bytes: a Q4_K block is 256 elements in 144 B, Q6_K 256 in 210 B
    q4 = lambda n: n // 256 * 144  # noqa: E731
    q6 = lambda n: n // 256 * 210  # noqa: E731
    embd = q4(128256 * 4096)
    head = q6(128256 * 4096)
    norms = 32 * 2 * 4096 * 4 + 4096 * 4
    layer = q4(4096 * 4096) * 2 + q4(1024 * 4096) + q4(14336 * 4096) * 2
    v_down = {True: q6(1024 * 4096) + q6(4096 * 14336), False: q4(1024 * 4096) + q4(4096 * 14336)}
    total = embd + head + norms + sum(layer + v_down[i in more] for i in range(32))
    assert sum(t.nbytes for t in tensors.values()) == total == 4_912_898_048
    assert embd == 295_501_824  # llama.cpp's CPU_Mapped 281.81 MiB (the input layer)


def test_file_type_defaults_and_fallback():
    assert file_type_default("IQ2_M") == "IQ2_S"
    assert file_type_default("Q3_K_L") == "Q3_K"
    # Qwen2.5-0.5B's 896-wide rows are not whole 256-element K-quant blocks: its attention
    # projections fall back from Q4_K to Q5_0; ffn_down's 4864-wide rows (19 blocks) keep Q4_K
    qwen = {
        t.name: t.type
        for t in gguf_tensors(resolve_model(PresetModel(id="qwen2.5-0.5b")), "Q4_K_M")
    }
    assert qwen["blk.1.attn_q.weight"] == "Q5_0"
    assert qwen["blk.4.ffn_down.weight"] == "Q4_K"  # layer 4 of 24: not use_more_bits


def test_tied_embeddings_take_the_output_rule():
    gemma = resolve_model(PresetModel(id="gemma-2-9b"))
    embd = next(t for t in gguf_tensors(gemma, "Q4_K_M") if t.name == "token_embd.weight")
    assert embd.type == "Q6_K"


def test_layer_placement_output_first():
    """i_gpu_start = n_layer + 1 - ngl: the output layer is offloaded first, then the last
    repeating layers (src/llama-model.cpp:1589-1612)."""
    assert layer_devices(32, 1, (1.0,)) == (-1,) * 32 + (0,)
    assert layer_devices(32, 33, (1.0,)) == (0,) * 33
    assert layer_devices(32, 0, (1.0,)) == (-1,) * 33
    # two equal GPUs, everything offloaded: 33 layer indices at x = i / 33; x < 0.5 -> GPU 0
    two = layer_devices(32, 33, (1.0, 1.0))
    assert two.count(0) == 17 and two.count(1) == 16 and two[-1] == 1
    # 3:1 split
    assert layer_devices(32, 33, (3.0, 1.0)).count(0) == 25


def test_kv_buffer_by_hand():
    arch = resolve_model(LLAMA8B)
    s = _settings()
    cells = kv_cells(arch, s)
    # 8192 cells x 32 layers x (1024 K + 1024 V) x 2 B
    assert sum(kv_layer_bytes(arch, s, c) for c in cells) == 8192 * 32 * 2048 * 2 == 1 << 30
    q8 = _settings(type_k="q8_0", type_v="q8_0")
    assert sum(kv_layer_bytes(arch, q8, c) for c in cells) == 8192 * 32 * 2 * (1024 // 32 * 34)
    # sliding-window layers: min(n_ctx, window x 1 + n_ubatch) padded to 256
    gemma = resolve_model(PresetModel(id="gemma-2-9b"))
    g_cells = kv_cells(gemma, _settings(n_ctx=8192))
    assert set(g_cells) == {8192, 4096 + 512}


def test_compute_buffer_by_hand():
    arch = resolve_model(LLAMA8B)
    s = _settings()
    cells = kv_cells(arch, s)
    every = tuple(range(32))
    # the CPU backend (fitted on 345 real loads): with flash attention the logits dominate
    assert compute_buffer(arch, s, every, True, cells, gpu=False) == 512 * (
        4 * 128256 + 8 * 4096 + 4
    )
    # without flash attention the scores of 32 heads over 8192 cells dominate
    off = _settings(flash_attn=False)
    per = 8192 * (4 * 32 + 4) + 20 * 4096 + 8 * 1024 + 20
    assert compute_buffer(arch, off, every, True, cells, gpu=False) == 512 * per
    # split over several GPUs a GPU keeps more alive: logits 4 V + 24 E on the output GPU,
    # 12 n_ff + 36 E + 2 n_kv for layers with flash attention, 4 H n_kv + 12 n_ff + 2 E
    # without (measured at n_kv 4096; here n_kv is 8192)
    two = _settings(devices=2, splits=(1.0, 1.0))
    two_off = _settings(devices=2, splits=(1.0, 1.0), flash_attn=False)
    split = compute_buffer(arch, two, (0, 1), False, cells, pipeline=False)
    assert split == 512 * (12 * 14336 + 36 * 4096 + 2 * 8192)
    assert compute_buffer(arch, two_off, (0, 1), False, cells, pipeline=False) == 512 * (
        4 * 32 * 8192 + 12 * 14336 + 2 * 4096
    )
    assert compute_buffer(arch, two, every, True, cells, pipeline=False) == 512 * (
        4 * 128256 + 24 * 4096
    )
    # under the pipeline the four copies of each split's f16 mask grow with n_kv: the CPU
    # terms + 16 E + 8 n_kv where that is larger (equal to the measured terms at n_kv 4096)
    assert compute_buffer(arch, two, (0, 1), False, cells) == 512 * (
        2 * 8192 + 16 * 4096 + 12 * 14336 + 28 + 16 * 4096 + 8 * 8192
    )
    assert compute_buffer(arch, two, every, True, cells) == 512 * (
        4 * 128256 + 20 * 4096 + 8 * 8192
    )
    # one GPU runs no pipeline: the CPU terms with flash attention (the two-GPU term without)
    alone = compute_buffer(arch, s, every, True, cells)
    assert alone == 512 * (4 * 128256 + 8 * 4096 + 4)
    assert compute_buffer(arch, s, (0, 1), False, cells) == 512 * (
        2 * 8192 + 16 * 4096 + 12 * 14336 + 28
    )
    assert compute_buffer(arch, off, (0, 1), False, cells) == 512 * (
        4 * 32 * 8192 + 12 * 14336 + 2 * 4096
    )


def test_pipeline_parallelism_needs_two_gpus_and_everything_offloaded():
    arch = resolve_model(LLAMA8B)  # 32 layers, the output layer the 33rd
    one = llama_account(arch, "Q4_K_M", _settings())
    assert not pipeline_parallel(one.settings, 32)
    assert one.devices[0].compute_bytes == 512 * (4 * 128256 + 8 * 4096 + 4)
    two = _settings(devices=2, splits=(1.0, 1.0))
    assert pipeline_parallel(two, 32)
    a = llama_account(arch, "Q4_K_M", two)
    assert a.devices[0].compute_bytes == 512 * (
        2 * 8192 + 16 * 4096 + 12 * 14336 + 28 + 16 * 4096 + 8 * 8192
    )
    assert a.devices[1].compute_bytes == 512 * (4 * 128256 + 20 * 4096 + 8 * 8192)
    # two slots of 4,096 cells each (no unified cache): each stream's mask spans its own cells
    slots = _settings(devices=2, splits=(1.0, 1.0), n_parallel=2, n_ctx_seq=4096)
    b = llama_account(arch, "Q4_K_M", slots)
    assert b.devices[1].compute_bytes == 512 * (4 * 128256 + 20 * 4096 + 8 * 4096)
    # two GPUs without the pipeline (partial offload, or the KV cache on the host) keep the
    # two-GPU terms as measured: no log says what they hold
    for no_pipe in (
        _settings(devices=2, splits=(1.0, 1.0), n_gpu_layers=32),
        _settings(devices=2, splits=(1.0, 1.0), kv_offload=False),
    ):
        assert not pipeline_parallel(no_pipe, 32)
        b = llama_account(arch, "Q4_K_M", no_pipe)
        assert all(d.layers for d in b.devices)
        assert b.devices[0].compute_bytes == 512 * (12 * 14336 + 36 * 4096 + 2 * 8192)
        last = b.devices[-1]
        assert last.compute_bytes == 512 * (
            4 * 128256 + 24 * 4096 if last.output else 12 * 14336 + 36 * 4096 + 2 * 8192
        )


def test_host_compute_buffer_grows_with_the_context():
    """Fully offloaded, the host's compute buffer holds the input layer's rows and the graph
    inputs: T x (4 n_embd + 4 n_kv), as Ollama's logs of Llama 3.1 70B on one L40S print it
    (24.01 MiB at 4,096 cells, 32.01 MiB at 8,192); over a two-GPU pipeline the larger of
    twice that and 16 n_embd x T (its two logs at 4,096 cells: 48.05 and 64.04 MiB)."""
    arch = resolve_model(PresetModel(id="llama-3.1-70b"))
    for n_ctx, mib in ((4096, 24), (8192, 32), (65536, 144)):
        s = _settings(n_ctx=n_ctx, n_ctx_seq=n_ctx, n_gpu_layers=81)
        a = llama_account(arch, "Q4_K_M", s)
        assert a.host_compute_bytes == 512 * (4 * 8192 + 4 * n_ctx) == mib * MiB
    pipe = _settings(n_gpu_layers=81, n_ctx=4096, n_ctx_seq=4096, devices=2, splits=(1.0, 1.0))
    assert llama_account(arch, "Q4_K_M", pipe).host_compute_bytes == 512 * 16 * 8192 == 64 * MiB
    long = _settings(n_gpu_layers=81, devices=2, splits=(1.0, 1.0))  # 8,192 cells
    assert llama_account(arch, "Q4_K_M", long).host_compute_bytes == 2 * 32 * MiB


def test_account_splits_weights_and_keeps_embeddings_on_the_host():
    arch = resolve_model(LLAMA8B)
    a = llama_account(arch, "Q4_K_M", _settings())
    (d,) = a.devices
    assert a.host_weights_bytes == 295_501_824
    assert d.weights_bytes == 4_912_898_048 - 295_501_824
    assert d.kv_bytes == 1 << 30 and a.host_kv_bytes == 0
    partial = llama_account(arch, "Q4_K_M", _settings(n_gpu_layers=17))
    # the output layer and the last 16 repeating layers on the GPU
    assert partial.devices[0].layers == tuple(range(16, 32)) and partial.devices[0].output
    assert partial.host_kv_bytes == 16 * 8192 * 2048 * 2


def test_ollama_graph_and_kv_by_hand():
    """llm/memory.go + GraphSize (v0.12.10) for Llama 3.1 8B at num_ctx 4096, one slot, f16."""
    arch = resolve_model(LLAMA8B)
    layers = tuple([200_000_000] * 32)
    est = ollama_estimate(arch, layers, 400_000_000, (80 << 30,), 4096, 1, 512, "f16", False)
    assert est.kv == 32 * 4096 * (128 + 128) * 8 * 2
    batch = 512
    full = max(4 * batch * (1 + 4 * 4096 + 4096 * 33), 4 * batch * (4096 + 128256))
    assert est.graph_full == full == 310_380_544
    assert est.layers == 33
    # 457 MiB minimum + one layer's buffer + 32 layers + output + the full graph
    per_layer = 200_000_000 + 4096 * 256 * 8 * 2
    assert est.required_partial == 457 * MiB + per_layer * 33 + 400_000_000 + full


def test_release_mapping_and_refusals():
    r = engine_release("llama_cpp", "b7000")
    assert r.modelled == "b6327" and r.note and "b6327" in r.note
    assert engine_release("llama_cpp", "b9999").modelled == "b9460"
    assert engine_release("llama_cpp", "b9420").modelled == "b9410"
    assert engine_release("llama_cpp", "b9000").modelled == "b7815"
    assert engine_release("ollama", "0.13.5").modelled == "0.12.11"
    with pytest.raises(InvalidWorkload, match="older than modelled"):
        engine_release("llama_cpp", "b3000")
    with pytest.raises(InvalidWorkload, match="build number"):
        engine_release("llama_cpp", "0.3.1")
    with pytest.raises(InvalidWorkload, match="older than modelled"):
        engine_release("ollama", "0.5.1")


def _budget(workload: dict, gpu: str = "rtx-4090-24gb"):
    body = {"workloads": [workload], "device": {"source": "catalog", "id": gpu}}
    req = msgspec.convert(body, BudgetRequest)
    return estimate(req.workloads, req.device, None, None, req.software)


def test_llama_cpp_budget_lines_are_the_buffers():
    b = _budget(
        {
            "kind": "llm_serving",
            "engine": "llama_cpp",
            "engine_version": "b6500",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "gguf": {"n_ctx": 8192},
        }
    )
    s = b.serving
    assert s is not None and s.would_start and s.modelled_version == "b6327"
    assert isinstance(s.details, GGUFDetails)
    lines = {ln.component.value: ln.bytes for ln in b.devices[0].lines}
    assert lines["weights"] == 4_912_898_048 - 295_501_824
    assert lines["kv_cache"] == s.kv_cache_pool_bytes == 1 << 30
    # one GPU, no pipeline, a build before b9410: the logits past the hole the f32 mask's
    # copy leaves (4 V + 12 E + 4 n_kv per token)
    assert lines["activations"] == 512 * (4 * 128256 + 12 * 4096 + 4 * 8192) == 304_611_328
    assert b.devices[0].total_bytes == b.device.memory_total_bytes  # type: ignore[union-attr]
    assert "-c 8192" in s.launch and "-ngl 33" in s.launch and "--fit" not in s.launch
    assert b.disk.total_bytes == 4_912_898_048


def test_fit_era_reduces_context_and_says_so():
    """llama.cpp with --fit (b7815 on): -c unset means the trained context (131072 for Llama
    3.1 8B, 16 GiB of f16 KV); on a 16 GB card the context is reduced until 1 GiB stays free."""
    b = _budget(
        {
            "kind": "llm_serving",
            "engine": "llama_cpp",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
        },
        "rtx-4080-16gb",
    )
    s = b.serving
    assert s is not None and s.would_start
    d = s.details
    assert isinstance(d, GGUFDetails)
    assert d.fitted and "context reduced from 131072" in d.fitted
    used = sum(ln.bytes for ln in b.devices[0].lines if ln.component.value != "headroom")
    assert b.device.memory_total_bytes - used >= 1 << 30  # type: ignore[union-attr]
    assert 4096 <= d.n_ctx < 131072


def test_ollama_too_big_for_one_gpu_offloads_layers():
    b = _budget(
        {
            "kind": "llm_serving",
            "engine": "ollama",
            "engine_version": "0.10.0",
            "model": {"source": "preset", "id": "llama-3.1-70b"},
        }
    )
    s = b.serving
    d = s.details  # type: ignore[union-attr]
    assert d.ollama_estimate is not None and d.ollama_estimate.layers_offload < 81
    assert d.n_gpu_layers == d.ollama_estimate.layers_offload
    assert any("run on the CPU" in w for w in b.warnings)


def _gguf_workload(engine: str, version: str, model: str, **gguf: object) -> dict:
    return {
        "kind": "llm_serving",
        "engine": engine,
        "engine_version": version,
        "model": {"source": "preset", "id": model},
        "gguf": gguf,
    }


def _llama_cpp(model: str, gpu: str, version: str = "b6500", **gguf: object):
    return _budget(_gguf_workload("llama_cpp", version, model, **gguf), gpu)


def test_layer_placement_before_the_output_first_change():
    """Before ggml-org/llama.cpp#18148 (and in Ollama's runners before v0.30) -ngl N offloads
    the last N repeating layers; the output layer only with N > n_layer."""
    assert layer_devices(32, 20, (1.0,), output_first=False) == (-1,) * 12 + (0,) * 20 + (-1,)
    assert layer_devices(32, 32, (1.0,), output_first=False) == (0,) * 32 + (-1,)
    assert layer_devices(32, 33, (1.0,), output_first=False) == (0,) * 33
    assert layer_devices(32, 20, (1.0,)) == (-1,) * 13 + (0,) * 20


_HEAD_Q6K = 128256 * 4096 * 210 // 256  # Llama 3.1 8B's Q6_K head: 430,940,160 B


def test_head_on_the_host_is_copied_to_the_first_gpu_by_hand():
    """offload_op: the head's matmul over a 512-token micro-batch runs on the GPU with its
    weight copied there, beside the f32 logits and the normed input, 4 x 512 x (4,096 +
    128,256) B. Ollama 0.21.2 with 31 of 32 repeating layers and the head on the host printed
    669.48 MiB: 701,997,056 B."""
    arch = resolve_model(LLAMA8B)
    s = _settings(n_ctx=4096, n_ctx_seq=4096, n_gpu_layers=31, output_first=False)
    a = llama_account(arch, "Q4_K_M", s)
    assert not a.devices[0].output and len(a.devices[0].layers) == 31
    assert a.devices[0].compute_bytes == 4 * 512 * (4096 + 128256) + _HEAD_Q6K == 701_997_056
    # no layer on the GPU: the same copy (b5285 printed the rule for Qwen3 4B and 8B)
    none = llama_account(arch, "Q4_K_M", _settings(n_ctx=4096, n_ctx_seq=4096, n_gpu_layers=0))
    assert none.devices[0].compute_bytes == 701_997_056
    # a micro-batch below 32 tokens runs on the host: no copy, no buffer
    small = _settings(n_ctx=4096, n_ctx_seq=4096, n_gpu_layers=0, n_ubatch=16, n_batch=16)
    assert llama_account(arch, "Q4_K_M", small).devices[0].compute_bytes == 0


def test_host_layer_attention_copies_its_kv_by_hand():
    """A host layer's attention follows its projections onto the GPU and copies the layer's
    whole K and V there, beside the f16 mask and 8 n_embd per token; the allocator's hole
    takes 1.6 x the copy (KV_COPY_SLACK). Llama 3.1 8B at 65,536 cells with 20 of 33 layers
    on the GPU (the head among them): one layer's K + V is 65,536 x 1,024 x 2 x 2 B."""
    arch = resolve_model(LLAMA8B)
    s = _settings(n_ctx=65536, n_ctx_seq=65536, n_gpu_layers=20)
    a = llama_account(arch, "Q4_K_M", s)
    kv = 65536 * 1024 * 2 * 2
    want = -(-kv * 16 // 10) + 512 * (2 * 65536 + 8 * 4096)
    assert want == 513_382_810
    assert a.devices[0].compute_bytes == want


def test_f32_mask_before_b9410_by_hand():
    """Builds before b9410 copy the f32 mask to the GPU and cast it there: Qwen 2.5 7B at
    32,768 cells places the logits past the freed copy (4 V + 12 E + 4 n_kv per token; b7780
    printed 382.01 MiB); Llama 3.1 8B at 131,072 cells holds the copy beside its cast at the
    attention (6 n_kv + 16 E; Ollama 0.21.0 printed 416.01 MiB). From b9410 the mask is f16:
    the logits' 4 V + 8 E + 4."""
    qwen = resolve_model(PresetModel(id="qwen2.5-7b"))
    old = _settings(n_ctx=32768, n_ctx_seq=32768, n_gpu_layers=29, f16_mask=False)
    qwen_old = llama_account(qwen, "Q8_0", old).devices[0].compute_bytes
    assert qwen_old == 512 * (4 * 152064 + 12 * 3584 + 4 * 32768)
    assert abs(qwen_old / MiB - 382.01) <= 0.011  # printed to 0.01 MiB
    new = _settings(n_ctx=32768, n_ctx_seq=32768, n_gpu_layers=29)
    assert llama_account(qwen, "Q8_0", new).devices[0].compute_bytes == 512 * (
        4 * 152064 + 8 * 3584 + 4
    )
    llama = resolve_model(LLAMA8B)
    long = _settings(n_ctx=131072, n_ctx_seq=131072, f16_mask=False)
    llama_old = llama_account(llama, "Q4_K_M", long).devices[0].compute_bytes
    assert llama_old == 512 * (6 * 131072 + 16 * 4096)
    assert abs(llama_old / MiB - 416.01) <= 0.011


def test_no_kv_offload_with_flash_attention_copies_each_layers_kv_by_hand():
    """``--no-kv-offload`` keeps the cache in host memory, but flash attention still runs on
    the GPU: the scheduler copies the layer's whole K and V into its compute buffer, beside the
    mask, 8 n_embd and the FFN's 12 n_ff per token, x 1.06 (NO_KV_OFFLOAD_SLACK) for the
    allocator. Llama 3.1 8B at 65,536 cells: K + V of one layer is 65,536 x 1,024 x 2 x 2 B.
    The host holds the cache and the new rows' store beside the mask: 2 n_kv + 8 n_embd + 20
    per token (the f16 mask; 4 n_kv for the f32 mask before b9410)."""
    arch = resolve_model(LLAMA8B)
    s = _settings(n_ctx=65536, n_ctx_seq=65536, kv_offload=False)
    a = llama_account(arch, "Q4_K_M", s)
    kv = 65536 * 1024 * 2 * 2
    want = math.ceil(kv * 1.06) + 512 * (2 * 65536 + 8 * 4096 + 12 * 14336)
    assert want == 456_508_048
    assert a.devices[0].compute_bytes == want
    assert a.devices[0].kv_bytes == 0 and a.host_kv_bytes == 32 * kv
    # the f16 mask: the graph inputs' 4 n_embd + 4 n_kv (the rule of every full offload) is
    # larger; the f32 mask before b9410: the store's 4 n_kv + 8 n_embd + 20
    assert a.host_compute_bytes == 512 * (4 * 4096 + 4 * 65536)
    f32 = _settings(n_ctx=65536, n_ctx_seq=65536, kv_offload=False, f16_mask=False)
    assert llama_account(arch, "Q4_K_M", f32).host_compute_bytes == 512 * (
        4 * 65536 + 8 * 4096 + 20
    )
    # with the cache on the GPU the same load holds the CPU terms (the logits dominate)
    on = llama_account(arch, "Q4_K_M", _settings(n_ctx=65536, n_ctx_seq=65536))
    assert on.devices[0].compute_bytes == 512 * (4 * 128256 + 8 * 4096 + 4)


def test_no_kv_offload_without_flash_attention_runs_the_attention_on_the_host_by_hand():
    """Without flash attention llama.cpp pins the attention's output to the CPU when the cache
    is on the host (src/llama-graph.cpp:2752-2755): the f32 scores of 32 heads over 8,192 cells
    move from the GPU's buffer to the host's; the GPU keeps the FFN and the logits."""
    arch = resolve_model(LLAMA8B)
    s = _settings(flash_attn=False, kv_offload=False)
    a = llama_account(arch, "Q4_K_M", s)
    assert a.devices[0].compute_bytes == 512 * (4 * 128256 + 8 * 4096 + 4)
    # a GPU without the head: the FFN alone (no scores, no mask)
    cells = kv_cells(arch, s)
    assert compute_buffer(arch, s, (0, 1), False, cells) == 512 * (16 * 4096 + 12 * 14336 + 28)
    assert a.host_compute_bytes == 512 * (8192 * (4 * 32 + 4) + 20 * 4096 + 8 * 1024 + 20)
    on = llama_account(arch, "Q4_K_M", _settings(flash_attn=False))
    assert on.devices[0].compute_bytes == 512 * (4 * 32 * 8192 + 12 * 14336 + 2 * 4096)
    assert on.host_compute_bytes == 512 * (4 * 4096 + 4 * 8192)


def test_f32_mask_on_the_cpu_before_b9410_by_hand():
    """On the CPU alone, builds before b9410 hold the f32 mask beside the FFN's intermediates
    (2 n_kv more than the f16 mask) and beside its f16 cast at the attention (6 n_kv + 20
    n_embd + 20), where that is larger: Llama 3.1 8B at 131,072 cells."""
    arch = resolve_model(LLAMA8B)
    every = tuple(range(32))
    s = _settings(n_ctx=131072, n_ctx_seq=131072, f16_mask=False, n_gpu_layers=0, devices=0)
    cells = kv_cells(arch, s)
    assert compute_buffer(arch, s, every, False, cells, gpu=False) == 512 * (
        6 * 131072 + 20 * 4096 + 20
    )
    short = _settings(n_ctx=4096, n_ctx_seq=4096, f16_mask=False, n_gpu_layers=0, devices=0)
    assert compute_buffer(arch, short, every, False, kv_cells(arch, short), gpu=False) == 512 * (
        4 * 4096 + 16 * 4096 + 12 * 14336 + 28
    )


def test_llama_server_reserves_its_slots_logits_from_b9460_by_hand():
    """From b9460 llama-server reserves the logits of n_parallel outputs (4 slots by default),
    not of the micro-batch's 512 tokens: Llama 3.1 8B at 8,192 unified cells, the layers'
    flash-attention term 512 x (2 x 8,192 + 16 x 4,096 + 12 x 14,336 + 28) B now exceeds the
    logits' 4 x 128,256 x 4 + 512 x (8 x 4,096 + 4) B. b9410 keeps every token's logits."""
    new = _llama_cpp("llama-3.1-8b", "rtx-4090-24gb", "b9460", n_ctx=8192)
    gpu = new.serving.details.buffers[0]  # type: ignore[union-attr]
    layers = 512 * (2 * 8192 + 16 * 4096 + 12 * 14336 + 28)
    assert layers > 4 * 128256 * 4 + 512 * (8 * 4096 + 4)
    assert gpu.compute_buffer_bytes == layers == 130_037_760
    old = _llama_cpp("llama-3.1-8b", "rtx-4090-24gb", "b9410", n_ctx=8192)
    gpu = old.serving.details.buffers[0]  # type: ignore[union-attr]
    assert gpu.compute_buffer_bytes == 512 * (4 * 128256 + 8 * 4096 + 4)


def test_the_logits_rows_by_hand():
    """The output layer alone: every token's logits (4 V + 8 E + 4 B per token), or llama-
    server's four outputs from b9460: 4 V x 4 B beside 512 x (8 E + 4) B."""
    arch = resolve_model(LLAMA8B)
    cells = (8192,) * 32
    every = compute_buffer(arch, _settings(), (), True, cells)
    assert every == 512 * (4 * 128256 + 8 * 4096 + 4)
    four = compute_buffer(arch, _settings(n_outputs=4), (), True, cells)
    assert four == 4 * 128256 * 4 + 512 * (8 * 4096 + 4)


def _gguf_settings(engine: str, version: str, **gguf: object) -> LlamaSettings:
    body = {
        "workloads": [_gguf_workload(engine, version, "llama-3.1-8b", n_ctx=8192, **gguf)],
        "device": {"source": "catalog", "id": "rtx-4090-24gb"},
    }
    w = msgspec.convert(body, BudgetRequest).workloads[0]
    return gguf_account(w, resolve_model(LLAMA8B), 24 << 30, 0, version).settings  # type: ignore[arg-type]


def test_the_logits_rows_follow_the_release():
    """llama-server reserves min(n_batch, n_parallel) outputs from b9460 (4 slots when -np is
    auto; Ollama 0.30.1 on passes -np num_parallel); b9410 and Ollama 0.30.0 (b9452) every
    token of the micro-batch."""
    assert _gguf_settings("llama_cpp", "b9460").n_outputs == 4
    assert _gguf_settings("llama_cpp", "b9460", n_parallel=2).n_outputs == 2
    assert _gguf_settings("llama_cpp", "b9410").n_outputs is None
    assert _gguf_settings("ollama", "0.30.1", n_parallel=2).n_outputs == 2
    assert _gguf_settings("ollama", "0.30.0").n_outputs is None


def test_no_layer_on_the_gpu_with_few_outputs_by_hand():
    """With llama-server's four outputs the head's matmul (a batch of 4) stays on the host:
    no copy of the head; the GPU runs the host layers' ops, so it holds their per-token terms
    (2 n_kv + 16 E + 12 F + 28 with flash attention at 8,192 cells)."""
    arch = resolve_model(LLAMA8B)
    s = _settings(n_gpu_layers=0, n_outputs=4)
    a = llama_account(arch, "Q4_K_M", s)
    assert a.devices[0].compute_bytes == 512 * (2 * 8192 + 16 * 4096 + 12 * 14336 + 28)
    every = llama_account(arch, "Q4_K_M", _settings(n_gpu_layers=0))
    assert every.devices[0].compute_bytes == 4 * 512 * (4096 + 128256) + _HEAD_Q6K


def test_quantized_cache_adds_the_kernels_f16_copies_by_hand():
    """Flash attention over a q8_0 cache on a CUDA GPU allocates f16 copies of the layer's K
    and V with its output (32,768 x 2 x (1,024 + 1,024) B for Llama 3.1 8B), beside the
    layer's per-token terms (2 n_kv + 16 E + 12 F + 28); the logits stage stays apart."""
    arch = resolve_model(LLAMA8B)
    s = _settings(n_ctx=32768, n_ctx_seq=32768, type_k="q8_0", type_v="q8_0")
    layer = 512 * (2 * 32768 + 16 * 4096 + 12 * 14336 + 28) + 32768 * 2 * 2048
    logits = 512 * (4 * 128256 + 8 * 4096 + 4)
    assert layer > logits
    assert llama_account(arch, "Q4_K_M", s).devices[0].compute_bytes == layer
    # only the quantized one is copied: a q8_0 K beside an f16 V
    k_only = _settings(n_ctx=32768, n_ctx_seq=32768, type_k="q8_0", type_v="f16")
    assert llama_account(arch, "Q4_K_M", k_only).devices[0].compute_bytes == max(
        512 * (2 * 32768 + 16 * 4096 + 12 * 14336 + 28) + 32768 * 2 * 1024, logits
    )


def test_ollama_partial_offload_end_to_end():
    """Ollama 0.12.11 (before v0.30) with 31 GPU layers: 31 repeating layers on the GPU, the
    last repeating layer and the head on the host, the head's Q6_K weight copied to the GPU's
    compute buffer (669.48 MiB, as Ollama 0.21.2 printed for this layout). The copies are
    counted; the newest allocator measured up to 22% more, which the warning states in MiB:
    0.22 x 701,997,056 B = 147 MiB."""
    b = _budget(_gguf_workload("ollama", "0.12.11", "llama-3.1-8b", n_ctx=4096, n_gpu_layers=31))
    d = b.serving.details  # type: ignore[union-attr]
    gpu, host = d.buffers
    assert (gpu.device, gpu.layers, gpu.output_layer) == ("CUDA0", 31, False)
    assert (host.layers, host.output_layer) == (1, True)
    assert gpu.compute_buffer_bytes == 701_997_056
    (w,) = [w for w in b.warnings if "offload_op" in w]
    assert "up to 22% more, about 147 MiB here" in w
    full = _llama_cpp("llama-3.1-8b", "rtx-4090-24gb", n_ctx=8192)
    assert not [w for w in full.warnings if "offload_op" in w]


_MOE = {  # the shapes of bench/llamacpp_rpc.py's second MoE model, vocabulary 32,000
    "source": "dimensions",
    "hidden_size": 2048,
    "num_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "intermediate_size": 6144,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "moe": {"num_experts": 32, "experts_per_token": 8, "expert_intermediate_size": 768},
}
_EXPERT_Q8 = 2048 * 768 * 32 * 34 // 32  # one Q8_0 expert tensor: 53,477,376 B


def test_n_cpu_moe_keeps_experts_in_host_memory_by_hand():
    """--n-cpu-moe 2: the three expert tensors of layers 0 and 1 move to host memory; with a
    512-token micro-batch their matmuls run on the GPU, which reserves one expert tensor (the
    down projection, its 768-element rows padded by 256 elements of Q8_0: 272 B) beside the
    router's outputs and the selected experts' intermediates, 8 k n_ff_exp + 4 k n_embd + 4
    n_embd + 24 per token, and the f16 mask's 2 n_kv (bench/llamacpp_rpc.py printed 111.01 MiB
    for these shapes at 4,096 cells and 123.01 at 16,384, where the mask no longer fits a hole:
    the estimate, 115.01 and 127.01, counts it at both). Without it the GPU's buffer is the MoE
    FFN's 2 n_kv + 16 n_embd + 12 k n_ff_exp + 4 k n_embd + 28 per token."""
    w = {
        "kind": "llm_serving",
        "engine": "llama_cpp",
        "model": _MOE,
        "gguf": {"file_type": "Q8_0", "n_ctx": 4096, "n_parallel": 1, "n_gpu_layers": 5},
    }
    base = _budget(w).serving.details  # type: ignore[union-attr]
    w["gguf"] = {**w["gguf"], "n_cpu_moe": 2}  # type: ignore[dict-item]
    b = _budget(w)
    moved = b.serving.details  # type: ignore[union-attr]
    gpu0, gpu1 = base.buffers[0], moved.buffers[0]
    assert gpu0.model_buffer_bytes - gpu1.model_buffer_bytes == 2 * 3 * _EXPERT_Q8
    assert gpu0.compute_buffer_bytes == 512 * (2 * 4096 + 16 * 2048 + 12 * 6144 + 4 * 8 * 2048 + 28)
    want = _EXPERT_Q8 + 272 + 512 * (8 * 6144 + 4 * 8 * 2048 + 4 * 2048 + 24 + 2 * 4096)
    assert want == 120_598_800
    assert gpu1.compute_buffer_bytes == want
    assert "--n-cpu-moe 2 --fit off" in b.serving.launch  # type: ignore[union-attr]
    assert any("--n-cpu-moe" in x for x in b.warnings)
    w["gguf"] = {**w["gguf"], "n_cpu_moe": 4}  # type: ignore[dict-item]
    assert "--cpu-moe --fit off" in _budget(w).serving.launch  # type: ignore[union-attr]


_QWEN3_235B = {  # Qwen/Qwen3-235B-A22B config.json
    "source": "dimensions",
    "hidden_size": 4096,
    "num_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "moe": {"num_experts": 128, "experts_per_token": 8, "expert_intermediate_size": 1536},
}


_QWEN3_30B = {"source": "preset", "id": "qwen3-30b-a3b"}


@pytest.mark.parametrize(
    ("model", "file_type", "gguf", "kv_mib", "compute_mib", "host_mib", "over"),
    [
        # ikawrakow/ik_llama.cpp discussion #357 (ubergarm, 2025-04-30): mainline b5192,
        # -ngl 99 -ot "blk.(13-93).ffn=CPU" -fa -c 32768, one RTX A6000 (the log the f32 mask's
        # term beside the copy was read from)
        (_QWEN3_235B, "Q8_0", {"n_ctx": 32768, "n_cpu_moe": 81}, (6016.00,), (1024.00,), 72.01, 0),
        # ik_llama.cpp PR #370 (ubergarm, 2025-05-04): b5274, blocks 14-93's ffn on the CPU,
        # a q8_0 cache
        (
            _QWEN3_235B,
            "Q8_0",
            {"n_ctx": 32768, "n_cpu_moe": 80, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
            (3196.00,),
            (1024.00,),
            72.01,
            0,
        ),
        # discussion #357 (AesSedai, 2025-05-03): b5269, blocks 5-93's ffn on the CPU, -c
        # 16384, a q8_0 cache, one RTX 3090: its mask fitted a hole the estimate does not count
        (
            _QWEN3_235B,
            "Q6_K",
            {"n_ctx": 16384, "n_cpu_moe": 89, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
            (1598.00,),
            (774.00,),
            40.01,
            0.042,
        ),
        # ik_llama.cpp issue #514 (mtcl, 2025-06-10): b5622 llama-cli, -ot ".ffn_.*_exps.=CPU",
        # an RTX 4090 and an RTX 5090 (12 and 36 + the output layer, as its KV buffers say), no
        # flash attention: the scores, not an expert copy, set both GPUs' buffers; no pipeline
        # (tensor overrides turn it off)
        (
            _QWEN3_30B,
            "Q4_K_M",
            {
                "n_ctx": 16384,
                "n_cpu_moe": 48,
                "flash_attn": "off",
                "devices": 2,
                "tensor_split": [12, 37],
            },
            (384.00, 1152.00),
            (1080.00, 1080.00),
            36.01,
            0.014,
        ),
    ],
)
def test_published_logs_with_experts_on_the_cpu(
    model, file_type, gguf, kv_mib, compute_mib, host_mib, over
):
    """MoE models with their experts in host memory (-ot, before --n-cpu-moe existed; the
    Qwen3-235B logs' patterns also move the router and norms, 2 MiB a layer, which their model
    buffers hold on the host): the KV buffers exact, each GPU's compute buffer within the stated
    over-estimate (one expert tensor, 816 MiB at Q8_0 and 630 at Q6_K, beside the expert
    matmul's per-token terms and, in builds before b9410, the f32 mask copy's hole), and the
    host's compute buffer to the 0.01 MiB."""
    w = {
        "kind": "llm_serving",
        "engine": "llama_cpp",
        "engine_version": "b6327",
        "model": model,
        "gguf": {
            "file_type": file_type,
            "n_parallel": 1,
            "n_gpu_layers": 999,
            "flash_attn": "on",
            "n_ubatch": 512,
            **gguf,
        },
    }
    *gpus, host = _budget(w, "h200-sxm-141gb").serving.details.buffers  # type: ignore[union-attr]
    assert tuple(g.kv_buffer_bytes / MiB for g in gpus) == kv_mib
    for g, printed in zip(gpus, compute_mib, strict=True):
        assert 0 <= g.compute_buffer_bytes / MiB - printed <= over * printed + 0.012
    assert abs(host.compute_buffer_bytes / MiB - host_mib) <= 0.011


def test_no_op_offload_keeps_host_weights_ops_on_the_host_by_hand():
    """--no-op-offload: the GPU reserves no copy of a host-resident weight (its buffer is its
    own layers' terms) and the host runs those ops: with the experts of two layers in host
    memory, the host's buffer adds their matmuls' per-token terms beside the splits' inputs,
    512 x (8 k n_ff_exp + 4 k n_embd + 4 n_embd + 24 + 4 n_kv + 8 n_embd) (bench/llamacpp_rpc.py's
    --no-op-offload loads: never under). Ollama cannot be told; llama.cpp b4000 predates it."""
    w = {
        "kind": "llm_serving",
        "engine": "llama_cpp",
        "model": _MOE,
        "gguf": {
            "file_type": "Q8_0",
            "n_ctx": 4096,
            "n_parallel": 1,
            "n_gpu_layers": 5,
            "n_cpu_moe": 2,
            "op_offload": False,
        },
    }
    b = _budget(w)
    gpu, host = b.serving.details.buffers  # type: ignore[union-attr]
    assert gpu.compute_buffer_bytes == 512 * (2 * 4096 + 16 * 2048 + 12 * 6144 + 4 * 8 * 2048 + 28)
    experts = 8 * 6144 + 4 * 8 * 2048 + 4 * 2048 + 24
    assert host.compute_buffer_bytes == 512 * (4 * 2048 + 4 * 4096) + 512 * (
        experts + 4 * 4096 + 8 * 2048
    )
    assert "--n-cpu-moe 2 --no-op-offload --fit off" in b.serving.launch  # type: ignore[union-attr]
    assert any("--no-op-offload" in x for x in b.warnings)
    with pytest.raises(InvalidWorkload, match=r"gguf\.op_offload"):
        _budget(_gguf_workload("ollama", "0.30.1", "qwen3-30b-a3b", op_offload=False))
    with pytest.raises(InvalidWorkload, match="--no-op-offload"):
        _budget(_gguf_workload("llama_cpp", "b4000", "qwen3-30b-a3b", op_offload=False))
    # a dense model under partial offload: no weight copy, no partial-offload warning
    dense = _llama_cpp(
        "llama-3.1-8b", "rtx-4090-24gb", n_ctx=65536, n_gpu_layers=20, op_offload=False
    )
    assert not [x for x in dense.warnings if "offload_op" in x]
    copies = _llama_cpp("llama-3.1-8b", "rtx-4090-24gb", n_ctx=65536, n_gpu_layers=20)
    gpu_off = dense.serving.details.buffers[0]  # type: ignore[union-attr]
    gpu_on = copies.serving.details.buffers[0]  # type: ignore[union-attr]
    # the head and a host layer's K/V copies are gone; the GPU's own layers' terms remain
    # (b6500 predates b9410: the f32 mask copy's hole below the FFN, 4 n_kv + 12 n_ff + 12 E)
    assert gpu_off.compute_buffer_bytes < gpu_on.compute_buffer_bytes
    assert gpu_off.compute_buffer_bytes == 512 * (4 * 65536 + 12 * 14336 + 12 * 4096)


def test_n_cpu_moe_moves_the_tensors_llama_cpp_matches():
    """LLM_FFN_EXPS_REGEX (common/common.h): routed experts, fused gate_up included, of the
    first N GPU layers; not the shared experts, the router or a layer past N."""
    from vrambudget.core.serving.gguf.llamacpp import host_experts
    from vrambudget.core.serving.gguf.tensors import _LAYER_NAMES, GGUFTensor

    names = [
        "blk.0.ffn_up_exps.weight",
        "blk.0.ffn_gate_exps.weight",
        "blk.0.ffn_down_exps.weight",
        f"blk.1.{_LAYER_NAMES['experts.gate_up_proj']}.weight",
        "blk.1.ffn_up_shexp.weight",
        "blk.1.ffn_gate_inp.weight",
        "blk.2.ffn_up_exps.weight",
    ]
    tensors = tuple(GGUFTensor(n, "Q8_0", (64, 64, 4), int(n.split(".")[1]), 1) for n in names)
    s = _settings(n_cpu_moe=2)
    moved = host_experts(s, tensors, (0, 0, 0, 0))
    assert [t.name for t in moved] == names[:4]
    assert host_experts(s, tensors, (-1, 0, 0, 0)) == tuple(t for t in moved if t.layer == 1)


def test_n_cpu_moe_remedy_and_refusals():
    """A MoE model too large for the GPU: the remedies name the fewest layers whose experts
    must stay in host memory with every layer on the GPU, and that setting starts while one
    layer fewer does not. Ollama has no such setting, llama.cpp b4000 predates it (b6089), and
    a dense model has no expert to move (warned)."""
    w = _gguf_workload("llama_cpp", "b9460", "qwen3-30b-a3b", file_type="Q4_K_M", n_ctx=32768)
    w["gguf"]["n_parallel"] = 1
    w["gguf"]["n_gpu_layers"] = 49
    b = _budget(w, "rtx-4080-16gb")
    assert not b.serving.would_start  # type: ignore[union-attr]
    (r,) = [r for r in b.serving.remedies if r.startswith("n_cpu_moe")]  # type: ignore[union-attr]
    n = int(r.split()[1])
    assert 0 < n < 48
    for k, starts in ((n, True), (n - 1, False)):
        w["gguf"]["n_cpu_moe"] = k
        assert _budget(w, "rtx-4080-16gb").serving.would_start is starts  # type: ignore[union-attr]
    with pytest.raises(InvalidWorkload, match=r"gguf\.n_cpu_moe"):
        _budget(_gguf_workload("ollama", "0.30.1", "qwen3-30b-a3b", n_cpu_moe=4))
    with pytest.raises(InvalidWorkload, match="b6089"):
        _budget(_gguf_workload("llama_cpp", "b4000", "qwen3-30b-a3b", n_cpu_moe=4))
    dense = _budget(_gguf_workload("llama_cpp", "b9460", "llama-3.1-8b", n_ctx=4096, n_cpu_moe=4))
    assert any("no expert weights" in x for x in dense.warnings)
    # a build between the modelled ones that has the flag (b6100 takes b4000's rules)
    b6100 = _budget(_gguf_workload("llama_cpp", "b6100", "qwen3-30b-a3b", n_cpu_moe=4, n_ctx=4096))
    assert "--n-cpu-moe 4" in b6100.serving.launch  # type: ignore[union-attr]
    # --n-cpu-moe is a tensor override: llama.cpp's --fit then changes no layer
    # (common/fit.cpp: "tensor_buft_overrides already set by user, abort")
    w = _gguf_workload("llama_cpp", "b9460", "qwen3-30b-a3b", file_type="Q4_K_M", n_ctx=32768)
    w["gguf"].update(n_parallel=1, n_cpu_moe=4)
    b = _budget(w, "rtx-4080-16gb")
    assert not b.serving.would_start and b.serving.details.n_gpu_layers == 49  # type: ignore[union-attr]
    assert any("--fit leaves the layers as they are (n_cpu_moe is set)" in x for x in b.warnings)


def _custom_budget(workload: dict, gib: float):
    body = {
        "workloads": [workload],
        "device": {"source": "custom", "memory_total_bytes": int(gib * (1 << 30))},
    }
    req = msgspec.convert(body, BudgetRequest)
    return estimate(req.workloads, req.device, None, None, req.software)


def test_fit_keeps_a_moe_models_dense_weights_on_the_gpu_first():
    """llama.cpp's --fit (b7815 on; common/fit.cpp, ggml-org/llama.cpp#16653) with a MoE
    model too large for the GPU: every layer on the GPU with the experts of as few layers as
    leave its 1 GiB in host memory -- and the answer's launch line starts exactly that; where
    even the dense weights alone do not fit, the most layers with their experts in host memory
    and the rest of the model there too. Qwen3-30B-A3B Q4_K_M at 32K cells."""
    w = _gguf_workload("llama_cpp", "b9460", "qwen3-30b-a3b", file_type="Q4_K_M", n_ctx=32768)
    w["gguf"]["n_parallel"] = 1
    b = _budget(w, "rtx-4080-16gb")
    (note,) = [x for x in b.warnings if "adjusts unset settings" in x]
    k = int(note.split("the expert weights of ")[1].split()[0])
    assert "every layer on the GPUs" in note and 0 < k < 48
    launch = b.serving.launch  # type: ignore[union-attr]
    assert "-ngl 49 " in launch and f"--n-cpu-moe {k} --fit off" in launch
    assert b.serving.would_start  # type: ignore[union-attr]
    # one layer fewer in host memory would not leave llama.cpp's 1 GiB free
    w2 = _gguf_workload(
        "llama_cpp",
        "b9460",
        "qwen3-30b-a3b",
        file_type="Q4_K_M",
        n_ctx=32768,
        n_parallel=1,
        n_gpu_layers=49,
        n_cpu_moe=k - 1,
    )
    g = _budget(w2, "rtx-4080-16gb").serving.details.buffers[0]  # type: ignore[union-attr]
    buffers = g.model_buffer_bytes + g.kv_buffer_bytes + g.compute_buffer_bytes
    backend = 446_693_376  # the CUDA context and cuBLAS of compute capability 8.9
    assert buffers + backend + (1 << 30) > catalog_gpu("rtx-4080-16gb").memory_total_bytes
    # 4 GiB: the dense weights and the KV cache alone leave no room for every layer
    small = _custom_budget(w, 4)
    (note,) = [x for x in small.warnings if "adjusts unset settings" in x]
    assert "layers on the GPUs with their expert weights in host memory" in note, note
    assert "--cpu-moe --fit off" in small.serving.launch  # type: ignore[union-attr]


def test_bad_gguf_settings_are_field_errors():
    with pytest.raises(msgspec.ValidationError, match=r"gguf\.n_ctx"):
        msgspec.convert(
            {
                "workloads": [
                    {
                        "kind": "llm_serving",
                        "engine": "llama_cpp",
                        "max_model_len": 4096,
                        "model": {"source": "preset", "id": "llama-3.1-8b"},
                    }
                ],
                "device": {"source": "catalog", "id": "rtx-4090-24gb"},
            },
            BudgetRequest,
        )
    with pytest.raises(msgspec.ValidationError, match="needs flash attention"):
        msgspec.convert({"cache_type_v": "q4_0", "flash_attn": "off"}, type=GGUFOptions)
    with pytest.raises(InvalidWorkload, match="tensor_split"):
        _budget(
            {
                "kind": "llm_serving",
                "engine": "llama_cpp",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "gguf": {"devices": 2, "tensor_split": [1, 1, 1]},
            }
        )


def test_fit_answers_the_inverse_questions():
    body = {
        "workloads": [
            {
                "kind": "llm_serving",
                "engine": "llama_cpp",
                "engine_version": "b6500",
                "model": {"source": "preset", "id": "llama-3.1-70b"},
                "gguf": {"n_ctx": 8192},
            }
        ],
        "devices": [{"source": "catalog", "id": "rtx-4090-24gb"}],
        "device_counts": [1, 2],
    }
    r = fit(msgspec.convert(body, FitRequest))
    one, two = r.gpus[0].layouts
    assert not one.fits and two.fits
    assert 0 < (one.maxima.n_gpu_layers or 0) < 81
    assert two.maxima.file_type is not None and one.maxima.file_type in (None, "IQ2_M", "Q2_K")
    # the largest context on two cards starts, one cell more does not
    assert two.maxima.context_tokens and two.maxima.context_tokens >= 8192
    assert r.gpus[0].min_device_count == 2
    # each maximum is where the engine's own check flips
    w = body["workloads"][0]
    ngl = one.maxima.n_gpu_layers
    ok = _budget({**w, "gguf": {"n_ctx": 8192, "n_gpu_layers": ngl}})
    bad = _budget({**w, "gguf": {"n_ctx": 8192, "n_gpu_layers": ngl + 1}})
    assert ok.serving.would_start and not bad.serving.would_start  # type: ignore[union-attr]


def test_fit_of_a_moe_model_needs_its_experts_on_the_gpus():
    """/v1/fits: a MoE model that starts only because --fit moved expert weights to host memory
    does not fit whole (its layout says where the experts went); with the experts placed by the
    request (n_cpu_moe), the request's own layout is what fits."""
    w = _gguf_workload("llama_cpp", "b9460", "qwen3-30b-a3b", file_type="Q4_K_M", n_ctx=32768)
    w["gguf"]["n_parallel"] = 1
    body = {
        "workloads": [w],
        "devices": [
            {"source": "catalog", "id": "rtx-4080-16gb"},
            {"source": "catalog", "id": "rtx-4090-24gb"},
        ],
        "device_counts": [1],
    }
    r = fit(msgspec.convert(body, FitRequest))
    small, large = (g.layouts[0] for g in r.gpus)
    assert not small.fits and large.fits
    assert any("expert weights of" in x and "host memory" in x for x in small.warnings)
    placed = {**w, "gguf": {**w["gguf"], "n_gpu_layers": 49, "n_cpu_moe": 24}}
    r2 = fit(msgspec.convert({**body, "workloads": [placed]}, FitRequest))
    assert r2.gpus[0].layouts[0].fits


# ------------------------------------------------------------------- review regressions --


def test_quantized_v_without_flash_attention_is_refused():
    with pytest.raises(InvalidWorkload, match="flash attention") as err:
        _budget(
            {
                "kind": "llm_serving",
                "engine": "llama_cpp",
                "engine_version": "b4000",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "gguf": {"cache_type_k": "q8_0", "cache_type_v": "q8_0"},
            }
        )
    assert err.value.field == "workloads[0].gguf.cache_type_v"


def test_ollama_cache_type_rules():
    # flash attention off by default before 0.30: Ollama ignores OLLAMA_KV_CACHE_TYPE
    b = _budget(
        {
            "kind": "llm_serving",
            "engine": "ollama",
            "engine_version": "0.10.0",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "gguf": {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "n_ctx": 4096},
        }
    )
    d = b.serving.details  # type: ignore[union-attr]
    assert d.cache_type_k == "f16" and "OLLAMA_KV_CACHE_TYPE" not in b.serving.launch  # type: ignore[union-attr]
    with pytest.raises(InvalidWorkload, match="both caches"):
        _budget(
            {
                "kind": "llm_serving",
                "engine": "ollama",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "gguf": {"cache_type_k": "iq4_nl", "cache_type_v": "q5_1"},
            }
        )


def test_context_below_the_slots_is_refused():
    with pytest.raises(InvalidWorkload, match="n_ctx_seq") as err:
        _budget(
            {
                "kind": "llm_serving",
                "engine": "llama_cpp",
                "engine_version": "b4000",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "gguf": {"n_ctx": 32, "n_parallel": 64},
            }
        )
    assert err.value.field == "workloads[0].gguf.n_ctx"


def test_old_builds_take_the_flash_attention_switch():
    b = _budget(
        {
            "kind": "llm_serving",
            "engine": "llama_cpp",
            "engine_version": "b4000",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "gguf": {"n_ctx": 4096, "flash_attn": "on"},
        }
    )
    launch = b.serving.launch  # type: ignore[union-attr]
    assert " -fa " in launch + " " and "-fa on" not in launch and "--fit" not in launch


def test_fits_stay_within_64_gpus():
    body = {
        "workloads": [
            {
                "kind": "llm_serving",
                "engine": "llama_cpp",
                "model": {"source": "preset", "id": "llama-3.1-405b"},
                "gguf": {"file_type": "F32", "n_ctx": 4096},
            }
        ],
        "devices": [{"source": "catalog", "id": "t4-16gb"}],
        "device_counts": [1],
        "solve": ["device_count"],
        "max_device_count": 256,
    }
    g = fit(msgspec.convert(body, FitRequest)).gpus[0]
    assert g.min_device_count is None or g.min_device_count <= 64


def test_a_quantized_cache_needs_whole_blocks_per_row():
    """A q8_0 cache stores blocks of 32: a model whose K rows (KV heads x head size) are 4,100
    elements cannot have one (a 422 naming gguf.cache_type_k); the f16 cache is budgeted, and a
    refused engine's remedies skip the quantized-cache one instead of failing (a fuzzed
    request had turned that into a 500)."""
    model = {
        "source": "dimensions",
        "num_layers": 4,
        "hidden_size": 4100,
        "num_attention_heads": 41,
        "head_dim": 100,
        "intermediate_size": 11000,
        "vocab_size": 32000,
    }

    def budget(gguf, device="rtx-4090-24gb", **w):
        body = {
            "workloads": [
                {"kind": "llm_serving", "engine": "llama_cpp", "model": model, "gguf": gguf, **w}
            ],
            "device": {"source": "catalog", "id": device},
        }
        req = msgspec.convert(body, BudgetRequest)
        return estimate(req.workloads, req.device, None, None, req.software)

    with pytest.raises(InvalidWorkload) as exc:
        budget({"cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on"})
    assert exc.value.field == "workloads[0].gguf.cache_type_k"
    assert "4100" in exc.value.message
    assert budget({}).serving.would_start
    # too long a context for the card: the remedies are tried, the q8_0 one skipped
    big = budget({"n_ctx": 4_000_000, "n_gpu_layers": 5})
    assert not big.serving.would_start
    assert not any("q8_0" in r for r in big.serving.remedies)
