"""The vLLM engine account (vrambudget/core/serving/vllm.py): KV dtype, import-time workspaces."""

from __future__ import annotations

import math

import msgspec
import pytest

from research.engine_logs import QWEN_AWQ, preset_shapes
from tests.support.workloads import serving_budget
from vrambudget.core.catalog import gpus, preset_arch
from vrambudget.core.serving.vllm import account
from vrambudget.core.spec import LLMServingWorkload
from vrambudget.core.units import GiB

H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}


def serving(model: str, **fields: object) -> LLMServingWorkload:
    return msgspec.convert(
        {"kind": "llm_serving", "model": {"source": "preset", "id": model}, **fields},
        LLMServingWorkload,
    )


def test_fp8_kv_doubles_tokens_not_bytes():
    a16 = account(
        serving("llama-3.1-8b", max_model_len=8192, engine_version="0.19.0"),
        preset_arch("llama-3.1-8b"),
        80 * GiB,
        "H100",
    )
    a8 = account(
        serving("llama-3.1-8b", max_model_len=8192, kv_cache_dtype="fp8", engine_version="0.19.0"),
        preset_arch("llama-3.1-8b"),
        80 * GiB,
        "H100",
    )
    assert a8.stages[0].available_bytes == a16.stages[0].available_bytes  # same budget
    assert a8.num_blocks in (2 * a16.num_blocks, 2 * a16.num_blocks + 1)
    assert a8.kv_tokens in (2 * a16.kv_tokens, 2 * a16.kv_tokens + 16)
    assert abs(a8.pool_bytes(a8.stages[0]) - a16.pool_bytes(a16.stages[0])) <= 65_536 * 32


@pytest.mark.parametrize(
    ("gpu", "workspaces"),
    [
        ("NVIDIA H100 80GB HBM3", 1),
        ("NVIDIA B200 180GB", 2),
        ("AMD Instinct MI300X 192GB", 0),
        ("my custom GPU", 1),
    ],
)
def test_mla_import_workspaces_per_platform(gpu, workspaces):
    # FlashInfer-MLA's module allocates on import on any CUDA GPU; CUTLASS-MLA's (sm100 list
    # only) too on compute capability 10.x; ROCm imports neither.
    from vrambudget.core.serving.vllm import mla_import_workspaces

    assert mla_import_workspaces(gpu) == workspaces


@pytest.mark.parametrize(
    ("gpu", "fabric"),
    [
        ("NVIDIA H100 80GB HBM3", "nvlink"),  # NVSwitch board
        ("NVIDIA A100 SXM4 80GB", "nvlink"),
        ("NVIDIA H100 NVL", "nvlink"),  # NVLink bridge pairs
        ("AMD Instinct MI300X", "nvlink"),  # xGMI
        ("NVIDIA A100 80GB PCIe", "pcie"),
        ("NVIDIA L40S", "pcie"),
        ("NVIDIA GeForce RTX 3090", "pcie"),
        ("Tesla T4", "pcie"),
        ("my custom GPU", "nvlink"),  # unknown: the larger cost
    ],
)
def test_tensor_parallel_fabric_follows_the_catalog_interconnect(gpu, fabric):
    from vrambudget.core.serving.engine_args import tp_fabric

    assert tp_fabric(gpu) == fabric


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", "NVIDIA L40S", "my custom GPU"])
def test_no_peer_access_is_its_own_fabric_whatever_the_gpu(gpu):
    from vrambudget.core.serving.engine_args import tp_fabric

    assert tp_fabric(gpu, peer_access=False) == "no_p2p"
    assert tp_fabric(gpu, peer_access=True) == tp_fabric(gpu) == tp_fabric(gpu, None)


