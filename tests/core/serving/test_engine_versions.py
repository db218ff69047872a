"""vLLM per minor release (0.10 - 0.34) and SGLang per release: the rules each release's source
gives (research/vllm_versions.md, research/sglang_accounting.md), checked as differences
between releases that hold everything else equal, and SGLang's pool by hand."""

from __future__ import annotations

import math

import msgspec
import pytest

from vrambudget.core.catalog import gpu
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.resolve import resolve_model
from vrambudget.core.result import SGLangDetails, VLLMDetails
from vrambudget.core.serving.calibration import vllm_releases
from vrambudget.core.serving.releases import engine_release
from vrambudget.core.serving.sglang import (
    _prefill_graph_sizes,
    chunked_prefill_default,
    cuda_graph_max_bs_default,
    mem_fraction_default,
    sglang_release,
)
from vrambudget.core.serving.vllm import account
from vrambudget.core.spec import BudgetRequest, LLMServingWorkload
from vrambudget.core.units import GiB

LLAMA = {"source": "preset", "id": "llama-3.1-8b"}
H100 = gpu("h100-sxm5-80gb")


def _w(**kw: object) -> LLMServingWorkload:
    return msgspec.convert({"kind": "llm_serving", "model": LLAMA, **kw}, LLMServingWorkload)


def _acct(g=H100, **kw: object):
    w = _w(**kw)
    return account(w, resolve_model(w.model), g.memory_total_bytes, g.name)


def test_every_minor_release_from_0_10_is_modelled():
    minors = [r.version for r in vllm_releases()]
    assert minors == [f"0.{m}.0" for m in range(10, 35)]
    assert engine_release("vllm", None).modelled == "0.34.0"
    r = engine_release("vllm", "0.11.2")
    assert r.modelled == "0.11.0" and r.note and "0.11.0" in r.note
    assert (
        engine_release("vllm", "0.27").modelled == "0.27.0"
        and engine_release("vllm", "0.27").note is None
    )
    for bad, words in (
        ("0.9.2", "older than modelled"),
        ("0.35.0", "newer than modelled"),
        ("b5000", "version like"),
    ):
        with pytest.raises(InvalidWorkload, match=words):
            engine_release("vllm", bad)


def test_warm_up_sampler_and_moe_scratch_per_release_as_read():
    """research/vllm_versions.md: the dummy sampler run's top-k/top-p sorts the vocabulary up to
    0.16 (0.10-0.11 only without flashinfer), a Triton kernel from 0.17; the unquantized fused
    MoE keeps its scratch in the workspace manager from 0.14. Each release cites its line."""
    by = {r.version: r for r in vllm_releases()}
    for version, r in by.items():
        minor = int(version.split(".")[1])
        want = (
            "flashinfer_if_installed" if minor <= 11 else "torch_sort" if minor <= 16 else "triton"
        )
        assert r.top_k_top_p == want, version
        assert r.moe_workspace_persistent is (minor >= 14), version
        rules = " ".join(r.sources)
        assert "topk_topp_sampler.py:" in rules and "fused_moe/" in rules, version


def test_0_20_utilization_default_and_graph_estimate_in_the_budget():
    """0.20: gpu_memory_utilization 0.9 -> 0.92 and the CUDA-graph estimate subtracted
    (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1)."""
    a19 = _acct(engine_version="0.19.0", max_model_len=8192)
    a20 = _acct(engine_version="0.20.0", max_model_len=8192)
    s19, s20 = a19.stages[0], a20.stages[0]
    total = H100.memory_total_bytes
    assert s19.requested_bytes == math.ceil(total * 0.9)
    assert s20.requested_bytes == math.ceil(total * 0.92)
    assert s20.cuda_graph_bytes > 0
    assert (
        s20.available_bytes
        == s19.available_bytes + (s20.requested_bytes - s19.requested_bytes) - s20.cuda_graph_bytes
    )
    # the same utilization named explicitly: only the graphs differ
    e19 = _acct(engine_version="0.19.0", max_model_len=8192, gpu_memory_utilization=0.9)
    e20 = _acct(engine_version="0.20.0", max_model_len=8192, gpu_memory_utilization=0.9)
    assert (
        e19.stages[0].available_bytes - e20.stages[0].available_bytes
        == e20.stages[0].cuda_graph_bytes
    )


def test_0_10_counts_nccl_in_the_budget():
    """0.10 took its init snapshot before NCCL's initialisation: at TP 2 the communicators
    count against the KV budget; 0.11 took it after."""
    a10 = _acct(engine_version="0.10.0", max_model_len=8192, parallelism={"tensor": 2})
    a11 = _acct(engine_version="0.11.0", max_model_len=8192, parallelism={"tensor": 2})
    s10, s11 = a10.stages[0], a11.stages[0]
    assert s10.nccl_init_bytes > 0
    assert s11.available_bytes - s10.available_bytes == s10.nccl_init_bytes


