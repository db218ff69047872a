"""llm_serving fits (vrambudget/core/serving/fit.py via core.fit): smallest GPU count, largest
max_model_len, cheapest GPU."""

from __future__ import annotations

import msgspec

from vrambudget.core.catalog import preset_arch
from vrambudget.core.fit import FitRequest, fit
from vrambudget.core.serving.vllm import account
from vrambudget.core.spec import LLMServingWorkload

H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}


def serving(model: str, **fields: object) -> LLMServingWorkload:
    return msgspec.convert(
        {"kind": "llm_serving", "model": {"source": "preset", "id": model}, **fields},
        LLMServingWorkload,
    )


# --------------------------------------------------------------------------------- fits --


def fit_request(**body: object) -> FitRequest:
    return msgspec.convert(body, FitRequest)


def test_smallest_gpu_count_and_largest_max_model_len_are_exact():
    w = {
        "kind": "llm_serving",
        "model": {"source": "preset", "id": "llama-3.1-70b"},
        "max_model_len": 32768,
        "engine_version": "0.19.0",
    }
    req = fit_request(
        workloads=[w],
        devices=[H100],
        device_counts=[2, 4],
        solve=["device_count", "max_model_len", "concurrency"],
        target_concurrency=8,
    )
    g = fit(req).gpus[0]
    by_n = {lay.device_count: lay for lay in g.layouts}
    assert not by_n[2].fits and by_n[4].fits and g.min_device_count == 4
    # the verdict says the same (it once kept its default "fits" on a layout that does not)
    assert (by_n[2].verdict, by_n[4].verdict) == ("does_not_fit", "fits")
    h100 = 85_045_477_376
    arch = preset_arch("llama-3.1-70b")
    best = by_n[4].maxima.max_model_len
    four = {"tensor": 4}

    def conc(length: int) -> float:
        a = account(
            serving(
                "llama-3.1-70b", parallelism=four, max_model_len=length, engine_version="0.19.0"
            ),
            arch,
            h100,
            "NVIDIA H100 SXM5 80GB",
        )
        return a.max_concurrency if a.would_start else 0.0

    assert conc(best) >= 8 > conc(best + 1)
    assert by_n[4].maxima.concurrent_requests == int(by_n[4].maxima.max_concurrency)


def test_cheapest_gpu_by_price_or_fewest_devices():
    w = {
        "kind": "llm_serving",
        "model": {"source": "preset", "id": "llama-3.1-8b"},
        "max_model_len": 8192,
    }
    devices = [H100, {"source": "catalog", "id": "l4-24gb"}]
    unpriced = fit(
        fit_request(workloads=[w], devices=devices, solve=["device_count"], target_concurrency=4)
    )
    counts = {g.gpu_id: g.min_device_count for g in unpriced.gpus}
    assert counts == {"h100-sxm5-80gb": 1, "l4-24gb": 2}
    # no prices: the fewest devices (not the least total memory, which was 2 x L4's 48 GB);
    # no cost is implied
    by_count = unpriced.cheapest
    assert by_count.basis == "device_count" and by_count.gpu_id == "h100-sxm5-80gb"
    assert by_count.cost is None
    priced = fit(
        fit_request(
            workloads=[w],
            devices=devices,
            solve=["device_count"],
            target_concurrency=4,
            prices={"h100-sxm5-80gb": 1.0, "l4-24gb": 1.5},
        )
    ).cheapest
    assert priced.basis == "price" and priced.gpu_id == "h100-sxm5-80gb" and priced.cost == 1.0