def test_no_peer_access_by_hand_on_vllm_0_10():
    """Qwen2.5-7B TP2 on A100 80GB, vLLM 0.10.1 (the NCCL communicators inside the budget: its
    init snapshot precedes init_worker_distributed_environment). Without peer access the
    non-torch increase is the one-GPU part plus ``tp_comm_pcie_bytes`` (268,435,456 +
    158,382,220 = 426,817,676 B) instead of the NVLink transfer value, and the communicators
    take the PCIe start (180,664,402 B) instead of ``nccl_init_bytes`` (1 GiB): the KV budget
    grows by (2,244,120,412 - 426,817,676) + (1,073,741,824 - 180,664,402) = 2,710,380,158 B."""
    from vrambudget.core.serving.calibration import calibration

    def one(**par: object):
        w = serving(
            "qwen2.5-7b",
            max_model_len=16384,
            gpu_memory_utilization=0.5,
            engine_version="0.10.1",
            parallelism={"tensor": 2, **par},
        )
        return account(w, preset_arch("qwen2.5-7b"), 85_100_000_000, "NVIDIA A100 SXM4 80GB")

    c = calibration("0.10.0").c  # 0.10.1 is modelled by 0.10.0
    assert round(c("non_torch_tp2_transfer_bytes")) == 2_244_120_412
    assert round(c("nccl_init_bytes")) == 1_073_741_824
    default, none = one().stages[0], one(peer_access=False).stages[0]
    assert (default.non_torch_bytes, default.nccl_init_bytes) == (2_244_120_412, 1_073_741_824)
    assert (none.non_torch_bytes, none.non_torch_comm_bytes) == (426_817_676, 158_382_220)
    assert none.nccl_init_bytes == 180_664_402
    assert none.available_bytes - default.available_bytes == 2_710_380_158
    assert one(peer_access=True).stages[0] == default  # A100 SXM4: NVSwitch, peers by default


def _non_torch(version: str, gpu: str, tensor: int) -> tuple[int, int]:
    a = account(
        serving(
            "llama-3.1-8b",
            max_model_len=8192,
            engine_version=version,
            parallelism={"tensor": tensor},
        ),
        preset_arch("llama-3.1-8b"),
        48 * GiB,
        gpu,
    )
    return a.stages[0].non_torch_bytes, a.stages[0].non_torch_comm_bytes


def test_tensor_parallel_non_torch_per_fabric_and_release():
    """The constants each (fabric, release, layout) takes, read from the calibration file by
    name: PCIe GPUs pay the one-GPU increase plus ``tp_comm_pcie_bytes`` at any TP; NVLink-class
    GPUs the H100 values on the calibrated release and the transfer values elsewhere."""
    from vrambudget.core.serving.calibration import CALIBRATED_VERSION, calibration

    c = calibration(CALIBRATED_VERSION).c
    base, pcie = round(c("non_torch_tp1_bytes")), round(c("tp_comm_pcie_bytes"))
    for version in (CALIBRATED_VERSION, "0.13.0", "0.10.0"):
        for tp in (2, 4):
            assert _non_torch(version, "NVIDIA L40S", tp) == (base + pcie, pcie)
        assert _non_torch(version, "NVIDIA L40S", 1) == (base, 0)
    assert _non_torch(CALIBRATED_VERSION, "my GPU", 2)[0] == round(c("non_torch_tp2_bytes"))
    assert _non_torch(CALIBRATED_VERSION, "my GPU", 4)[0] == round(c("non_torch_tp4_bytes"))
    assert _non_torch("0.13.0", "my GPU", 2)[0] == round(c("non_torch_tp2_transfer_bytes"))
    assert _non_torch("0.13.0", "my GPU", 8)[0] == round(c("non_torch_tp4_transfer_bytes"))
    # the transfer values never undercut the calibrated ones; PCIe stays below both
    assert c("non_torch_tp4_transfer_bytes") >= c("non_torch_tp4_bytes")
    assert c("non_torch_tp2_transfer_bytes") >= c("non_torch_tp2_bytes")
    assert base + pcie < c("non_torch_tp2_bytes")


