"""A device that also drives a desktop (``device.desktop_session``): where the request does not
measure what others hold, the desktop's published hold (``vrambudget/core/desktop.py``) comes
off the capacity, and every verdict holds at the high end of its readings."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from tests.support.workloads import budget_of
from vrambudget.core.catalog import gpu
from vrambudget.core.desktop import desktop_hold
from vrambudget.core.device import display_note, resolve_device
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.fit import fit
from vrambudget.core.result import GGUFDetails
from vrambudget.core.spec import CatalogDevice, FitRequest
from vrambudget.core.units import GiB
from vrambudget.core.verdict import memory_verdict

RTX4090 = gpu("rtx-4090-24gb")
LLAMA = {"source": "preset", "id": "llama-3.1-8b"}
# Llama 3.1 8B, one sequence of 2,048 + 256 tokens
INFER = dict(kind="inference", model=LLAMA, batch_size=1, prompt_tokens=2048, generated_tokens=256)


def _dev(session: str | None, in_use: int = 0, gpu_id: str = "rtx-4090-24gb") -> dict[str, Any]:
    d: dict[str, Any] = {"source": "catalog", "id": gpu_id, "memory_in_use_bytes": in_use}
    if session is not None:
        d["desktop_session"] = session
    return d


def _budget(w: dict[str, Any], device: dict[str, Any]):
    return budget_of({"workloads": [w], "device": device})


@pytest.mark.parametrize("session", ["windows", "linux"])
def test_an_unmeasured_desktop_holds_its_published_median(session: str) -> None:
    h = desktop_hold(session)
    assert 0 < h.low_bytes <= h.typical_bytes <= h.high_bytes < 4 * GiB
    ctx = resolve_device(CatalogDevice(id="rtx-4090-24gb", desktop_session=session))  # type: ignore[arg-type]
    assert ctx is not None
    assert ctx.memory_in_use_bytes == h.typical_bytes
    assert ctx.capacity_bytes == RTX4090.memory_total_bytes - h.typical_bytes
    assert ctx.capacity_low_bytes == RTX4090.memory_total_bytes - h.high_bytes
    s = ctx.summary()
    assert (s.memory_in_use_low_bytes, s.memory_in_use_high_bytes) == (h.low_bytes, h.high_bytes)
    assert s.desktop_session == session and s.memory_in_use_basis is not None
    assert f"median of {h.measurements} published" in s.memory_in_use_basis
    # said: no warning that a desktop may hold memory
    assert display_note(ctx, "vLLM") is None


def test_a_measured_hold_replaces_the_assumed_one() -> None:
    ctx = resolve_device(
        CatalogDevice(id="rtx-4090-24gb", memory_in_use_bytes=300 << 20, desktop_session="windows")
    )
    assert ctx is not None
    assert ctx.memory_in_use_bytes == 300 << 20
    assert (ctx.in_use_below, ctx.in_use_above, ctx.in_use_basis) == (0, 0, None)
    s = ctx.summary()
    assert s.memory_in_use_low_bytes is None and s.desktop_session == "windows"


def test_headless_and_unsaid() -> None:
    headless = resolve_device(CatalogDevice(id="rtx-4090-24gb", desktop_session="none"))
    unsaid = resolve_device(CatalogDevice(id="rtx-4090-24gb"))
    assert headless is not None and unsaid is not None
    assert headless.memory_in_use_bytes == unsaid.memory_in_use_bytes == 0
    assert display_note(headless, "vLLM") is None  # said: nothing drives a display
    assert display_note(unsaid, "vLLM") is not None  # a consumer card, nothing said


def test_verdict_holds_at_the_high_end_of_the_hold() -> None:
    """By hand: capacity 80 at the assumed hold, which may be 6 lower or 2 higher."""
    assert memory_verdict(70, 80, 60, 78, (6, 2)) == "fits"
    assert memory_verdict(70, 80, 60, 79, (6, 2)) == "fits_if_low"  # 79 > 80 - 2
    assert memory_verdict(85, 80, 86, 90, (6, 2)) == "fits_if_low"  # 86 <= 80 + 6
    assert memory_verdict(85, 80, 87, 90, (6, 2)) == "does_not_fit"
    assert memory_verdict(79, 80, None, None, (0, 2)) == "fits_if_low"


def test_a_budget_that_fits_only_below_the_hold_high_end() -> None:
    """An inference budget whose band's high end fits beside the median hold but not beside its
    high end: ``fits_if_low``; beside a measured hold of the same median bytes: ``fits``."""
    h = desktop_hold("windows")
    big = {"source": "custom", "name": "desk", "memory_total_bytes": 80 * GiB}
    bare = _budget(INFER, big)
    band = bare.devices[0].band
    assert band is not None
    # a custom device just large enough for the band's high end beside the median hold
    total = max(band.high_bytes, bare.devices[0].total_bytes) + h.typical_bytes
    custom = {**big, "memory_total_bytes": total}
    assumed = _budget(INFER, {**custom, "desktop_session": "windows"})
    measured = _budget(INFER, {**custom, "memory_in_use_bytes": h.typical_bytes})
    assert assumed.fit is not None and measured.fit is not None
    assert assumed.devices[0].total_bytes == measured.devices[0].total_bytes
    assert measured.fit.verdict == "fits"
    assert assumed.fit.verdict == "fits_if_low"
    assert assumed.fit.capacity_bytes == measured.fit.capacity_bytes == total - h.typical_bytes


def test_largest_batch_holds_at_the_high_end() -> None:
    def largest(device: dict[str, Any]) -> int:
        req = msgspec.convert(
            {
                "workloads": [INFER],
                "devices": [device],
                "headroom": {"fraction": 0.0},
                "solve": ["batch"],
            },
            FitRequest,
        )
        b = fit(req).gpus[0].layouts[0].maxima.batch_size
        assert b is not None
        return b

    h = desktop_hold("windows")
    assert largest(_dev("windows")) == largest(_dev(None, h.high_bytes))


def test_sglang_band_is_the_pool_at_both_ends_of_the_hold() -> None:
    """SGLang's pool is its fraction of the free memory at start: the band's ends are the
    pools beside the hold's high and low end, as when those holds are measured."""
    h = desktop_hold("windows")
    w = {
        "kind": "llm_serving",
        "engine": "sglang",
        "engine_version": "0.5.23",
        "model": LLAMA,
        "max_model_len": 8192,
    }
    s = _budget(w, _dev("windows")).serving
    lo = _budget(w, _dev(None, h.high_bytes)).serving
    mid = _budget(w, _dev(None, h.typical_bytes)).serving
    hi = _budget(w, _dev(None, h.low_bytes)).serving
    assert s is not None and lo is not None and mid is not None and hi is not None
    assert s.kv_cache_tokens == mid.kv_cache_tokens
    band = s.kv_cache_tokens_band
    assert band is not None
    assert (band.low, band.high) == (lo.kv_cache_tokens, hi.kv_cache_tokens)
    assert band.max_concurrency_low == math.floor(lo.kv_cache_tokens / 8192 * 10_000) / 10_000
    assert mid.kv_cache_tokens_band is None  # measured: no band of the hold


