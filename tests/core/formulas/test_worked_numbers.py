"""The formula modules: one per component, each with the words shown in answers, a source, and a
worked number in a docstring that is computed here by hand and by the function, and must be the
number the docstring prints (so the documentation cannot drift from the code)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

import pytest

from vrambudget.core.catalog import preset_arch
from vrambudget.core.components import Component
from vrambudget.core.formulas import (
    MODULES,
    TEXTS,
    adapters,
    allocator_overhead,
    communication_buffers,
    cuda_context,
    gradients,
    headroom,
    kv_cache,
    logits,
    master_weights,
    optimizer_state,
    quantization_metadata,
    runtime_workspace,
    weights,
)
from vrambudget.core.spec import GPTQ, AdamW, AdamW8bit, Headroom
from vrambudget.core.units import GiB, MiB


def _documented(obj: Callable[..., object] | ModuleType, number: int) -> None:
    text = inspect.getdoc(obj) or ""
    assert f"{number:,}" in text, f"{obj.__name__}'s docstring does not show {number:,}"


def test_one_module_per_component_with_words_and_source() -> None:
    assert set(MODULES) == set(Component)
    for component, module in MODULES.items():
        assert module.FORMULA and module.SOURCE, component
        assert TEXTS[component] == (module.FORMULA, module.SOURCE)
        assert module.__doc__ and module.FORMULA.split()[0] in module.__doc__, (
            f"{module.__name__}: its docstring shows the words of the answer"
        )


def test_weights() -> None:
    assert weights.stored_bytes(4096, 4096, 2, None) == (4096 * 4096 * 2, 0) == (33_554_432, 0)
    _documented(weights.stored_bytes, 33_554_432)
    assert preset_arch("llama-3.1-8b").num_params * 2 == 16_060_522_496
    _documented(weights.stored_bytes, 16_060_522_496)


def test_quantization_metadata() -> None:
    q = GPTQ(bits=4, group_size=128)
    # scales 32 groups x 4096 fp16; qzeros 32 x 4096/8 int32; g_idx 4096 int32
    by_hand = 32 * 4096 * 2 + 32 * (4096 * 4 // 32) * 4 + 4096 * 4
    assert quantization_metadata.metadata_bytes(q, 4096, 4096) == by_hand == 344_064
    _documented(quantization_metadata, 344_064)
    assert weights.stored_bytes(4096, 4096, 2, q)[0] == 4096 * 4096 // 8 * 4 == 8_388_608
    _documented(quantization_metadata, 8_388_608)


def test_adapters() -> None:
    assert adapters.lora_params(16, 4096, 4096) == 16 * 8192 == 131_072
    _documented(adapters.lora_params, 131_072)
    _documented(adapters.lora_params, 131_072 * 4)


def test_kv_cache() -> None:
    arch = preset_arch("llama-3.1-8b")
    assert kv_cache.elems_per_token(arch, 1) == 2 * 8 * 128 == 2_048
    assert kv_cache.elems_per_token(preset_arch("deepseek-v2-lite"), 4) == 512 + 64
    full = 32 * 2_048
    assert kv_cache.cache_bytes(full, (), 8, 4_608, 2) == 8 * 2 * full * 4_608 == 4_831_838_208
    _documented(kv_cache.cache_bytes, 4_831_838_208)
    # a sliding layer caches at most its window
    assert kv_cache.cache_bytes(0, ((1024, 100),), 1, 4096, 2) == 100 * 1024 * 2
    assert kv_cache.model_bytes_per_token(arch, 2) == 32 * 2_048 * 2 == 131_072
    _documented(kv_cache.model_bytes_per_token, 131_072)
    # Mamba-130m: per layer conv 1,536 x 4 (bf16) and SSM 1,536 x 16 (fp32), 24 layers, 8 seqs.
    state = kv_cache.state_bytes(24 * 1_536 * 4, 24 * 1_536 * 16 * 4, 8, 2)
    assert state == 8 * (24 * 6_144 * 2 + 24 * 24_576 * 4) == 21_233_664
    _documented(kv_cache.state_bytes, 21_233_664)


def test_logits() -> None:
    assert logits.inference_logits(8, 128_256, 128_256, 2) == 8 * 128_256 * 6 == 6_156_288
    _documented(logits.inference_logits, 6_156_288)
    fwd = sum(b for _, b in logits.training_forward_parts(4_096, 128_256, 2))
    assert fwd == 4_096 * 128_256 * 10 == 5_253_365_760
    _documented(logits.training_forward_parts, 5_253_365_760)
    assert sum(b for _, b in logits.training_backward_parts(10, 7)) == 10 * 7 * 12
    # fp32 logits: .float() returns them, no copy (logits + fp32 log-softmax)
    assert sum(b for _, b in logits.training_forward_parts(10, 7, 4)) == 10 * 7 * 8 == 560


def test_logits_without_the_fp32_upcast() -> None:
    """F.cross_entropy on bf16 logits (a hand-written loop over a bf16 model): the logits and
    the bf16 log-softmax in the forward; the saved log-softmax and two bf16 gradients at the
    backward's start. 4,096 tokens x 128,256 x 2 x 2 = 2,101,346,304 B; x 3 x 2 =
    3,152,019,456 B."""
    loss = "cross_entropy_no_upcast"
    fwd = logits.training_forward_parts(4_096, 128_256, 2, loss)
    assert sum(b for _, b in fwd) == 4_096 * 128_256 * 4 == 2_101_346_304
    bwd = logits.training_backward_parts(4_096, 128_256, loss, 1, 2)
    assert sum(b for _, b in bwd) == 4_096 * 128_256 * 6 == 3_152_019_456


def test_gradients_master_weights_optimizer_state() -> None:
    qwen = preset_arch("qwen2.5-0.5b").num_params
    assert qwen == 494_032_768
    assert qwen * gradients.grad_dtype_bytes(True, "pure", 2) == 988_065_536
    _documented(gradients.grad_dtype_bytes, 988_065_536)
    assert gradients.grad_dtype_bytes(True, "autocast", 4) == 4
    assert gradients.grad_dtype_bytes(False, "autocast", 2) == 2  # adapters keep their dtype
    llama = preset_arch("llama-3.1-8b").num_params
    assert llama * master_weights.master_bytes_per_param("master_fp32", 2) == 32_121_044_992
    _documented(master_weights.master_bytes_per_param, 32_121_044_992)
    assert master_weights.master_bytes_per_param("master_fp32", 4) == 0
    n = 4096 * 4096
    assert optimizer_state.state_bytes(AdamW(), [(4096, 4096, 1)], 4) == 2 * n * 4 == 134_217_728
    assert (
        optimizer_state.state_bytes(AdamW8bit(), [(4096, 4096, 1)], 4)
        == (2 * n + 2 * (n // 256) * 4)
        == 34_078_720
    )
    _documented(optimizer_state.state_bytes, 134_217_728)
    _documented(optimizer_state.state_bytes, 34_078_720)
    assert optimizer_state.step_temporaries(AdamW(), qwen, 0, 4) == 1_976_131_072
    _documented(optimizer_state.step_temporaries, 1_976_131_072)


def test_overheads() -> None:
    assert (
        cuda_context.per_device(cuda_context.default_context("9.0", "nvidia")[0], 2)
        == (2 * 534 * MiB)
        == 1_119_879_168
    )
    _documented(cuda_context.per_device, 1_119_879_168)
    assert cuda_context.default_context("8.9", "nvidia")[0] == 426 * MiB
    # torch 2.15 (current): cuBLASLt shares the cuBLAS workspace; 32 MiB for major 9-12.
    ws = runtime_workspace.default_workspace
    assert ws("9.0", "nvidia", None)[0] == 32 * MiB == 33_554_432
    assert ws("8.0", "nvidia", None)[0] == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680
    assert ws("11.0", "nvidia", None)[0] == 33_554_432
    # torch 2.0-2.11: 32 MiB for 9.0 only, plus a cuBLASLt workspace of 1 MiB.
    assert ws("9.0", "nvidia", None, (2, 11, 0))[0] == 32 * MiB + MiB == 34_603_008
    assert ws("8.0", "nvidia", None, (2, 11, 0))[0] == 8_519_680 + MiB == 9_568_256
    assert ws("10.0", "nvidia", None, (2, 11, 0))[0] == 9_568_256
    # torch 2.12: major 9, 10 and 12 (not 11).
    assert ws("10.0", "nvidia", None, (2, 12, 0))[0] == 33_554_432
    assert ws("11.0", "nvidia", None, (2, 12, 0))[0] == 8_519_680
    _documented(runtime_workspace.default_workspace, 33_554_432)
    _documented(runtime_workspace.default_workspace, 9_568_256)
    parts = communication_buffers.stage_parts(1, 1, 8, 0, True, 494_032_768, 2, 0, 0, 2)
    assert parts == [
        ("NCCL data-parallel communicator (8 ranks)", 688 * 10**6),
        ("DDP gradient buckets (a copy of the gradients)", 988_065_536),
    ]
    _documented(communication_buffers.stage_parts, 988_065_536)
    assert communication_buffers.calibrated(1, (("NCCL x", 1), ("bucket", 5)), 7) == (
        12,
        (("NCCL x", 7), ("bucket", 5)),
    )


def test_allocator_overhead_and_headroom() -> None:
    assert allocator_overhead.block_rounding(1_000) == 24
    assert allocator_overhead.block_rounding(8_192) == 0
    _documented(allocator_overhead.block_rounding, 1_024)
    ppm = allocator_overhead.ppm(allocator_overhead.INFERENCE_FRAGMENTATION_FRACTION)
    assert allocator_overhead.fragmentation(GiB, ppm) == -(-GiB * 34 // 100) == 365_072_221
    _documented(allocator_overhead.fragmentation, 365_072_221)
    assert allocator_overhead.overhead(24, GiB, ppm) == 24 + 365_072_221
    assert (
        headroom.headroom_bytes(20_000_000_000, Headroom(fraction=0.05, min_bytes=GiB))
        == (GiB)
        == 1_073_741_824
    )
    assert headroom.headroom_bytes(20_000_000_000, Headroom(fraction=0.1)) == 2_000_000_000
    _documented(headroom.headroom, 1_073_741_824)


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 10**12 + 7])
def test_fragmentation_is_exact_integer_ceiling(size: int) -> None:
    ppm = 340_000
    assert allocator_overhead.fragmentation(size, ppm) * 1_000_000 >= size * ppm
    assert (allocator_overhead.fragmentation(size, ppm) - 1) * 1_000_000 < size * ppm