def test_kv_tokens_band_by_hand_on_the_calibrated_release_and_gpu():
    """Llama 3.1 8B on the calibrated release and GPU: the band moves the KV budget by
    ``kv_band_calibrated_bytes``; a page is 16 tokens x 8 KV heads x 128 x 2 (K, V) x 2 bytes =
    65,536 B for each of the 32 layers."""
    from vrambudget.core.serving.calibration import CALIBRATED_VERSION, calibration
    from vrambudget.core.serving.vllm import kv_band

    w = serving("llama-3.1-8b", max_model_len=8192, engine_version=CALIBRATED_VERSION)
    a = account(w, preset_arch("llama-3.1-8b"), 85_030_000_000, "NVIDIA H100 80GB HBM3")
    avail = a.stages[0].available_bytes
    u = round(calibration(CALIBRATED_VERSION).c("kv_band_calibrated_bytes"))
    band = kv_band(w, a, "NVIDIA H100 80GB HBM3")
    assert band is not None
    low, high, basis = band.low, band.high, band.basis
    assert low == (avail - u) // 65_536 // 32 * 16
    assert high == (avail + u) // 65_536 // 32 * 16
    assert low <= a.kv_tokens <= high
    assert "0.19.0 H100 launches" in basis


@pytest.mark.parametrize(
    ("version", "gpu"),
    [("0.13.0", "NVIDIA H100 80GB HBM3"), ("0.19.0", "NVIDIA L40S"), ("0.19.0", "my GPU")],
)
def test_kv_tokens_band_is_the_transfer_one_off_the_calibrated_release_or_gpu(version, gpu):
    from vrambudget.core.serving.calibration import CALIBRATED_VERSION, calibration
    from vrambudget.core.serving.vllm import kv_band

    w = serving("llama-3.1-8b", max_model_len=8192, engine_version=version)
    a = account(w, preset_arch("llama-3.1-8b"), 48 * GiB, gpu)
    u = round(calibration(CALIBRATED_VERSION).c("kv_band_transfer_bytes"))
    band = kv_band(w, a, gpu)
    assert band is not None
    low, high, basis = band.low, band.high, band.basis
    avail = a.stages[0].available_bytes
    assert (low, high) == (
        (avail - u) // 65_536 // 32 * 16,
        (avail + u) // 65_536 // 32 * 16,
    )
    assert "other releases and GPUs" in basis


def test_kv_tokens_band_in_the_answer_and_none_with_a_given_pool():
    def budget(**fields: object):
        return serving_budget("l40s-48gb", max_model_len=8192, **fields)

    sv = budget().serving
    assert sv is not None and sv.kv_cache_tokens_band is not None
    assert sv.kv_cache_tokens_band.low < sv.kv_cache_tokens < sv.kv_cache_tokens_band.high
    given = budget(kv_cache_memory_bytes=20 * GiB).serving
    assert given is not None and given.kv_cache_tokens_band is None


def test_plain_awq_kernel_adds_its_dequantized_weight_to_the_forward_peak():
    """``--quantization awq`` (named) runs vLLM's own AWQ kernel, which from 256 tokens
    dequantizes a whole merged weight before the matmul: Qwen2.5-14B's gate_up is 5,120 x
    (2 x 13,824) x 2 B = 283,115,520 B on one GPU. With 16 sequences the forward, not the
    sampler, sets the profile peak, so the peak grows by exactly that."""
    import dataclasses

    from vrambudget.core.serving.engine_args import _layout, serving_quantization
    from vrambudget.core.serving.quantities import activation_peak_bytes
    from vrambudget.core.serving.vllm import _statics

    arch = preset_arch("qwen2.5-14b")
    w = serving(
        "qwen2.5-14b",
        max_model_len=8192,
        max_num_seqs=16,
        engine_version="0.13.0",
        quantization={"method": "awq"},
    )
    a = account(w, arch, 85_030_000_000, "NVIDIA H100 80GB HBM3")
    r = a.resolved
    assert r.plain_awq
    st = _statics(arch, r.dtype, serving_quantization(w), _layout(arch, r))[0]
    marlin = dataclasses.replace(r, plain_awq=False)
    assert a.stages[0].activation_bytes == activation_peak_bytes(arch, st, r)
    assert (
        activation_peak_bytes(arch, st, r) - activation_peak_bytes(arch, st, marlin)
        == 5_120 * 2 * 13_824 * 2
    )


