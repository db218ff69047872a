"""Memory other processes hold on the device (``device.memory_in_use_bytes``): it comes off what
the workload may use, and each serving engine sees it as its own start-up does."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.catalog import gpu
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import fit
from vrambudget.core.result import GGUFDetails, SGLangDetails
from vrambudget.core.spec import BudgetRequest, FitRequest
from vrambudget.core.units import GiB

LLAMA = {"source": "preset", "id": "llama-3.1-8b"}
INFER = {
    "kind": "inference",
    "model": LLAMA,
    "batch_size": 1,
    "prompt_tokens": 2048,
    "generated_tokens": 256,
}
RTX4090 = gpu("rtx-4090-24gb")
H100 = gpu("h100-sxm5-80gb")


def _budget(w: dict[str, Any], device: dict[str, Any]):
    r = msgspec.convert({"workloads": [w], "device": device}, BudgetRequest)
    return estimate(r.workloads, r.device, r.headroom, None, r.software)


def _on(gpu_id: str, in_use: int) -> dict[str, Any]:
    return {"source": "catalog", "id": gpu_id, "memory_in_use_bytes": in_use}


def test_the_fit_compares_with_what_is_left() -> None:
    """Llama 3.1 8B, 2,048 + 256 tokens on an RTX 4090: the budget is the same, the free bytes
    drop by exactly what other processes hold, and the verdict turns once they leave less than
    the total (headroom included)."""
    bare = _budget(INFER, _on("rtx-4090-24gb", 0))
    total = bare.devices[0].total_bytes
    assert bare.fit is not None and bare.fit.devices[0].fits
    room = RTX4090.memory_total_bytes - total
    just = _budget(INFER, _on("rtx-4090-24gb", room))
    over = _budget(INFER, _on("rtx-4090-24gb", room + 1))
    assert just.devices[0].total_bytes == over.devices[0].total_bytes == total
    assert just.fit is not None and over.fit is not None
    assert just.fit.devices[0].free_bytes == 0 and just.fit.devices[0].fits
    assert over.fit.devices[0].free_bytes == -1 and not over.fit.devices[0].fits
    assert over.fit.devices[0].verdict != "fits"
    assert over.device is not None and over.device.memory_in_use_bytes == room + 1


def test_fits_solve_the_largest_batch_in_what_is_left() -> None:
    def largest(in_use: int) -> int:
        req = msgspec.convert(
            {
                "workloads": [INFER],
                "devices": [_on("rtx-4090-24gb", in_use)],
                "headroom": {"fraction": 0.0},
                "solve": ["batch"],
            },
            FitRequest,
        )
        layout = fit(req).gpus[0].layouts[0]
        assert layout.capacity_bytes == RTX4090.memory_total_bytes - in_use
        assert layout.maxima.batch_size is not None
        return layout.maxima.batch_size

    assert largest(4 * GiB) < largest(0)


def test_all_of_the_device_in_use_is_refused_with_the_field() -> None:
    with pytest.raises(InvalidWorkload) as exc:
        _budget(INFER, _on("rtx-4090-24gb", RTX4090.memory_total_bytes))
    assert exc.value.field == "device.memory_in_use_bytes"
    assert str(RTX4090.memory_total_bytes) in exc.value.message
    custom = {"source": "custom", "memory_total_bytes": 1000, "memory_in_use_bytes": 1000}
    with pytest.raises(InvalidWorkload) as exc:
        _budget(INFER, custom)
    assert exc.value.field == "device.memory_in_use_bytes"
    assert "below the custom's 1000 bytes (got 1000)" in exc.value.message
    # /v1/fits names the entry of its devices list
    req = msgspec.convert(
        {
            "workloads": [INFER],
            "devices": [_on("h100-sxm5-80gb", 0), _on("rtx-4090-24gb", 1 << 45)],
        },
        FitRequest,
    )
    with pytest.raises(InvalidWorkload) as exc:
        fit(req)
    assert exc.value.field == "devices[1].memory_in_use_bytes"


SGLANG = {
    "kind": "llm_serving",
    "engine": "sglang",
    "engine_version": "0.5.23",
    "model": LLAMA,
    "max_model_len": 8192,
    "sglang": {"mem_fraction_static": 0.85},
}


@pytest.mark.parametrize("in_use", [0, 3 * GiB])
def test_sglang_pool_is_its_fraction_of_the_free_memory(in_use: int) -> None:
    """SGLang measures the free memory after its CUDA context (and whatever else is resident),
    then keeps ``mem_fraction_static`` of it for weights and pool (model_runner.py
    ``profile_max_num_token``): 3 GiB held elsewhere take 3 x 0.85 GiB off the pool."""
    b = _budget(SGLANG, _on("h100-sxm5-80gb", in_use))
    s = b.serving
    assert s is not None and isinstance(s.details, SGLangDetails)
    lines = {ln.component.value: ln.bytes for ln in b.devices[0].lines}
    free = H100.memory_total_bytes - lines["cuda_context"] - in_use
    rest_gib = (free - s.details.weights_bytes) / GiB - free / GiB * (1 - 0.85)
    cell = 32 * 8 * 128 * 2 * 2
    assert s.kv_cache_tokens == int(rest_gib * (1 << 30) // cell)
    assert lines["headroom"] == H100.memory_total_bytes - in_use - sum(
        v for k, v in lines.items() if k != "headroom"
    )


def test_sglang_loses_the_fraction_of_what_others_hold() -> None:
    bare = _budget(SGLANG, _on("h100-sxm5-80gb", 0)).serving
    busy = _budget(SGLANG, _on("h100-sxm5-80gb", 3 * GiB)).serving
    assert bare is not None and busy is not None
    cell = 32 * 8 * 128 * 2 * 2
    assert bare.kv_cache_tokens - busy.kv_cache_tokens == pytest.approx(
        3 * GiB * 0.85 / cell, abs=1
    )


VLLM = {"kind": "llm_serving", "engine_version": "0.19.0", "model": LLAMA, "max_model_len": 8192}


def test_vllm_keeps_its_pool_until_the_requested_share_is_not_free() -> None:
    """vLLM's pool is gpu_memory_utilization x total less what it profiles, whatever else runs;
    at start the free memory (after its CUDA context) must hold that share
    (vllm/v1/worker/utils.py ``request_memory``), else it refuses, and lowering the share is the
    remedy."""
    bare = _budget(VLLM, _on("h100-sxm5-80gb", 0))
    sv = bare.serving
    assert sv is not None
    context = next(ln for ln in bare.devices[0].lines if ln.component.value == "cuda_context")
    snapshot = next(p.bytes for p in context.parts if p.name.startswith("CUDA context"))
    slack = H100.memory_total_bytes - snapshot - sv.requested_memory_bytes
    fits = _budget(VLLM, _on("h100-sxm5-80gb", slack)).serving
    refused = _budget(VLLM, _on("h100-sxm5-80gb", slack + 1)).serving
    assert fits is not None and refused is not None
    assert fits.kv_cache_tokens == sv.kv_cache_tokens and fits.reason is None
    assert refused.reason is not None and "other processes hold" in refused.reason
    assert any(r.startswith("lower gpu_memory_utilization to") for r in refused.remedies)


def test_ollama_offloads_what_does_not_fit_beside_other_processes() -> None:
    w = {"kind": "llm_serving", "engine": "ollama", "model": LLAMA}
    bare = _budget(w, _on("rtx-4090-24gb", 0))
    busy = _budget(w, _on("rtx-4090-24gb", 16 * GiB))
    assert bare.fit is not None and busy.fit is not None
    assert bare.fit.devices[0].verdict == "fits"
    assert busy.fit.devices[0].verdict == "does_not_fit"
    assert bare.serving is not None and busy.serving is not None
    full, part = bare.serving.details, busy.serving.details
    assert isinstance(full, GGUFDetails) and isinstance(part, GGUFDetails)
    assert part.n_gpu_layers < full.n_gpu_layers == full.n_layer + 1
    assert part.fitted is not None and "layers" in part.fitted


def test_a_fit_and_a_budget_count_sglang_beside_other_processes_alike() -> None:
    """/v1/fits's row for SGLang uses what /v1/budgets uses: the memory others hold comes off
    the capacity once (not also as part of the CUDA context)."""
    held = 8 * GiB
    b = _budget(SGLANG, _on("h100-sxm5-80gb", held))
    req = msgspec.convert(
        {"workloads": [SGLANG], "devices": [_on("h100-sxm5-80gb", held)], "solve": []},
        FitRequest,
    )
    row = fit(req).gpus[0].layouts[0]
    assert b.fit is not None
    assert row.capacity_bytes == H100.memory_total_bytes - held == b.fit.capacity_bytes
    assert row.total_bytes == b.fit.used_bytes
    assert row.free_bytes == b.fit.devices[0].free_bytes


def test_vllm_remedies_stay_below_what_is_free() -> None:
    """With 50 GiB held, gpu_memory_utilization 0.2 leaves no KV room and more than the free
    share is refused: the remedy is the largest utilization in between that starts."""
    w = {**VLLM, "gpu_memory_utilization": 0.2}
    s = _budget(w, _on("h100-sxm5-80gb", 50 * GiB)).serving
    assert s is not None and s.reason is not None
    raise_to = [r for r in s.remedies if r.startswith("raise gpu_memory_utilization to")]
    assert raise_to, s.remedies
    value = float(raise_to[0].rsplit(" ", 1)[1])
    started = _budget({**w, "gpu_memory_utilization": value}, _on("h100-sxm5-80gb", 50 * GiB))
    assert started.serving is not None and started.serving.reason is None
    # the refusal names a utilization that starts (rounded down, never up)
    s30 = _budget(VLLM, _on("h100-sxm5-80gb", 30 * GiB)).serving
    assert s30 is not None and s30.reason is not None
    named = float(s30.reason.split("at most ")[1].split(",")[0])
    ok = _budget({**VLLM, "gpu_memory_utilization": named}, _on("h100-sxm5-80gb", 30 * GiB))
    assert ok.serving is not None and ok.serving.reason is None


@pytest.mark.parametrize("engine", ["sglang", "vllm", "llama_cpp", "ollama"])
def test_an_engine_on_a_device_below_a_mib_does_not_fit(engine: str) -> None:
    """Found by schemathesis (a custom device of 1 byte): SGLang's automatic fraction divides
    by the GPU's MiB, which rounded to 0; every engine answers does_not_fit."""
    w = {"kind": "llm_serving", "engine": engine, "model": {"source": "preset", "id": "gpt2"}}
    b = _budget(w, {"source": "custom", "memory_total_bytes": 1})
    assert b.fit is not None and b.fit.verdict == "does_not_fit"