def test_requested_memory_rounding_before_0_14():
    total = H100.memory_total_bytes
    a13 = _acct(engine_version="0.13.0", max_model_len=8192, gpu_memory_utilization=0.93)
    a14 = _acct(engine_version="0.14.0", max_model_len=8192, gpu_memory_utilization=0.93)
    assert a13.stages[0].requested_bytes == total * 930_000 // 1_000_000
    assert a14.stages[0].requested_bytes == -(-total * 930_000 // 1_000_000)


def test_0_28_xlarge_batch_tier_on_a_b200():
    b200 = gpu("b200-180gb")
    r27 = _acct(b200, engine_version="0.27.0", max_model_len=8192).resolved
    r28 = _acct(b200, engine_version="0.28.0", max_model_len=8192).resolved
    assert r27.max_num_batched_tokens == 8192
    assert r28.max_num_batched_tokens == 16384 and r28.max_num_seqs == 1024


def test_0_34_block_64_and_the_extensible_cache():
    a = _acct(engine_version="0.34.0", max_model_len=8192)
    s = a.stages[0]
    assert a.resolved.block_size == 64
    total = H100.memory_total_bytes
    non_kv = (
        s.weights_bytes
        + s.metadata_bytes
        + s.load_rounding_bytes
        + s.load_workspace_bytes
        + s.non_torch_bytes
        + s.cuda_context_bytes
        + s.nccl_init_bytes
    )
    graphs = s.cuda_graph_bytes
    margin = max(1 << 30, s.activation_bytes * 3 // 4)
    assert s.requested_bytes == total  # utilization 1.0 by default
    # free after warm-up and capture, less the margin, less the transient peak
    assert s.available_bytes == total - non_kv - graphs - margin - s.activation_bytes
    # an explicit utilization turns the profiling budget back on
    b = _acct(engine_version="0.34.0", max_model_len=8192, gpu_memory_utilization=0.9)
    assert b.stages[0].requested_bytes == math.ceil(total * 0.9)


def test_kv_cache_memory_sets_the_pool():
    a = _acct(engine_version="0.19.0", max_model_len=8192, kv_cache_memory_bytes=8 * GiB)
    assert a.stages[0].available_bytes == 8 * GiB
    # Llama 3.1 8B page: 16 tokens x 8 heads x 128 x 2 (K, V) x 2 B = 65,536 per layer
    assert a.num_blocks == 8 * GiB // (65_536 * 32)
    too_big = _acct(engine_version="0.19.0", max_model_len=8192, kv_cache_memory_bytes=80 * GiB)
    assert not too_big.would_start and "out of memory" in (too_big.reason or "")
    with pytest.raises(InvalidWorkload, match="kv-cache-memory"):
        _acct(engine_version="0.10.0", max_model_len=8192, kv_cache_memory_bytes=GiB)


def test_budget_answer_carries_the_release_and_the_launch():
    req = msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "llm_serving",
                    "model": LLAMA,
                    "engine_version": "0.12.1",
                    "max_model_len": 8192,
                }
            ],
            "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
        },
        BudgetRequest,
    )
    b = estimate(req.workloads, req.device, None, None, req.software)
    s = b.serving
    assert s is not None and s.engine_version == "0.12.1" and s.modelled_version == "0.12.0"
    assert s.version_note and isinstance(s.details, VLLMDetails)
    assert s.details.cudagraph_memory == "outside"
    assert "--max-model-len 8192" in s.launch and "--gpu-memory-utilization 0.9" in s.launch


# ------------------------------------------------------------------------------------ SGLang --


def test_sglang_fraction_rules_by_release():
    r40, r46, r520 = sglang_release("0.4.0"), sglang_release("0.4.6"), sglang_release("0.5.20")
    assert mem_fraction_default(r40, 81_559, 1, 8192, 160, False, True) == 0.88
    assert mem_fraction_default(r40, 81_559, 2, 8192, 160, False, True) == 0.87
    # 0.4.6: cards over 80 GiB keep 13 GiB out
    assert mem_fraction_default(r46, 143_771, 1, 8192, 160, False, True) == pytest.approx(
        (143_771 - 13 * 1024) / 143_771
    )
    # 0.5.20 on an 80 GB card: 512 + 1.5 x 8192 + 2 x 256 + 1/8 GiB + 8 MiB x 42 prefill graphs
    assert _prefill_graph_sizes() == 42
    reserved = 512 + 8192 * 1.5 + 256 * 2 + 1 / 8 * 1024 + 42 * 8
    assert mem_fraction_default(r520, 81_559, 1, 8192, 256, False, True) == round(
        (81_559 - reserved) / 81_559, 3
    )


def test_sglang_0_4_7_and_0_4_8_defaults():
    """0.4.7 server_args.py:254-294: the TP table up to 80 GiB, and on larger cards 48 GiB of
    what the fraction leaves, at most all but 18 GiB; 0.4.8 (:288-321) brought 0.4.10's reserve
    bands. H200 (143,771 MiB), TP 1: 0.4.7 min(0.88 + 48 x 1024 x 0.12 / 143,771 = 0.92103,
    (143,771 - 18,432) / 143,771 = 0.87180); 0.4.8 round((143,771 - 12.5 x 1024) / 143,771, 3) =
    0.911.
    An RTX 4090 (24,564 MiB): 0.88 (0.4.7) and round((24,564 - 2.9 x 1024) / 24,564, 3) =
    0.879 (0.4.8), with chunked prefill 2,048 under both."""
    r47, r48 = sglang_release("0.4.7"), sglang_release("0.4.8")
    assert mem_fraction_default(r47, 143_771, 1, 8192, 256, False, True) == pytest.approx(
        (143_771 - 18_432) / 143_771
    )
    # the 48 GiB term binds only past 180 GB, where 0.79 takes over: (g - 18 GiB) / g below
    assert mem_fraction_default(r47, 102_400, 1, 8192, 256, False, True) == pytest.approx(0.82)
    assert mem_fraction_default(r47, 192 * 1024, 1, 8192, 256, False, True) == 0.79  # > 180 GB
    assert mem_fraction_default(r48, 143_771, 1, 8192, 256, False, True) == 0.911
    assert mem_fraction_default(r47, 24_564, 1, 2048, 8, False, True) == 0.88
    assert mem_fraction_default(r48, 24_564, 1, 2048, 8, False, True) == 0.879
    assert chunked_prefill_default(r47, 24_564) == chunked_prefill_default(r48, 24_564) == 2048
    assert chunked_prefill_default(r47, 192 * 1024) == 16384  # over 180 GB
    assert chunked_prefill_default(r47, 143_771) == 8192
    # the runner's capture list reaches 256 over 96 GiB (0.4.7) or 90 GiB (0.4.8)
    assert cuda_graph_max_bs_default(r47, 95_000, 1) == 160
    assert cuda_graph_max_bs_default(r48, 95_000, 1) == 256