# Qwen/Qwen2.5-14B-Instruct-AWQ: the preset's Qwen2.5-14B config with Qwen's AWQ block, as the
# held-out logs re-create it
QWEN25_14B_AWQ_MODEL = preset_shapes(
    "qwen2.5-14b", torch_dtype="float16", quantization_config=QWEN_AWQ
)


@pytest.mark.parametrize(
    ("gpu_id", "kernel"),
    [
        ("a100-sxm4-80gb", "awq_marlin"),  # 8.0: Marlin
        ("l40s-48gb", "awq_marlin"),  # 8.9
        ("t4-16gb", "awq"),  # 7.5: no Marlin types below 8.0
        ("mi300x-192gb", "awq"),  # ROCm: is_awq_marlin_compatible is False off CUDA
    ],
)
def test_a_detected_awq_checkpoint_runs_marlin_only_from_capability_8(gpu_id, kernel):
    """vLLM converts a detected AWQ checkpoint to Marlin (``awq_marlin.py``
    ``override_quantization_method``) only on CUDA GPUs of compute capability 8.0 or newer;
    elsewhere its own kernel runs, and that kernel's dequantized gate_up (5,120 x 27,648 x 2 B
    = 283,115,520 B) is in the profile's forward peak."""
    from vrambudget.core.catalog import gpu
    from vrambudget.core.serving.engine_args import awq_kernel

    w = _awq_checkpoint()
    g = gpu(gpu_id)
    assert awq_kernel(w, g.name) == kernel
    # naming the flag keeps vLLM's own kernel on every GPU
    named = msgspec.convert(
        {**msgspec.to_builtins(w), "quantization": {"method": "awq"}}, LLMServingWorkload
    )
    assert awq_kernel(named, g.name) == "awq"
    a = account(w, preset_arch("qwen2.5-14b"), g.memory_total_bytes, g.name)
    marlin = account(w, preset_arch("qwen2.5-14b"), g.memory_total_bytes, "NVIDIA H100 80GB HBM3")
    extra = a.stages[0].activation_bytes - marlin.stages[0].activation_bytes
    assert extra == (5_120 * 2 * 13_824 * 2 if kernel == "awq" else 0)


def _awq_checkpoint(**fields: object) -> LLMServingWorkload:
    return msgspec.convert(
        {
            "kind": "llm_serving",
            "engine_version": "0.13.0",
            "model": QWEN25_14B_AWQ_MODEL,
            "max_model_len": 4096,
            "max_num_seqs": 16,
            "max_num_batched_tokens": 2048,
            **fields,
        },
        LLMServingWorkload,
    )


def test_vllm_refuses_awq_below_turing_and_in_bfloat16_as_it_says():
    """``vllm/config/vllm.py`` ``_get_quantization_config``: AWQ's minimum capability is 75
    (V100 is 70), and the plain kernel runs in float16 only (``awq.py``
    ``get_supported_act_dtypes``); Marlin also takes bfloat16."""
    from vrambudget.core.catalog import gpu

    v100 = gpu("v100-sxm2-32gb")
    a = account(_awq_checkpoint(), preset_arch("qwen2.5-14b"), v100.memory_total_bytes, v100.name)
    assert not a.would_start
    assert a.reason == (
        "The quantization method awq is not supported for the current GPU. Minimum "
        "capability: 75. Current capability: 70."
    )
    t4 = gpu("t4-16gb")
    bf16 = account(
        _awq_checkpoint(dtype="bfloat16", max_model_len=1024),
        preset_arch("qwen2.5-14b"),
        t4.memory_total_bytes,
        t4.name,
    )
    assert not bf16.would_start and bf16.reason is not None
    assert bf16.reason.startswith("torch.bfloat16 is not supported for quantization method awq")
    a100 = gpu("a100-sxm4-80gb")
    ok = account(
        _awq_checkpoint(dtype="bfloat16"),
        preset_arch("qwen2.5-14b"),
        a100.memory_total_bytes,
        a100.name,
    )
    assert ok.would_start, ok.reason


