"""A consumer card that may drive a display (vrambudget/core/device.py ``display_note``): the
vLLM and SGLang answers, made for a card nothing else uses, say that a desktop holds memory
before the engine starts and name the field that says how much; not where the request says
it, nor on datacenter and workstation cards."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest


def _warnings(engine: str, gpu: str, in_use: int = 0) -> list[str]:
    req = msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "llm_serving",
                    "engine": engine,
                    "model": {"source": "preset", "id": "llama-3.1-8b"},
                    "max_model_len": 8192,
                }
            ],
            "device": {"source": "catalog", "id": gpu, "memory_in_use_bytes": in_use},
        },
        BudgetRequest,
    )
    b = estimate(req.workloads, req.device, req.headroom)
    return [w for w in b.warnings if "consumer card" in w]


@pytest.mark.parametrize(("engine", "name"), [("vllm", "vLLM"), ("sglang", "SGLang")])
def test_a_consumer_card_says_a_desktop_may_hold_memory(engine: str, name: str) -> None:
    (note,) = _warnings(engine, "rtx-4090-24gb")
    assert note.startswith("NVIDIA GeForce RTX 4090 24GB is a consumer card")
    assert f"before {name} starts" in note and "device.memory_in_use_bytes" in note


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_not_where_the_request_says_what_others_hold(engine: str) -> None:
    assert _warnings(engine, "rtx-4090-24gb", in_use=800 << 20) == []


@pytest.mark.parametrize("gpu", ["h100-sxm5-80gb", "l40s-48gb", "rtx-6000-ada-48gb"])
def test_not_on_datacenter_or_workstation_cards(gpu: str) -> None:
    assert _warnings("sglang", gpu) == []
