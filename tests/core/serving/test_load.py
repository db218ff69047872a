"""vLLM's weights memory (vrambudget/core/serving/load.py): the load replayed through the allocator
model, against logged values."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.catalog import preset_arch
from vrambudget.core.serving.vllm import account
from vrambudget.core.spec import LLMServingWorkload
from vrambudget.core.units import GiB


def serving(model: str, **fields: object) -> LLMServingWorkload:
    return msgspec.convert(
        {"kind": "llm_serving", "model": {"source": "preset", "id": model}, **fields},
        LLMServingWorkload,
    )


def test_load_rounding_gemma2_2b_is_27_mib():
    # vLLM's weights memory counts caching-allocator blocks. Gemma 2 2B: each fused gate_up_proj
    # is 2 x 9216 x 2304 x 2 B = 81 MiB exactly; its segment rounds to 82 MiB and the 1 MiB
    # remainder is not split (should_split: remaining > 1 MiB), so +1 MiB x 26 layers; the
    # embedding, 256000 x 2304 x 2 B = 1125 MiB, gets 1126 MiB: +1 MiB. Every other tensor
    # splits or is exact. Measured "Model loading took 4.90 GiB" (the sweep's run).
    from vrambudget.core.serving.load import load_memory

    (lm,) = load_memory(preset_arch("gemma-2-2b"), 2, None, 1, 1, 1)
    assert lm.rounding_bytes == 27 * (1 << 20)
    assert round(lm.allocated_bytes / GiB, 2) == 4.90


def test_load_memory_deepseek_v2_lite_matches_vllm_0_5_and_0_19():
    # Without the MLA import workspace the replay gives 29.3010 GiB at TP1: vLLM 0.5.0 logged
    # "Loading model weights took 29.3010 GB" (GiB) for DeepSeek-V2-Lite (vllm PR #4650), before
    # any MLA backend allocated a workspace at import. 0.19.0 adds FlashInfer-MLA's 128 MiB on
    # every GPU: 29.43 / 14.84 / 7.51 GiB at TP1 / 2 / 4 (logged: 29.43 / 14.83 / 7.51).
    from vrambudget.core.serving.load import MLA_IMPORT_WORKSPACE_BYTES, load_memory

    arch = preset_arch("deepseek-v2-lite")
    (bare,) = load_memory(arch, 2, None, 1, 1, 1)
    assert f"{bare.allocated_bytes / GiB:.4f}" == "29.3010"
    assert MLA_IMPORT_WORKSPACE_BYTES == 128 << 20
    logged = []
    for t in (1, 2, 4):
        w = serving("deepseek-v2-lite", max_model_len=8192, parallelism={"tensor": t})
        a = account(w, arch, 85_045_477_376, "NVIDIA H100 80GB HBM3")
        assert a.stages[0].load_workspace_bytes == MLA_IMPORT_WORKSPACE_BYTES
        logged.append(round(a.stages[0].weights_memory_bytes / GiB, 2))
    assert logged == [29.43, 14.84, 7.51]


@pytest.mark.parametrize(
    "model",
    [
        "llama-3.1-8b",
        "qwen2.5-7b",
        "mixtral-8x7b",
        "qwen3-30b-a3b",
        "deepseek-v2-lite",
        "gemma-3-4b",
        "gemma-2-9b",
        "phi-4",
        "granite-3.1-8b",
        "qwen1.5-moe-a2.7b",
    ],
)
def test_load_replay_holds_exactly_the_tensors_and_rotary_tables(model):
    # The replay allocates the same bytes the budget's weights line counts: the parameters on
    # each stage (inventory x dtype) plus the rotary tables; only their blocks differ.
    from vrambudget.core.serving.load import load_memory
    from vrambudget.core.serving.rope import rotary_cache_bytes
    from vrambudget.core.serving.vllm import _statics
    from vrambudget.core.spec import Parallelism

    arch = preset_arch(model)
    for t, p in ((1, 1), (2, 2)):
        try:
            statics = _statics(arch, "bf16", None, Parallelism(tensor=t, pipeline=p))
        except Exception:  # noqa: BLE001 - a layout the model cannot take
            continue
        loads = load_memory(arch, 2, None, t, p, 1)
        for st, lm in zip(statics, loads, strict=True):
            assert lm.tensor_bytes == st.weights_bytes + rotary_cache_bytes(arch, 2), (t, p)
            assert 0 <= lm.rounding_bytes < 2 * (1 << 20) * (st.stage.num_layers * 8 + 4)


def test_gemma3_pipeline_stage_builds_only_the_ropes_its_layers_use():
    # Each stage is its own process: a stage with no global layer builds only the local table.
    from vrambudget.core.serving.load import load_memory

    arch = preset_arch("gemma-3-4b")  # 34 layers, global every 6th (indices 5, 11, ...)
    local, scaled = 131_072 * 256 * 2, 1_048_576 * 256 * 2
    stages = load_memory(arch, 2, None, 1, 8, 1)
    held = [lm.rotary_bytes for lm in stages]
    assert set(held) <= {local, local + scaled}
    assert local in held and local + scaled in held
    w = serving("gemma-3-4b", max_model_len=8192, parallelism={"pipeline": 8})
    a = account(w, arch, 85_045_477_376, "NVIDIA H100 SXM5 80GB")
    assert [s.rotary_bytes for s in a.stages] == held


def test_sglang_keeps_the_rotary_table_in_fp32():
    # SGLang on CUDA keeps the cos/sin cache in fp32 (rotary_embedding.py): Llama 3.1 8B's
    # 131,072 x 128 table is 131,072 x 128 x (4 - 2) = 33,554,432 B larger than vLLM's bf16 one.
    from vrambudget.core.serving.load import load_memory

    arch = preset_arch("llama-3.1-8b")
    (vllm,) = load_memory(arch, 2, None, 1, 1, 1)
    (sglang,) = load_memory(arch, 2, None, 1, 1, 1, True)
    assert sglang.tensor_bytes - vllm.tensor_bytes == 131_072 * 128 * 2 == 33_554_432
    assert sglang.rotary_bytes == 131_072 * 128 * 4


def test_reserved_after_loading_is_the_weights_segments():
    # What SGLang's "Load weight end ... mem usage" reads: the segments left once the cache is
    # emptied. Llama 3.1 8B in bf16 on one GPU: every projection is a whole number of 2 MiB
    # (fused q/k/v 4,096 x 6,144 x 2 B = 48 MiB, o_proj 32, gate_up 224, down 112, embedding
    # and head 128,256 x 4,096 x 2 B = 1,002 MiB; the fp32 rope table 64 MiB), so their
    # segments hold them exactly; the rope's freed 32 MiB temporaries are taken by the next
    # three 32 MiB o_proj blocks or released. The 65 norm vectors of 4,096 x 2 B = 8 KiB share
    # one 2 MiB small-pool segment: 2,097,152 - 65 x 8,192 = 1,564,672 B beyond the tensors.
    # The RTX 4090 log printed "mem usage=15.02 GB" (GiB).
    from vrambudget.core.serving.load import load_memory

    (lm,) = load_memory(preset_arch("llama-3.1-8b"), 2, None, 1, 1, 1, True)
    assert lm.reserved_bytes - lm.tensor_bytes == 2_097_152 - 65 * 8_192 == 1_564_672
    assert round(lm.reserved_bytes / GiB, 2) == 15.02