def _sglang(**kw: object):
    req = msgspec.convert(
        {
            "workloads": [{"kind": "llm_serving", "engine": "sglang", "model": LLAMA, **kw}],
            "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
        },
        BudgetRequest,
    )
    return estimate(req.workloads, req.device, None, None, req.software)


def test_sglang_pool_by_hand():
    b = _sglang(max_model_len=8192, engine_version="0.5.23", sglang={"mem_fraction_static": 0.85})
    s = b.serving
    assert s is not None and isinstance(s.details, SGLangDetails)
    assert s.modelled_version == "0.5.20" and s.version_note
    d = s.details
    lines = {ln.component.value: ln.bytes for ln in b.devices[0].lines}
    total = H100.memory_total_bytes
    free = total - lines["cuda_context"]
    weights = d.weights_bytes
    rest_gib = (free - weights) / GiB - free / GiB * (1 - 0.85)
    cell = 32 * 8 * 128 * 2 * 2  # layers x kv heads x (head_dim + v_head_dim) x bf16
    tokens = int(rest_gib * (1 << 30) // cell)
    assert s.kv_cache_bytes_per_token == cell
    assert d.max_total_num_tokens == s.kv_cache_tokens == tokens
    assert lines["kv_cache"] == (tokens + 1) * cell  # one padding page of size 1
    assert d.max_running_requests == min(max(int(tokens / 8192 * 512), 2048), 4096, tokens // 2)
    assert "--mem-fraction-static 0.850" in s.launch
    assert f"--max-running-requests {d.max_running_requests}" in s.launch


def test_sglang_launch_pins_no_request_limit_where_it_would_not_start() -> None:
    """A fraction below the weights' share: the engine refuses to start, there is no pool to
    size, and the launch line leaves ``--max-running-requests`` out (0 is no limit to give)."""
    b = _sglang(max_model_len=8192, sglang={"mem_fraction_static": 0.1})
    s = b.serving
    assert s is not None and not s.would_start and s.kv_cache_tokens == 0
    assert "--max-running-requests" not in s.launch
    assert "--mem-fraction-static 0.100" in s.launch


@pytest.mark.parametrize(
    ("version", "given", "want"),
    [
        # 0.4.0-0.4.6: ReqToTokenPool(size=max_num_reqs + 1): the default gains one slot
        ("0.4.3", None, 2049),
        ("0.4.3", 5000, 5000),  # a value given stands, past the estimate and half the pool
        ("0.4.6.post5", None, 2049),
        # 0.4.7-0.5.9: size = max_num_reqs
        ("0.4.7", None, 2048),
        ("0.4.9.post2", None, 2048),
        ("0.5.5", None, 2048),
        ("0.5.5", 5000, 5000),
        # 0.5.10-0.5.15: a value given is capped at the estimate
        ("0.5.12", None, 2048),
        ("0.5.12", 5000, 2048),
        # 0.5.16 on: capped at half the pool instead
        ("0.5.16", 5000, 5000),
        ("0.5.16", 60_000, 52_765),
    ],
)
def test_sglang_max_running_requests_by_release(version, given, want):
    """``max_running_requests`` for a 105,531-token pool at context 131,072 (the RTX 3090 launch
    of research/data/engine_logs.json printed 2049 on 0.4.x): estimated = max(min(int(105,531 /
    131,072 x 512), 4096), 2048) = 2048, half the pool 52,765 (tp_worker.py /
    model_runner_kv_cache_mixin.py ``_resolve_max_num_reqs`` of each release)."""
    from vrambudget.core.serving.releases import engine_release
    from vrambudget.core.serving.sglang import max_running_requests

    r = sglang_release(engine_release("sglang", version).modelled)
    assert max_running_requests(r, 105_531, 131_072, given) == want


def test_sglang_refuses_when_the_weights_exceed_the_fraction():
    b = _sglang(
        model={"source": "preset", "id": "llama-3.1-70b"},
        max_model_len=8192,
        parallelism={"tensor": 2},
        sglang={"mem_fraction_static": 0.5},
    )
    s = b.serving
    assert s is not None and not s.would_start and "mem-fraction-static" in (s.reason or "")
    assert any("mem_fraction_static" in r or "tensor parallel" in r for r in s.remedies)


def test_sglang_settings_only_for_sglang():
    with pytest.raises(msgspec.ValidationError, match="sglang settings apply only"):
        _w(sglang={"mem_fraction_static": 0.8})
    with pytest.raises(msgspec.ValidationError, match=r"sglang\.mem_fraction_static"):
        _w(engine="sglang", gpu_memory_utilization=0.8)


# ------------------------------------------------------------------- review regressions --


def test_0_34_explicit_utilization_keeps_the_extensible_cache():
    """vllm/config/cache.py 0.34: the extensible cache is off only with --kv-cache-memory; an
    explicit utilization changes `requested` only."""
    a = _acct(engine_version="0.34.0", max_model_len=8192, gpu_memory_utilization=1.0)
    b = _acct(engine_version="0.34.0", max_model_len=8192)
    assert a.stages[0].available_bytes == b.stages[0].available_bytes
    assert a.kv_tokens == b.kv_tokens


def test_more_than_the_gpu_outside_the_budget_does_not_start():
    """CUDA context, NCCL and graphs outside vLLM's budget: out of memory at graph capture."""
    g = gpu("l4-24gb")
    w = _w(
        engine_version="0.19.0",
        model={"source": "preset", "id": "llama-3.1-70b"},
        parallelism={"tensor": 8},
        max_model_len=4096,
    )
    a = account(w, resolve_model(w.model), g.memory_total_bytes, g.name)
    assert not a.would_start and "capturing CUDA graphs" in (a.reason or "")


@pytest.mark.parametrize(
    ("engine", "version", "modelled"),
    [
        ("sglang", "0.5.23", "0.5.20"),
        ("vllm", "0.10.1.1", "0.10.0"),
        ("ollama", "0.32.15", "0.30.1"),
    ],
)
def test_newest_read_releases_are_accepted(engine, version, modelled):
    assert engine_release(engine, version).modelled == modelled


@pytest.mark.parametrize(("engine", "version"), [("sglang", "0.5.24"), ("ollama", "0.33.0")])
def test_releases_newer_than_read_are_refused(engine, version):
    with pytest.raises(InvalidWorkload, match="newer than modelled"):
        engine_release(engine, version)


def test_sglang_refusals():
    long = _sglang(max_model_len=131073)
    assert not long.serving.would_start  # type: ignore[union-attr]
    assert "max_position_embeddings" in (long.serving.reason or "")  # type: ignore[union-attr]
    assert any("131072" in r for r in long.serving.remedies)  # type: ignore[union-attr]
    tiny = _sglang(max_model_len=4096, sglang={"max_total_tokens": 1})
    assert not tiny.serving.would_start  # type: ignore[union-attr]
    huge = _sglang(max_model_len=4096, sglang={"chunked_prefill_size": 16_777_216})
    assert not huge.serving.would_start  # type: ignore[union-attr]
    assert "automatic mem_fraction_static" in (huge.serving.reason or "")  # type: ignore[union-attr]
    q = _sglang(max_model_len=4096, quantization={"method": "fp8", "applied_at_load": True})
    assert "--quantization fp8" in q.serving.launch  # type: ignore[union-attr]


def test_sglang_reads_nvidia_smis_total_for_its_defaults():
    """SGLang's automatic defaults read ``nvidia-smi --query-gpu=memory.total``
    (``get_nvgpu_memory_capacity``): 24,564 MiB on an RTX 4090 (the catalog's
    nvidia_smi_total_mib), not the runtime's 24,210 MiB. 0.4.8's band rule then gives
    round((24,564 - 2.9 x 1024) / 24,564, 3) = 0.879 (0.877 from the runtime total)."""
    req = msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "llm_serving",
                    "engine": "sglang",
                    "engine_version": "0.4.9",
                    "model": LLAMA,
                }
            ],
            "device": {"source": "catalog", "id": "rtx-4090-24gb"},
        },
        BudgetRequest,
    )
    s = estimate(req.workloads, req.device, None, None, req.software).serving
    assert s is not None and isinstance(s.details, SGLangDetails)
    assert s.details.mem_fraction_static == 0.879
    assert "24564 MiB" in s.details.mem_fraction_static_source