def test_vllm_that_starts_only_below_the_hold_high_end() -> None:
    """vLLM refuses to start when the free memory is below gpu_memory_utilization x total
    (gpu_worker.py): a utilization between what the median and the high hold leave starts, and
    is ``fits_if_low``; the band's low end is 0 tokens."""
    h = desktop_hold("windows")
    total = RTX4090.memory_total_bytes
    ctx = resolve_device(CatalogDevice(id="rtx-4090-24gb"))
    assert ctx is not None
    w = {"kind": "llm_serving", "engine_version": "0.19.0", "model": LLAMA, "max_model_len": 4096}
    bare = _budget(w, _dev(None))
    lines = {ln.component.value: ln.bytes for ln in bare.devices[0].lines}
    context = lines["cuda_context"]
    # free at start: total - hold - context; a utilization between the two frees / total
    free_mid, free_high = total - h.typical_bytes - context, total - h.high_bytes - context
    util = math.floor((free_mid + free_high) / 2 / total * 1000) / 1000
    assert free_high < util * total <= free_mid
    b = _budget({**w, "gpu_memory_utilization": util}, _dev("windows"))
    assert b.serving is not None and b.serving.would_start
    band = b.serving.kv_cache_tokens_band
    assert band is not None and band.low == 0 and band.max_concurrency_low == 0
    assert "would not start" in band.basis
    assert b.fit is not None and b.fit.verdict == "fits_if_low"


