"""Numbers with an exact answer, each against an independent hand computation (the expected
values are written out, not computed by the code under test)."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.workloads import workload
from vrambudget.core.catalog import preset_arch
from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate

C = Component


def lines(budget, index=None):
    device = budget.devices[budget.most_loaded if index is None else index]
    return {line.component: line.bytes for line in device.lines}


def infer(model_id, **kw):
    return workload(kind="inference", model={"source": "preset", "id": model_id}, **kw)


def train(model_id, **kw):
    return workload(kind="training", model={"source": "preset", "id": model_id}, **kw)


def test_llama2_7b_parameters_and_bf16_weights():
    # Meta's Llama-2-7b-hf checkpoint: 6,738,415,616 parameters; bf16 = 2 bytes each.
    assert preset_arch("llama-2-7b").num_params == 6_738_415_616
    assert lines(estimate((infer("llama-2-7b"),)))[C.WEIGHTS] == 13_476_831_232


def test_llama31_8b_kv_cache_is_131072_bytes_per_token():
    # 32 layers x 2 (K, V) x 8 KV heads x 128 head_dim x 2 bytes = 131,072 B per token.
    one = infer("llama-3.1-8b", prompt_tokens=1000, generated_tokens=24)
    assert lines(estimate((one,)))[C.KV_CACHE] == 131_072 * 1024
    many = infer(
        "llama-3.1-8b", prompt_tokens=1000, generated_tokens=24, batch_size=3, concurrent_requests=5
    )
    assert lines(estimate((many,)))[C.KV_CACHE] == 131_072 * 1024 * 15


def test_fp8_kv_cache_halves_bytes():
    w = infer(
        "llama-3.1-8b", prompt_tokens=4096, generated_tokens=0, precision={"kv_cache": "fp8_e4m3"}
    )
    assert lines(estimate((w,)))[C.KV_CACHE] == 65_536 * 4096


def test_mla_kv_cache_is_the_latent():
    # DeepSeek-V3: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes = 70,272 B.
    w = infer("deepseek-v3", prompt_tokens=100, generated_tokens=0, parallelism={"tensor": 8})
    assert lines(estimate((w,)))[C.KV_CACHE] == 70_272 * 100


def test_sliding_window_layers_cap_at_the_window():
    # Gemma 2 9B: 42 layers alternating sliding (4096) / global; 16 KV heads? No: 8 KV heads,
    # head_dim 256 -> 2 x 8 x 256 x 2 = 8,192 B per token per layer.
    # The checkpoint is fp32 (torch_dtype float32): asked for in bf16 here.
    w = infer("gemma-2-9b", prompt_tokens=8000, generated_tokens=0, precision={"weights": "bf16"})
    per_layer_token = 2 * 8 * 256 * 2
    expected = 21 * per_layer_token * 8000 + 21 * per_layer_token * 4096
    assert lines(estimate((w,)))[C.KV_CACHE] == expected


def test_gptq_llama2_7b_weights_exact():
    # Hand count: 32 layers x (4 attention 4096^2 + 3 MLP 4096x11008) linear weights at 0.5 B
    # each, the rest (embeddings, lm_head, norms) stay bf16.
    w = infer("llama-2-7b", precision={"quantization": {"scheme": "gptq"}})
    linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    other = 6_738_415_616 - linear
    assert lines(estimate((w,)))[C.WEIGHTS] == linear // 2 + other * 2


def test_tensor_parallel_splits_heads_and_replicates_norms():
    base = lines(estimate((infer("llama-3.1-8b"),)))[C.WEIGHTS]
    tp2 = lines(estimate((infer("llama-3.1-8b", parallelism={"tensor": 2}),)))[C.WEIGHTS]
    norms = (32 * 2 + 1) * 4096 * 2  # RMSNorm weights, replicated, bf16
    assert tp2 == (base - norms) // 2 + norms


def test_zero3_shards_a_frozen_lora_base():
    # ZeRO-3 / FSDP FULL_SHARD partition every parameter, trainable or not: bf16 Llama-2-70B
    # base over 8 ranks = 68,976,648,192 x 2 / 8 bytes per device.
    w = train("llama-2-70b", method={"kind": "lora"}, parallelism={"data": 8, "zero_stage": 3})
    assert lines(estimate((w,)))[C.WEIGHTS] == 68_976_648_192 * 2 // 8


def test_expert_parallel_needs_devices_that_exist():
    from vrambudget.core.errors import InvalidWorkload

    with pytest.raises(InvalidWorkload, match="must divide tensor x data"):
        estimate((infer("mixtral-8x7b", parallelism={"expert": 8}),))
    # EP 2 within TP 2: each device holds 4 of the 8 experts of every layer, whole.
    one = lines(estimate((infer("mixtral-8x7b", parallelism={"tensor": 2, "expert": 2}),)))
    full = lines(estimate((infer("mixtral-8x7b"),)))
    experts = 32 * 8 * 3 * 4096 * 14336 * 2  # routed expert weights, bf16
    assert (
        one[C.WEIGHTS]
        == (full[C.WEIGHTS] - experts) // 2
        + experts // 2
        + (32 * 2 + 1) * 4096 * 2 // 2
        + 32 * 8 * 4096 * 2 // 2
    )


def test_interleaving_with_one_chunk_is_plain_1f1b():
    def stage0(schedule, v):
        w = train(
            "llama-2-13b",
            gradient_accumulation_steps=8,
            parallelism={"pipeline": 4, "pipeline_schedule": schedule, "virtual_stages": v},
        )
        return lines(estimate((w,)), 0)[C.ACTIVATIONS]

    assert stage0("interleaved_1f1b", 1) == stage0("1f1b", 1)
    # Narayanan et al. 2021: 1 + (p - 1) / (p v) more in-flight activation memory, v = 2.
    assert stage0("interleaved_1f1b", 2) > stage0("1f1b", 1)


MiB = 1 << 20


def test_a_profile_name_with_braces_is_not_a_format_string() -> None:
    """The source text was built with str.format after the profile's name was interpolated:
    a name with braces raised KeyError in every budget for its device (a 500)."""
    from vrambudget.core.calibration import CalibrationProfile, ProfileSet
    from vrambudget.core.spec import CatalogDevice, InferenceWorkload

    profile = CalibrationProfile(
        id="odd",
        gpu_name="GPU {x}",
        gpu_id="h100-sxm5-80gb",
        torch_version=None,
        cuda_version=None,
        driver_version=None,
        cuda_context_bytes=500 * MiB,
        probe_ids=("p{1}",),
    )
    w = msgspec.convert(
        {
            "kind": "inference",
            "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "batch_size": 1,
            "prompt_tokens": 8,
            "generated_tokens": 1,
        },
        InferenceWorkload,
    )
    budget = estimate((w,), CatalogDevice(id="h100-sxm5-80gb"), None, ProfileSet([profile]))
    line = next(ln for ln in budget.devices[0].lines if ln.component.value == "cuda_context")
    # the profile's measured context, and the kernel images an inference loads after it
    assert line.bytes == 500 * MiB + 180_813_824 and line.parts[0].bytes == 500 * MiB
    assert "GPU {x}" in line.source and "p{1}" in line.source