def test_sampler_warm_up_sorts_the_vocabulary_before_the_triton_kernel():
    """Qwen3-30B-A3B on an H100 (S = 1,024 rows, T = 8,192 tokens, V = 151,936). Up to 0.16
    the dummy sampler run's top-k/top-p sorts the float32 logits: 2 (bf16 logits) + 4 (float32
    copy) + 12 (sorted values, indices) + 8 (torch's reverse indices) + 12 (CUB's alternate
    buffers) = 38 B per element from 128 rows. vLLM 0.10.2 printed "5.58 GiB for peak
    activation" for this launch (research/data/engine_logs.json,
    vllm-kolyangg-qwen3-30b-a3b-2507-h100-6k); the count gives 5.53 GiB (-0.8%). From 0.14 the
    Triton experts' workspaces (8,192 x 8 x (max(768, 2,048) + max(1,536, 2,048)) x 2 =
    536,870,912 B) stay allocated under the sampler; 0.17 on runs the Triton kernel (the
    calibrated 0.19.0 constant)."""
    import math

    from vrambudget.core.serving.quantities import sort_sampler_bytes_per_logit

    arch = preset_arch("qwen3-30b-a3b")

    def act(version: str, **fields: object) -> tuple[int, float]:
        a = account(
            serving("qwen3-30b-a3b", max_model_len=6144, engine_version=version, **fields),
            arch,
            85_520_809_984,  # 79.65 GiB: an H100 SXM as torch reports it
            "NVIDIA H100 80GB HBM3",
        )
        return a.stages[0].activation_bytes, a.resolved.cal.c("sampler_hidden_copies")

    rows, vocab, hidden = 1024 * 151_936, 151_936, 8192 * 2048 * 2
    a10, hc = act("0.10.2")
    assert a10 == math.ceil(38 * rows + hc * hidden)
    assert abs(a10 / GiB - 5.58) / 5.58 < 0.01
    a15, _ = act("0.15.0")
    assert a15 == a10 + 536_870_912  # the workspace manager keeps the MoE workspaces
    a19, _ = act("0.19.0")
    assert a19 < a15 - 3 * GiB  # no sort
    assert sort_sampler_bytes_per_logit(64, 2) == 46  # 8-127 rows: by_full_sort's int2 arrays
    assert sort_sampler_bytes_per_logit(256, 2) == 38
    assert vocab == arch.vocab_size


def test_kv_band_high_end_takes_flashinfer_where_the_install_decides():
    """0.10-0.11 sort unless the optional flashinfer package is installed (vLLM's Docker image
    has it): the estimate takes the sort (fewer KV tokens), the band's high end the FlashInfer
    path on top of its usual width."""
    from vrambudget.core.serving.vllm import kv_band

    arch = preset_arch("qwen2.5-7b")
    w = serving("qwen2.5-7b", max_model_len=16384, engine_version="0.10.1")
    a = account(w, arch, 85_100_000_000, "NVIDIA A100-SXM4-80GB")
    st = a.stages[0]
    assert st.activation_low_bytes < st.activation_bytes
    band = kv_band(w, a, "NVIDIA A100-SXM4-80GB")
    assert band is not None and "flashinfer" in band.basis
    w13 = serving("qwen2.5-7b", max_model_len=16384, engine_version="0.13.0")
    a13 = account(w13, arch, 85_100_000_000, "NVIDIA A100-SXM4-80GB")
    assert a13.stages[0].activation_low_bytes == a13.stages[0].activation_bytes
    b13 = kv_band(w13, a13, "NVIDIA A100-SXM4-80GB")
    assert b13 is not None and "flashinfer" not in b13.basis
    # same width below, wider above by the sort the FlashInfer path skips
    assert a.kv_tokens - band.low == a13.kv_tokens - b13.low
    assert band.high - a.kv_tokens > b13.high - a13.kv_tokens