def test_a_hold_that_leaves_nothing_is_refused_with_the_field() -> None:
    h = desktop_hold("windows")
    custom = {"source": "custom", "memory_total_bytes": h.high_bytes, "desktop_session": "windows"}
    with pytest.raises(InvalidWorkload) as exc:
        _budget(INFER, custom)
    assert exc.value.field == "device.desktop_session"
    assert "memory_in_use_bytes" in exc.value.message


def test_llama_cpp_that_keeps_every_layer_only_below_the_hold_high_end() -> None:
    """llama.cpp places what fits in the free memory: on a card just large enough for every
    layer beside the median hold, the high end leaves some layers on the CPU, and the verdict
    says ``fits_if_low``; the same card with the hold measured at the median: ``fits``."""
    h = desktop_hold("windows")
    w = {
        "kind": "llm_serving",
        "engine": "llama_cpp",
        "model": LLAMA,
        "gguf": {"file_type": "Q4_K_M", "n_ctx": 4096},
    }

    def card_of(total: int) -> dict[str, Any]:
        return {"source": "custom", "name": "desk", "memory_total_bytes": total}

    def whole(total: int) -> bool:
        s = _budget(w, {**card_of(total), "memory_in_use_bytes": h.typical_bytes}).serving
        assert s is not None and isinstance(s.details, GGUFDetails)
        return s.details.n_gpu_layers == s.details.n_layer + 1

    # the smallest card (to 1 MiB) that keeps every layer beside the median hold
    lo, hi = 1 << 30, 80 * GiB
    assert whole(hi) and not whole(lo)
    while hi - lo > 1 << 20:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if whole(mid) else (mid, hi)
    card = card_of(hi)
    assumed = _budget(w, {**card, "desktop_session": "windows"})
    measured = _budget(w, {**card, "memory_in_use_bytes": h.typical_bytes})
    assert assumed.serving is not None and measured.serving is not None
    d, m = assumed.serving.details, measured.serving.details
    assert isinstance(d, GGUFDetails) and isinstance(m, GGUFDetails)
    assert d.n_gpu_layers == m.n_gpu_layers == d.n_layer + 1
    assert d.n_gpu_layers_at_high_hold is not None
    assert d.n_gpu_layers_at_high_hold < d.n_layer + 1
    assert m.n_gpu_layers_at_high_hold is None
    assert assumed.fit is not None and measured.fit is not None
    assert (assumed.fit.verdict, measured.fit.verdict) == ("fits_if_low", "fits")


def _fit(w: dict[str, Any], device: dict[str, Any], **extra: Any):
    req = msgspec.convert({"workloads": [w], "devices": [device], **extra}, FitRequest)
    return fit(req).gpus[0]


