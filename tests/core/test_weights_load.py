"""The segments a model's weights reserve when allocated one after another
(vrambudget/core/allocator/weights_load.py), against CUDACachingAllocator.cpp's sizes worked by
hand, and the tensors SGLang allocates for one rank (vrambudget/core/serving/loaded_tensors.py)."""

from __future__ import annotations

from vrambudget.core.allocator.weights_load import loaded_reserved_bytes
from vrambudget.core.resolve import resolve_model
from vrambudget.core.serving.loaded_tensors import loaded_tensors
from vrambudget.core.spec import Precision, PresetModel

MiB = 1 << 20


def test_a_large_tensor_gets_its_own_segment_rounded_to_2_mib() -> None:
    """Above 10 MiB, ``get_allocation_size`` rounds up to 2 MiB (kRoundLarge): 17.5 MiB takes 18,
    12.5 takes 14, 85 takes 86, 42.5 takes 44 (Qwen3-14B's fused projections on one of four
    ranks): 162 MiB for 157.5 MiB of tensors."""
    assert loaded_reserved_bytes((17 * MiB + MiB // 2,)) == 18 * MiB
    layer = (17 * MiB + MiB // 2, 12 * MiB + MiB // 2, 85 * MiB, 42 * MiB + MiB // 2)
    assert loaded_reserved_bytes(layer) == (18 + 14 + 86 + 44) * MiB


def test_medium_tensors_share_20_mib_segments_and_small_ones_2_mib() -> None:
    """1 - 10 MiB requests share kLargeBuffer segments (20 MiB): 8 + 6 + 4 MiB fit one, a
    fourth of 4 MiB opens a second; requests of at most 1 MiB share kSmallBuffer (2 MiB)
    segments: three of 2 KiB take one."""
    assert loaded_reserved_bytes((8 * MiB, 6 * MiB, 4 * MiB)) == 20 * MiB
    assert loaded_reserved_bytes((8 * MiB, 6 * MiB, 4 * MiB, 4 * MiB)) == 40 * MiB
    assert loaded_reserved_bytes((2048, 2048, 2048)) == 2 * MiB
    assert loaded_reserved_bytes((0, 2048)) == 2 * MiB  # nothing allocated for an empty tensor


def test_sglang_fuses_qkv_and_gate_up_per_rank() -> None:
    """Qwen2.5-32B (QwQ-32B's shapes: hidden 5,120, 40 x 128 query and 8 x 128 key/value heads,
    MLP 27,648, 64 layers) in bf16 over 4 ranks: each layer allocates qkv_proj 5,120 x (5,120 +
    2 x 1,024) / 4 x 2 B and its fused bias, o_proj 5,120 / 4 x 5,120 x 2 B, gate_up_proj 2 x
    27,648 / 4 x 5,120 x 2 B and down_proj 27,648 / 4 x 5,120 x 2 B: segments of 18, 14, 136
    and 68 MiB for 17.5, 12.5, 135 and 67.5, 3.5 MiB a layer, 224 MiB over 64 -- the 0.22 GiB
    that SGLang 0.4.3's log on 4 x L4 prints above the tensors."""
    arch = resolve_model(PresetModel(id="qwen2.5-32b"))
    sizes = loaded_tensors(arch, Precision(weights="bf16", compute="bf16", quantization=None), 4)
    projections = (
        5_120 * 7_168 // 4 * 2,
        5_120 // 4 * 5_120 * 2,
        2 * 27_648 // 4 * 5_120 * 2,
        27_648 // 4 * 5_120 * 2,
    )
    assert projections == (18_350_080, 13_107_200, 141_557_760, 70_778_880)
    for size in projections:
        assert sizes.count(size) == 64
    assert sizes.count(7_168 // 4 * 2) == 64  # the fused q/k/v bias
    per_layer = loaded_reserved_bytes(projections)
    assert per_layer - sum(projections) == 3 * MiB + MiB // 2


def test_sglang_stacks_the_routed_experts_gate_and_up_in_one_tensor() -> None:
    """FusedMoE's w13_weight: Qwen3-30B-A3B's 128 experts of 768 x 2,048 gate and up
    projections on one rank, 128 x 2 x 768 x 2,048 x 2 B = 805,306,368 B, and w2_weight 128 x
    2,048 x 768 x 2 B = 402,653,184 B, once per layer (48 layers)."""
    arch = resolve_model(PresetModel(id="qwen3-30b-a3b"))
    sizes = loaded_tensors(arch, Precision(weights="bf16", compute="bf16", quantization=None), 1)
    assert sizes.count(128 * 2 * 768 * 2_048 * 2) == 48
    assert sizes.count(128 * 2_048 * 768 * 2) == 48