@pytest.mark.parametrize(
    ("version", "words"),
    [("0.10.1", "without the optional flashinfer"), ("0.13.0", "sorts"), ("0.19.0", "Triton")],
)
def test_the_answer_names_the_warm_up_sampler_it_assumed(version, words):
    b = serving_budget("l40s-48gb", max_model_len=8192, engine_version=version)
    assert b.stack is not None
    sampler = [x for x in b.stack.behaviours if x.name == "warmup_sampler"]
    assert len(sampler) == 1 and words in sampler[0].assumed
    assert "topk_topp_sampler.py" in sampler[0].source


def test_flashinfer_sampler_named_skips_the_sort_and_is_in_the_launch():
    """``flashinfer_sampler: true`` is ``VLLM_USE_FLASHINFER_SAMPLER=1``: the warm-up sorts
    nothing in any release; on 0.10-0.11 it says flashinfer is installed (vLLM's Docker image),
    so the band no longer widens for it."""
    from vrambudget.core.serving.budget import vllm_launch
    from vrambudget.core.serving.vllm import kv_band

    arch = preset_arch("qwen2.5-7b")
    name = "NVIDIA A100-SXM4-80GB"
    default = serving("qwen2.5-7b", max_model_len=16384, engine_version="0.10.1")
    named = serving(
        "qwen2.5-7b", max_model_len=16384, engine_version="0.10.1", flashinfer_sampler=True
    )
    a, b = account(default, arch, 85_100_000_000, name), account(named, arch, 85_100_000_000, name)
    assert b.stages[0].activation_bytes == a.stages[0].activation_low_bytes
    assert b.stages[0].activation_low_bytes == b.stages[0].activation_bytes
    assert b.kv_tokens > a.kv_tokens
    band = kv_band(named, b, name)
    assert band is not None and "flashinfer" not in band.basis
    assert vllm_launch(named, b).startswith("VLLM_USE_FLASHINFER_SAMPLER=1 vllm serve ")
    sorted13 = serving("qwen2.5-7b", max_model_len=16384, engine_version="0.13.0")
    fi13 = serving(
        "qwen2.5-7b", max_model_len=16384, engine_version="0.13.0", flashinfer_sampler=True
    )
    a13 = account(sorted13, arch, 85_100_000_000, name)
    b13 = account(fi13, arch, 85_100_000_000, name)
    assert b13.stages[0].activation_bytes < a13.stages[0].activation_bytes
    with pytest.raises(msgspec.ValidationError, match="flashinfer_sampler is a vLLM setting"):
        msgspec.convert(
            {
                "kind": "llm_serving",
                "engine": "sglang",
                "model": {"source": "preset", "id": "qwen2.5-7b"},
                "flashinfer_sampler": True,
            },
            LLMServingWorkload,
        )