@pytest.mark.parametrize(
    ("w", "field"),
    [
        (
            {
                "kind": "llm_serving",
                "engine": "sglang",
                "engine_version": "0.5.23",
                "model": {"source": "preset", "id": "qwen2.5-7b"},
                "max_model_len": 4096,
            },
            "max_model_len",
        ),
        (
            {
                "kind": "llm_serving",
                "engine": "llama_cpp",
                "model": LLAMA,
                "gguf": {"file_type": "Q8_0"},
            },
            "context_tokens",
        ),
        (
            {"kind": "llm_serving", "engine_version": "0.19.0", "model": LLAMA},
            "max_model_len",
        ),
    ],
)
def test_serving_fits_solve_beside_the_high_end(w: dict[str, Any], field: str) -> None:
    """/v1/fits for an engine: the largest context (and the fewest devices) with an assumed
    desktop hold are those beside its high end, as if that hold were measured; the GPU's
    warnings say the hold was assumed."""
    h = desktop_hold("windows")
    solve = {"solve": ["context", "device_count"]}
    assumed = _fit(w, _dev("windows"), **solve)
    measured = _fit(w, _dev(None, h.high_bytes), **solve)
    a, m = assumed.layouts[0].maxima, measured.layouts[0].maxima
    assert getattr(a, field) == getattr(m, field)
    assert assumed.min_device_count == measured.min_device_count
    assert any("assumed held by a Windows desktop" in x for x in assumed.warnings)
    assert not any("assumed" in x for x in measured.warnings)


def test_a_mig_instance_starts_empty_without_the_desktop_spread() -> None:
    from vrambudget.core.mig import mig_devices
    from vrambudget.core.serving.fit import mig_context

    ctx = resolve_device(CatalogDevice(id="h100-sxm5-80gb", desktop_session="windows"))
    assert ctx is not None and ctx.in_use_above > 0
    inst = mig_context(ctx, mig_devices("h100-sxm5-80gb")[0])
    assert (inst.memory_in_use_bytes, inst.in_use_below, inst.in_use_above) == (0, 0, 0)
    assert inst.at_hold(high=False) is inst


def test_cli_desktop_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from vrambudget.cli.main import main

    rc = main(
        [
            "estimate",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "1",
            "--gpu",
            "rtx-4090-24gb",
            "--desktop",
            "windows",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "assumed held by the windows desktop (published readings" in out


def test_vllm_names_what_starts_beside_the_high_end() -> None:
    """vLLM at its default 0.9 on an RTX 4090 with a Windows desktop: it starts beside the
    median hold, not beside the high end; the remedy names the utilization that does, and that
    utilization starts with the high end measured."""
    w = {"kind": "llm_serving", "engine_version": "0.19.0", "model": LLAMA, "max_model_len": 4096}
    b = _budget(w, _dev("windows"))
    assert b.serving is not None and b.serving.would_start
    assert b.fit is not None and b.fit.verdict == "fits_if_low"
    lower = [r for r in b.serving.remedies if "lower gpu_memory_utilization to" in r]
    assert len(lower) == 1 and "high end of the desktop's assumed hold" in lower[0]
    util = float(lower[0].rsplit(" ", 1)[1])
    h = desktop_hold("windows")
    fixed = _budget({**w, "gpu_memory_utilization": util}, _dev(None, h.high_bytes))
    assert fixed.serving is not None and fixed.serving.would_start


def test_vllm_034_extensible_cache_starts_beside_a_desktop() -> None:
    """vLLM 0.34's extensible KV cache (its default) skips the start-up check of free memory
    against utilization x total (0.34.0 vllm/v1/worker/utils.py request_memory: "the budget
    is only a cap"); the pool is what the free memory leaves, so a larger hold leaves fewer
    tokens."""
    w = {"kind": "llm_serving", "engine_version": "0.34.0", "model": LLAMA, "max_model_len": 8192}
    bare = _budget(w, _dev(None)).serving
    desk = _budget(w, _dev("windows")).serving
    assert bare is not None and desk is not None
    assert desk.would_start and desk.reason is None
    assert desk.kv_cache_tokens < bare.kv_cache_tokens
    band = desk.kv_cache_tokens_band
    assert band is not None and 0 < band.low < desk.kv_cache_tokens < band.high