def test_no_peer_access_launches_without_the_custom_all_reduce():
    """What the budget assumes is what the launch starts: with ``peer_access`` false a
    tensor-parallel group runs without vLLM's (or SGLang's) custom all-reduce, so its command
    says so; one GPU, or peers, keep the engine's default."""

    def launch(engine: str, tensor: int, peer_access: bool | None) -> str:
        par = {"tensor": tensor, "peer_access": peer_access}
        req = msgspec.convert(
            {
                "workloads": [
                    {"kind": "llm_serving", "engine": engine, "model": LLAMA, "parallelism": par}
                ],
                "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
            },
            BudgetRequest,
        )
        s = estimate(req.workloads, req.device, None, None, req.software).serving
        assert s is not None
        return s.launch

    for engine in ("vllm", "sglang"):
        assert "--disable-custom-all-reduce" in launch(engine, 2, False)
        assert "--disable-custom-all-reduce" not in launch(engine, 2, None)
        assert "--disable-custom-all-reduce" not in launch(engine, 1, False)


def test_no_peer_access_leaves_a_pipeline_only_layout_nccl_baseline():
    """``peer_access`` describes the tensor-parallel group: a pipeline of single GPUs keeps the
    NCCL baseline (``nccl_init_bytes``), which no measurement without peers has lowered."""
    from vrambudget.core.serving.calibration import calibration

    pp = _acct(engine_version="0.10.1", parallelism={"pipeline": 2, "peer_access": False})
    assert pp.stages[0].nccl_init_bytes == round(calibration("0.10.0").c("nccl_init_bytes"))
    tp = _acct(engine_version="0.10.1", parallelism={"tensor": 2, "peer_access": False})
    assert tp.stages[0].nccl_init_bytes == 180_664_402