def test_data_parallel_spreads_a_moe_models_experts_over_the_replicas():
    """``--data-parallel-size 2`` for a MoE model: vLLM spreads the routed experts over the
    tensor x data ranks -- whole experts with ``--enable-expert-parallel``, each expert split by
    tensor parallelism without it (fused_moe/config.py ``FusedMoEParallelConfig.make``), the
    same bytes either way. Qwen3-30B-A3B (48 layers of 128 experts, each gate, up and down
    2,048 x 768 in bf16) holds half its expert bytes per GPU, everything else whole as with one
    GPU: 48 x 128 x 3 x 2,048 x 768 x 2 B / 2 = 28,991,029,248 B fewer weights. The replicas
    all-gather their tokens before the experts, so the profile run's fused-MoE workspaces hold
    T x 2 rows: T = 8,192 (a 96 GB GPU's default) x 2 x 8 experts per token x (max(768, 2,048)
    + max(2 x 768, 2,048)) x 2 B = 1,073,741,824 B against 536,870,912 for one replica (x the
    release's scale). The first layout was refused before ('2 must divide tensor x data = 1
    devices'); the second counted every expert whole on every GPU."""
    arch = preset_arch("qwen3-30b-a3b")
    assert (arch.num_layers, arch.moe.num_experts, arch.hidden_size) == (48, 128, 2048)
    assert (arch.moe.experts_per_token, arch.moe.expert_intermediate_size) == (8, 768)
    from vrambudget.core.serving.calibration import calibration

    def one(**par: object):
        w = serving("qwen3-30b-a3b", engine_version="0.28.0", parallelism=par)
        return account(w, arch, 101_976_440_832, "NVIDIA RTX PRO 6000 Blackwell Server Edition")

    single, ep = one().stages[0], one(data=2, enable_expert_parallel=True).stages[0]
    assert single.weights_bytes - ep.weights_bytes == 28_991_029_248
    scale = calibration("0.28.0").c("moe_workspace_scale")
    more = math.ceil(scale * 1_073_741_824) - math.ceil(scale * 536_870_912)
    assert ep.activation_bytes - single.activation_bytes == more
    assert ep.available_bytes - single.available_bytes == 28_991_029_248 - more
    assert one(data=2).stages[0] == ep  # split experts, the same bytes


def test_data_parallel_experts_that_do_not_divide_are_counted_whole_not_refused():
    """vLLM splits each expert's width over tensor x data ranks without expert parallelism, so
    Qwen3-30B-A3B's 128 experts over three replicas (768 / 3 = 256 wide) start; the budget
    cannot split 128 experts three ways and counts every expert whole on every GPU (more than
    it holds), as one GPU does, instead of refusing the launch."""
    arch = preset_arch("qwen3-30b-a3b")

    def one(**par: object):
        w = serving("qwen3-30b-a3b", engine_version="0.28.0", parallelism=par)
        return account(w, arch, 85_045_477_376, "NVIDIA H100 80GB HBM3")

    three = one(data=3)
    assert three.would_start
    assert three.stages[0].weights_bytes == one().stages[0].weights_bytes


def test_a_smaller_token_budget_is_a_checked_remedy():
    """DeepSeek-V3 over eight H200s as data-parallel replicas with expert parallelism gathers
    8 x 8,192 rows into its fused MoE during the profile run, and one 163,840-token request no
    longer fits beside them. A smaller max_num_batched_tokens is named as a remedy: the largest
    budget that starts, checked both ways here."""
    import re

    par = {"data": 8, "enable_expert_parallel": True}
    s = serving_budget("h200-sxm-141gb", "deepseek-v3", parallelism=par).serving
    assert s is not None and not s.would_start
    (remedy,) = [x for x in s.remedies if x.startswith("lower max_num_batched_tokens")]
    found = re.search(r"to (\d+) ", remedy)
    assert found is not None
    x = int(found.group(1))
    arch = preset_arch("deepseek-v3")
    total = gpus()["h200-sxm-141gb"].memory_total_bytes

    def starts(tokens: int) -> bool:
        w = serving("deepseek-v3", parallelism=par, max_num_batched_tokens=tokens)
        return account(w, arch, total, "NVIDIA H200 SXM 141GB").would_start

    assert 1 <= x < 8192 and starts(x) and not starts(x + 1)
