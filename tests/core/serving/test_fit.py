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


def test_a_layout_that_starts_only_at_the_estimate_is_fits_if_low():
    """Llama 3.1 8B on one L4 (0.13.0: the transfer band, 1.73 GiB of KV budget): at the
    largest max_model_len that starts, the band's low end holds less than one request, so the
    layout fits only if the engine's other memory is near the estimate; a short context fits
    outright. The budget's own verdict agrees."""
    from vrambudget.core.estimate import estimate
    from vrambudget.core.spec import BudgetRequest
    from vrambudget.core.verdict import with_fit

    l4 = {"source": "catalog", "id": "l4-24gb"}
    base = {
        "kind": "llm_serving",
        "model": {"source": "preset", "id": "llama-3.1-8b"},
        "engine_version": "0.13.0",
    }
    longest = (
        fit(fit_request(workloads=[base], devices=[l4], device_counts=[1], solve=["max_model_len"]))
        .gpus[0]
        .layouts[0]
        .maxima.max_model_len
    )
    assert longest is not None and longest > 4096

    def verdicts(length: int) -> tuple[str, str]:
        w = {**base, "max_model_len": length}
        lay = fit(fit_request(workloads=[w], devices=[l4], device_counts=[1])).gpus[0].layouts[0]
        req = msgspec.convert({"workloads": [w], "device": l4}, BudgetRequest)
        b = with_fit(estimate(req.workloads, req.device), req.workloads)
        assert b.fit is not None and b.serving is not None
        band = b.serving.kv_cache_tokens_band
        assert band is not None and band.low < b.serving.kv_cache_tokens < band.high
        return lay.verdict, b.fit.verdict

    assert verdicts(longest) == ("fits_if_low", "fits_if_low")
    assert verdicts(4096) == ("fits", "fits")