@pytest.mark.parametrize(
    ("version", "gpu_id", "seqs", "batched", "piecewise", "full"),
    [
        # the 0.19 H100 sweep's CSV: 51 piecewise (largest 512), 51 FULL
        ("0.19.0", "h100-sxm5-80gb", 1024, 8192, 51, 51),
        # an RTX 3090 launch of 0.19.1 printed "PIECEWISE=51 (largest=512), FULL=35 (largest=256)"
        ("0.19.0", "rtx-3090-24gb", 256, 2048, 51, 35),
        # the 0.26.1 candidate at max_num_seqs 16: "PIECEWISE=7 (largest=32), FULL=5 (largest=16)"
        ("0.26.0", "a100-sxm4-80gb", 16, 8192, 7, 5),
        # 0.10: [1, 2, 4] + every multiple of 8 up to 512, piecewise only
        ("0.10.0", "a100-sxm4-80gb", 256, 2048, 67, 0),
        # 0.10 keeps [1, 2, 4] whatever the largest size: 3 graphs at one sequence
        ("0.10.0", "rtx-4090-24gb", 1, 8192, 3, 0),
        # 0.11: the same sizes, and FULL decode graphs up to max_num_seqs
        ("0.11.0", "l4-24gb", 128, 2048, 35, 19),
        # sizes above max_num_batched_tokens are dropped (0.12 on: the largest is capped too)
        ("0.26.0", "h100-sxm5-80gb", 256, 256, 35, 35),
        # 0.28 on compute capability 10.x: up to 1024 (step 16 from 256)
        ("0.28.0", "b200-180gb", 1024, 16384, 83, 83),
        ("0.28.0", "h100-sxm5-80gb", 1024, 8192, 51, 51),
        # 0.21 on: max_num_batched_tokens within the largest size is captured too (300)
        ("0.20.0", "h100-sxm5-80gb", 256, 300, 37, 35),
        ("0.21.0", "h100-sxm5-80gb", 256, 300, 38, 35),
        # 0.31 on: so is max_num_seqs (100; FULL decode graphs up to it, 100 included)
        ("0.30.0", "h100-sxm5-80gb", 100, 8192, 28, 15),
        ("0.31.0", "h100-sxm5-80gb", 100, 8192, 29, 16),
    ],
)
def test_cuda_graph_capture_sizes_by_release(version, gpu_id, seqs, batched, piecewise, full):
    """Hand-counted from ``_set_cudagraph_sizes`` and ``initialize_cudagraph_keys`` of each
    release (research/data/vllm_versions.json ``cudagraph_capture``)."""
    from vrambudget.core.serving.calibration import calibration
    from vrambudget.core.serving.engine_args import cudagraph_sizes

    p, f = cudagraph_sizes(calibration(version), seqs, batched, gpu(gpu_id).name)
    assert (len(p), len(f)) == (piecewise, full)
    assert list(p) == sorted(set(p)) and all(x <= batched for x in p)
    assert all(x <= seqs for x in f)


def test_cuda_graph_memory_scales_with_the_graphs_captured():
    """The graph memory per graph is fitted on the 0.19 sweep (102 graphs each); 16 sequences
    capture 12 graphs, so 12/102 of the memory, and 0.20 on subtracts exactly that from the KV
    budget. Llama 3.1 8B: (3,419,366 + 178,366 x 32) B per graph."""
    per_graph = 3_419_366 + 178_366 * 32
    full = _acct(engine_version="0.26.0", max_model_len=8192).stages[0]
    few = _acct(engine_version="0.26.0", max_model_len=8192, max_num_seqs=16).stages[0]
    assert full.cuda_graph_bytes == per_graph * 102
    assert few.cuda_graph_bytes == per_graph * 12
    # the profile run also shrinks with fewer sequences (the sampler's rows): compare the budget
    # with the activation peak added back
    assert (few.available_bytes + few.activation_bytes) - (
        full.available_bytes + full.activation_bytes
    ) == per_graph * 90
    eager = _acct(engine_version="0.26.0", max_model_len=8192, enforce_eager=True).stages[0]
    assert eager.cuda_graph_bytes == 0


def test_a_driver_before_r550_multiplies_the_graph_memory():
    """vLLM #5517: the same graphs took 3.81 GiB under the CUDA 12.2 / 12.3 drivers and 1.14
    GiB under 12.4's (R550), so a driver named below R550 takes 3.35x the fitted graph memory.
    Llama 3.1 8B, 0.26.0 defaults on an H100 (102 graphs): round((3,419,366 + 178,366 x 32) x
    102 x 3.35) B; R550 and later, and a driver not named, keep the fitted bytes."""
    fitted = (3_419_366 + 178_366 * 32) * 102
    w = _w(engine_version="0.26.0", max_model_len=8192)
    arch = resolve_model(w.model)
    total = H100.memory_total_bytes

    def stage(driver):
        return account(w, arch, total, H100.name, 0, driver).stages[0]

    old, r550, unnamed = stage("535.247.01"), stage("550.54.15"), stage(None)
    assert unnamed.cuda_graph_bytes == r550.cuda_graph_bytes == fitted == 930_961_956
    # 930,961,956 x 3.35 = 3,118,722,552.6
    assert old.cuda_graph_bytes == 3_118_722_553
    assert stage("545.23.08").cuda_graph_bytes == old.cuda_graph_bytes
    # 0.20 on: vLLM subtracts its graph estimate (which sees the same driver) from the KV budget
    assert r550.available_bytes - old.available_bytes == old.cuda_graph_bytes - fitted
    # 0.19: the graphs lie outside the budget; the pool is the same
    w19 = _w(engine_version="0.19.0", max_model_len=8192)
    a19 = [account(w19, arch, total, H100.name, 0, d).stages[0] for d in ("535.247.01", None)]
    assert a19[0].available_bytes == a19[1].available_bytes
    assert a19[0].cuda_graph_bytes == round(a19[1].cuda_graph_bytes * 3.35)
    # eager captures nothing, whatever the driver
    eager = _w(engine_version="0.26.0", max_model_len=8192, enforce_eager=True)
    assert account(eager, arch, total, H100.name, 0, "535.247.01").stages[0].cuda_graph_bytes == 0


