"""The vLLM engine account (vrambudget/core/serving/vllm.py): KV dtype, import-time workspaces."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.catalog import preset_arch
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