def test_an_amd_gpu_ignores_an_nvidia_driver():
    mi = gpu("mi300x-192gb")
    w = _w(engine_version="0.26.0", max_model_len=8192)
    arch = resolve_model(w.model)
    named = account(w, arch, mi.memory_total_bytes, mi.name, 0, "535.247.01")
    plain = account(w, arch, mi.memory_total_bytes, mi.name, 0, None)
    assert named.stages[0].cuda_graph_bytes == plain.stages[0].cuda_graph_bytes > 0


def test_the_answer_names_the_driver_assumption_and_the_fit_uses_the_driver():
    def body(software):
        return {
            "workloads": [{"kind": "llm_serving", "model": LLAMA, "engine_version": "0.26.0"}],
            "device": {"source": "catalog", "id": "a100-sxm4-40gb"},
            **({"software": software} if software else {}),
        }

    def run(b):
        req = msgspec.convert(b, BudgetRequest)
        return estimate(req.workloads, req.device, None, None, req.software)

    plain = run(body(None))
    old = run(body({"driver_version": "535.247.01"}))
    by = {b.name: b for b in plain.stack.behaviours}
    assert by["cuda_graph_driver"].assumed == (
        "the NVIDIA driver is not named; this CUDA 13.0 build (torch 2.11's PyPI wheel; torch "
        "pinned by vllm 0.26) needs driver 580 or later, so R550 or later: CUDA-graph memory as "
        "fitted on current drivers (a CUDA 12.x install of the engine: name "
        "software.cuda_version)"
    )
    assert "#5517" in by["cuda_graph_driver"].source
    old_by = {b.name: b for b in old.stack.behaviours}
    assert "535.247.01 is older than R550" in old_by["cuda_graph_driver"].assumed
    assert old.serving.kv_cache_tokens < plain.serving.kv_cache_tokens

    def graphs(b):
        line = next(ln for ln in b.devices[0].lines if ln.component.value == "runtime_workspace")
        return next(p for p in line.parts if p.name.startswith("CUDA graphs"))

    assert "x3.35 for a driver before R550" in graphs(old).name
    assert graphs(old).bytes == round(graphs(plain).bytes * 3.35)
    eager = body(None)
    eager["workloads"][0]["enforce_eager"] = True
    names = {b.name for b in run(eager).stack.behaviours}
    assert "cuda_graph_driver" not in names


def _workload(version: str, **kw: object) -> dict:
    return {"kind": "llm_serving", "model": LLAMA, "engine_version": version, **kw}


def _serving(version: str, software: dict | None, gpu: str | dict, **kw: object):
    """The budget of Llama 3.1 8B (or ``model=``) on vLLM ``version`` on a catalog GPU (its
    id, or a device dict)."""
    device = {"source": "catalog", "id": gpu} if isinstance(gpu, str) else gpu
    req = msgspec.convert(
        {
            "workloads": [_workload(version, **kw)],
            "device": device,
            **({"software": software} if software else {}),
        },
        BudgetRequest,
    )
    return estimate(req.workloads, req.device, None, None, req.software)


def test_a_cuda_12_build_with_no_driver_named_says_what_an_old_driver_changes():
    """CUDA 12.x runs on drivers from 525 (minor-version compatibility), so a build of it may
    meet a driver before R550. vLLM 0.19 pins torch 2.10, a CUDA 12.8 wheel, and its graphs lie
    outside the budget: an old driver adds 2.35x the fitted graphs there, which on an RTX 4090
    at the defaults' 0.9 utilization is more than the memory left, so the answer warns. The
    same launch with the driver named is the account the warning quotes."""
    plain = _serving("0.19.0", None, "rtx-4090-24gb", max_model_len=32768)
    named = _serving(
        "0.19.0", {"driver_version": "535.247.01"}, "rtx-4090-24gb", max_model_len=32768
    )
    assert plain.serving.would_start and not named.serving.would_start
    assumed = {b.name: b.assumed for b in plain.stack.behaviours}["cuda_graph_driver"]

    def graphs(b):
        line = next(ln for ln in b.devices[0].lines if ln.component.value == "runtime_workspace")
        return next(p for p in line.parts if p.name.startswith("CUDA graphs")).bytes

    more = graphs(named) - graphs(plain)
    assert more == round(graphs(plain) * 3.35) - graphs(plain)
    assert assumed == (
        "the NVIDIA driver is taken as R550 or later (not named): CUDA-graph memory as fitted on "
        "current drivers; this CUDA 12.8 build (torch 2.10's PyPI wheel; torch pinned by vllm "
        "0.19) also runs on drivers from 525, and one before R550 takes about 3.35x as much: "
        f"{more / GiB:.2f} GiB more CUDA-graph memory here, and vLLM would not start (name the "
        "driver in software.driver_version)"
    )
    warning = next(w for w in plain.warnings if "driver before R550" in w)
    assert named.serving.reason in warning
    # graphs outside the budget: the KV pool and its band are the current driver's
    assert plain.serving.kv_cache_tokens == named.serving.kv_cache_tokens
    assert "before R550" not in plain.serving.kv_cache_tokens_band.basis


def test_the_kv_band_reaches_an_old_driver_where_the_budget_holds_the_graphs():
    """From 0.20 vLLM subtracts its graph estimate from the KV budget: a CUDA 12.9 build of
    0.26 (named) with no driver named gets a KV band whose low end is the pool under driver
    R535 less the band's gap, the low end of the same request with that driver named; the high
    end is unchanged. The default build (CUDA 13.0) needs driver 580: no such reach."""
    kw = {"max_model_len": 32768}
    cu12 = _serving("0.26.0", {"cuda_version": "12.9"}, "h100-sxm5-80gb", **kw)
    old = _serving(
        "0.26.0", {"cuda_version": "12.9", "driver_version": "535"}, "h100-sxm5-80gb", **kw
    )
    cu13 = _serving("0.26.0", None, "h100-sxm5-80gb", **kw)
    band, old_band, cu13_band = (b.serving.kv_cache_tokens_band for b in (cu12, old, cu13))
    assert cu12.serving.kv_cache_tokens == cu13.serving.kv_cache_tokens
    assert old.serving.kv_cache_tokens < cu12.serving.kv_cache_tokens
    assert band.low == old_band.low < cu13_band.low
    assert band.high == cu13_band.high
    assert band.max_concurrency_low == old_band.max_concurrency_low
    assert (
        "the low end under a driver before R550, which this CUDA 12.9 build "
        "(software.cuda_version) can run (no driver named)"
    ) in band.basis
    assumed = {b.name: b.assumed for b in cu12.stack.behaviours}["cuda_graph_driver"]
    fewer = cu12.serving.kv_cache_tokens - old.serving.kv_cache_tokens
    assert f": {fewer:,} KV tokens fewer here" in assumed
    # a driver named, an AMD GPU or eager mode: no reach
    named = _serving(
        "0.26.0", {"cuda_version": "12.9", "driver_version": "580.82.07"}, "h100-sxm5-80gb", **kw
    )
    assert named.serving.kv_cache_tokens_band == cu13_band
    eager = _serving("0.26.0", {"cuda_version": "12.9"}, "h100-sxm5-80gb", enforce_eager=True, **kw)
    assert "before R550" not in eager.serving.kv_cache_tokens_band.basis
    amd = _serving("0.26.0", {"cuda_version": "12.9"}, "mi300x-192gb", **kw)
    assert "before R550" not in amd.serving.kv_cache_tokens_band.basis
    assert "cuda_graph_driver" not in {b.name for b in amd.stack.behaviours}


def test_blackwell_needs_a_driver_no_older_than_cuda_12_8s():
    """A Blackwell GPU needs CUDA 12.8, whose driver is R570: even a CUDA 12.x build cannot meet
    a driver before R550 there, so nothing reaches one and the answer says why."""
    kw = {"max_model_len": 32768}
    for version, software in (("0.19.0", None), ("0.26.0", {"cuda_version": "12.9"})):
        b = _serving(version, software, "rtx-5090-32gb", **kw)
        assumed = {x.name: x.assumed for x in b.stack.behaviours}["cuda_graph_driver"]
        assert assumed.startswith(
            "the NVIDIA driver is not named; NVIDIA GeForce RTX 5090 32GB (compute capability "
            "12.0: CUDA 12.8 or later) needs driver 570 or later, so R550 or later"
        ), assumed
        assert "software.cuda_version" not in assumed
        assert not any("R550" in w for w in b.warnings)
        assert "before R550" not in b.serving.kv_cache_tokens_band.basis


def test_a_fixed_kv_cache_keeps_its_pool_under_an_old_driver():
    """--kv-cache-memory fixes the pool: an old driver's graphs must fit beside it, so the
    answer speaks of graph memory, not of KV tokens, and the band (none with a given pool) is
    not moved."""
    b = _serving(
        "0.26.0",
        {"cuda_version": "12.9"},
        "h100-sxm5-80gb",
        max_model_len=32768,
        kv_cache_memory_bytes=8 * GiB,
    )
    assumed = {x.name: x.assumed for x in b.stack.behaviours}["cuda_graph_driver"]
    assert "GiB more CUDA-graph memory here" in assumed and "KV tokens fewer" not in assumed
    assert b.serving.kv_cache_tokens_band is None


def test_an_old_driver_beside_a_desktop_hold_and_a_launch_that_never_starts():
    """With a desktop's assumed hold the low end is the old driver's pool beside the hold's
    high end (there vLLM would not start: Llama 3.1 8B at 32,768 tokens on an RTX 4090 with
    Windows' hold), and the words say so; a launch that does not start under a current driver
    either (70B on one 4090) says nothing of the old one."""
    desk = {"source": "catalog", "id": "rtx-4090-24gb", "desktop_session": "windows"}
    b = _serving("0.26.0", {"cuda_version": "12.9"}, desk, max_model_len=32768)
    band = b.serving.kv_cache_tokens_band
    assert b.serving.would_start and band.low == 0
    assert band.basis.endswith(
        "the high end at its low end (beside that hold and under that driver vLLM would not start)"
    )
    assert "the low end at the high end of the windows desktop's assumed hold and under" in (
        band.basis
    )
    assumed = {x.name: x.assumed for x in b.stack.behaviours}["cuda_graph_driver"]
    assert ": vLLM would not start here (name the driver" in assumed
    big = _serving(
        "0.26.0",
        {"cuda_version": "12.9"},
        "rtx-4090-24gb",
        model={"source": "preset", "id": "llama-3.1-70b"},
        max_model_len=32768,
    )
    assert not big.serving.would_start
    assumed = {x.name: x.assumed for x in big.stack.behaviours}["cuda_graph_driver"]
    assert "takes about 3.35x as much (name the driver" in assumed


def test_a_fit_before_0_20_keeps_its_band():
    """Before 0.20 the graphs lie outside vLLM's budget: the fit's band and verdict are the
    current driver's whatever the build (the budget warns; see
    test_a_cuda_12_build_with_no_driver_named_says_what_an_old_driver_changes)."""
    from vrambudget.core.fit import FitRequest, fit

    def layout(software):
        req = msgspec.convert(
            {
                "workloads": [{"kind": "llm_serving", "model": LLAMA, "engine_version": "0.19.0"}],
                "devices": [{"source": "catalog", "id": "h100-sxm5-80gb"}],
                "solve": ["concurrency"],
                "target_concurrency": 10,
                **({"software": software} if software else {}),
            },
            FitRequest,
        )
        return fit(req).gpus[0].layouts[0]

    assert layout(None) == layout({"cuda_version": "12.8"})


def test_the_fit_verdict_reads_the_old_driver_band():
    """/v1/fits takes the same band: a target concurrency between the old-driver low end and
    the current driver's is 'fits only if near the low end' for a CUDA 12.9 build with no driver
    named, 'fits' for the default CUDA 13.0 build."""
    from vrambudget.core.fit import FitRequest, fit

    cu12 = _serving("0.26.0", {"cuda_version": "12.9"}, "h100-sxm5-80gb", max_model_len=32768)
    cu13 = _serving("0.26.0", None, "h100-sxm5-80gb", max_model_len=32768)
    target = (
        cu12.serving.kv_cache_tokens_band.max_concurrency_low
        + cu13.serving.kv_cache_tokens_band.max_concurrency_low
    ) / 2

    def verdict(software):
        req = msgspec.convert(
            {
                "workloads": [_workload("0.26.0", max_model_len=32768)],
                "devices": [{"source": "catalog", "id": "h100-sxm5-80gb"}],
                "solve": ["concurrency"],
                "target_concurrency": target,
                **({"software": software} if software else {}),
            },
            FitRequest,
        )
        return fit(req).gpus[0].layouts[0].verdict

    assert verdict({"cuda_version": "12.9"}) == "fits_if_low"
    assert verdict(None) == "fits"


def test_the_fit_counts_the_named_driver():
    """/v1/fits with software.driver_version: the same accounts the budget makes (0.26 on an
    A100 40GB: the KV pool, and so the concurrency, shrinks by the extra graph memory). A CUDA
    12.9 build: 0.26's own pin (torch 2.11, CUDA 13.0) needs driver 580."""
    from vrambudget.core.fit import FitRequest, fit

    def conc(software):
        req = msgspec.convert(
            {
                "workloads": [{"kind": "llm_serving", "model": LLAMA, "engine_version": "0.26.0"}],
                "devices": [{"source": "catalog", "id": "a100-sxm4-40gb"}],
                "solve": ["concurrency"],
                "software": {"cuda_version": "12.9", **software},
            },
            FitRequest,
        )
        return fit(req).gpus[0].layouts[0].maxima.max_concurrency

    w = _w(engine_version="0.26.0")
    arch = resolve_model(w.model)
    a100 = gpu("a100-sxm4-40gb")
    for driver in (None, "535.247.01"):
        want = account(w, arch, a100.memory_total_bytes, a100.name, 0, driver).max_concurrency
        assert conc({"driver_version": driver} if driver else {}) == round(want, 4)
    assert conc({"driver_version": "535.247.01"}) < conc({})


def test_remedies_are_checked_under_the_named_driver():
    """A refused engine's remedies re-run the account under the request's driver: 0.26 on an
    L4 at 131,072 tokens, driver 535 (graphs at 3.35x come out of the KV budget from 0.20).
    The largest max_model_len it suggests starts under that driver, and is smaller than the
    one suggested for a current driver."""
    from vrambudget.core.serving.budget import remedies

    l4 = gpu("l4-24gb")
    w = _w(engine_version="0.26.0", max_model_len=131072)
    arch = resolve_model(w.model)

    def suggested(driver):
        a = account(w, arch, l4.memory_total_bytes, l4.name, 0, driver)
        assert not a.would_start
        fix = remedies(w, a, l4.memory_total_bytes, l4.name, 0, driver)
        first = next(r for r in fix if r.startswith("lower max_model_len to "))
        return int(first.removeprefix("lower max_model_len to ").split(" ")[0])

    old, plain = suggested("535.247.01"), suggested(None)
    assert old < plain
    fixed = _w(engine_version="0.26.0", max_model_len=old)
    assert account(fixed, arch, l4.memory_total_bytes, l4.name, 0, "535.247.01").would_start
    over = _w(engine_version="0.26.0", max_model_len=plain)
    assert not account(over, arch, l4.memory_total_bytes, l4.name, 0, "535.247.01").would_start
