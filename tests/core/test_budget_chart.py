"""The budget picture (vrambudget/core/budget_chart.py): hand-built budgets whose geometry is
computed here by hand, and a real estimate."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tests.support.comparisons import SVG, parse_svg, svg_texts
from vrambudget.core.budget_chart import BAR_WIDTH, BAR_X, COLOURS, render_budget_svg
from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.result import (
    Budget,
    DeviceBudget,
    DeviceSummary,
    DiskBudget,
    ErrorBand,
    HostBudget,
    Line,
    WorkloadSummary,
)
from vrambudget.core.spec import CatalogDevice, Headroom, InferenceWorkload, PresetModel
from vrambudget.core.units import GiB, MiB


def _device(label: str, sizes: dict[Component, int], band: ErrorBand | None) -> DeviceBudget:
    lines = tuple(
        Line(component=c, bytes=sizes.get(c, 0), formula="f", inputs=(), source="s")
        for c in Component
    )
    return DeviceBudget(
        label=label,
        pipeline_stage=None,
        num_devices=1,
        peak_phase="optimizer_step",
        lines=lines,
        total_bytes=sum(sizes.values()),
        inputs={},
        phases=(),
        band=band,
    )


def _band(low: int, high: int) -> ErrorBand:
    return ErrorBand(
        low_bytes=low,
        high_bytes=high,
        coverage=0.9,
        workload_class="fine_tuning_lora_multi_gpu",
        measurements=20,
        basis="test",
    )


def _budget(
    devices: tuple[DeviceBudget, ...], capacity: int | None, model: str = "m<1> & co"
) -> Budget:
    return Budget(
        workloads=(
            WorkloadSummary(name=model, kind="inference", devices_per_instance=1, instances=1),
        ),
        device=None
        if capacity is None
        else DeviceSummary(name="GPU <X>", memory_total_bytes=capacity, architecture="a"),
        devices=devices,
        most_loaded=max(range(len(devices)), key=lambda i: devices[i].total_bytes),
        total_bytes=max(d.total_bytes for d in devices),
        host_ram=HostBudget(num_processes=1, items=(), total_bytes=0),
        disk=DiskBudget(items=(), total_bytes=0),
    )


def _rects(root: ET.Element, cls: str) -> dict[str, tuple[float, float]]:
    """id -> (x, width) of the rects of a class."""
    return {
        r.get("id", ""): (float(r.get("x", "nan")), float(r.get("width", "nan")))
        for r in root.iter(f"{SVG}rect")
        if r.get("class") == cls
    }


def _lines(root: ET.Element, cls: str) -> list[tuple[float, float]]:
    return [
        (float(e.get("x1", "nan")), float(e.get("x2", "nan")))
        for e in root.iter(f"{SVG}line")
        if e.get("class") == cls
    ]


FITS = {
    Component.WEIGHTS: 10 * GiB,
    Component.KV_CACHE: 2 * GiB,
    Component.ACTIVATIONS: 1 * GiB,
    Component.LOGITS: 1 * MiB,
    Component.CUDA_CONTEXT: 512 * MiB,
    Component.HEADROOM: 2 * GiB + 512 * MiB,
}
"""16 GiB + 1 MiB on a 20 GiB device; the subtotal (without headroom) 13.5 GiB + 1 MiB."""


def test_segments_are_proportional_on_one_scale_with_free_space_and_band() -> None:
    band = _band(12 * GiB, 16 * GiB + 512 * MiB)
    svg = render_budget_svg(_budget((_device("every device", FITS, band),), 20 * GiB))
    root = parse_svg(svg)
    # The scale ends at the capacity (20 GiB: larger than the total and the band's high
    # end): 580 px / 20 GiB = 29 px per GiB. Logits (1 MiB = 29 / 1024 = 0.03 px) is drawn
    # 2 px wide and the widest segment, weights, gives up 2 - 0.0283 = 1.9717 px.
    segs = _rects(root, "segment")
    expected = {  # id: (x, width), by hand
        "seg-0-weights": (196, 290 - (2 - 29 / 1024)),
        "seg-0-kv_cache": (196 + 288.0283203125, 58),
        "seg-0-activations": (196 + 346.0283203125, 29),
        "seg-0-logits": (196 + 375.0283203125, 2),
        "seg-0-cuda_context": (196 + 377.0283203125, 14.5),
        "seg-0-headroom": (196 + 391.5283203125, 72.5),
    }
    assert segs.keys() == expected.keys()  # zero-byte components have no segment
    for key, (x, w) in expected.items():
        assert segs[key][0] == pytest.approx(x, abs=0.006), key
        assert segs[key][1] == pytest.approx(w, abs=0.006), key
    # The bar ends at its total: 196 + (16 GiB + 1 MiB) x 29 px/GiB.
    end = segs["seg-0-headroom"][0] + segs["seg-0-headroom"][1]
    assert end == pytest.approx(196 + 16 * 29 + 29 / 1024, abs=0.01)
    # Free space: from the bar's end to the capacity line at 196 + 580.
    (free_x, free_w) = _rects(root, "free")["free-0"]
    assert free_x == pytest.approx(end, abs=0.006)
    assert free_x + free_w == pytest.approx(BAR_X + BAR_WIDTH, abs=0.01)
    assert _lines(root, "capacity") == [(776, 776)]
    assert svg_texts(root, "capacity-label") == ["capacity 20.00 GiB"]
    assert svg_texts(root, "free-label") == ["free 4.00 GiB"]  # 3.999 GiB, two decimals
    assert svg_texts(root, "verdict") == ["fits"]
    assert svg_texts(root, "verdict-bytes") == ["4.00 GiB free"]
    assert not _rects(root, "missing")
    # The band: 12 GiB .. 16.5 GiB = 196 + 348 .. 196 + 478.5, around the subtotal's end.
    assert _lines(root, "band") == [(544, 674.5)]
    dot = next(c for c in root.iter(f"{SVG}circle") if c.get("class") == "subtotal")
    assert float(dot.get("cx", "nan")) == pytest.approx(196 + 391.5283, abs=0.006)
    assert not [p for p in root.iter(f"{SVG}polygon")]  # not clipped
    band_words = " ".join(svg_texts(root, "band-label"))  # wrapped to the picture's width
    assert "12.00 GiB to 16.50 GiB for 90% of 20 published measurements" in band_words
    assert "LoRA fine-tuning on several GPUs" in band_words
    assert "13.50 GiB estimated before headroom" in band_words
    # Human words everywhere a reader looks: labels, phases, the key and the footnote.
    assert svg_texts(root, "device") == ["Every device"]
    assert svg_texts(root, "device-total") == ["16.00 GiB at optimizer step"]
    assert svg_texts(root, "key-label") == [
        "Weights 10.00 GiB (62.5%)",
        "KV cache 2.00 GiB (12.5%)",
        "Activations 1.00 GiB (6.2%)",
        "Logits 1.0 MiB (<0.1%)",
        "CUDA context 512.0 MiB (3.1%)",
        "Headroom 2.50 GiB (15.6%)",
    ]
    words = " ".join(svg_texts(root))
    assert "_" not in words and "-0.0" not in words
    (footnote,) = svg_texts(root, "footnote")
    assert footnote.startswith("0 bytes in this budget: Quantization metadata, Adapters,")
    # Each segment and its key share the component's colour; the headroom is hatched.
    keys = {r.get("id"): r.get("fill") for r in root.iter(f"{SVG}rect") if r.get("class") == "key"}
    assert keys["key-0-kv_cache"] == COLOURS[Component.KV_CACHE]
    assert keys["key-0-headroom"] == "url(#headroom-hatch)"
    assert root.find(f"{SVG}defs/{SVG}pattern").get("id") == "headroom-hatch"  # type: ignore[union-attr]
    assert len(set(COLOURS.values())) == len(Component)
    # Every segment names itself in a tooltip.
    tips = [
        "".join(t.itertext())
        for r in root.iter(f"{SVG}rect")
        if r.get("class") == "segment"
        for t in r.iter(f"{SVG}title")
    ]
    assert tips[3] == "Every device: Logits, 1.0 MiB (1,048,576 bytes, <0.1%)"
    assert render_budget_svg(_budget((_device("every device", FITS, band),), 20 * GiB)) == svg


def test_title_accessibility_and_escaping() -> None:
    svg = render_budget_svg(_budget((_device("every device", FITS, None),), 20 * GiB))
    root = parse_svg(svg)
    assert root.get("role") == "img"
    assert root.get("aria-labelledby") == "svg-title svg-desc"
    title = root.find(f"{SVG}title")
    desc = root.find(f"{SVG}desc")
    assert title is not None and desc is not None
    assert title.get("id") == "svg-title" and desc.get("id") == "svg-desc"
    assert title.text == "Memory budget: m<1> & co on GPU <X>"
    assert svg_texts(root, "title") == [title.text]
    assert "m&lt;1&gt; &amp; co on GPU &lt;X&gt;" in svg
    assert desc.text is not None
    assert "Every device: Weights 10.00 GiB, KV cache 2.00 GiB" in desc.text
    assert "of 20.00 GiB: fits, 4.00 GiB free" in desc.text
    assert "No error band" in " ".join(svg_texts(root, "footnote"))
    assert not _lines(root, "band")
    # No external resource: no link, no script, no stylesheet, no image.
    assert "href" not in svg and "<script" not in svg and "<image" not in svg
    again = render_budget_svg(
        _budget((_device("every device", FITS, None),), 20 * GiB), title="A & B"
    )
    assert svg_texts(parse_svg(again), "title") == ["A & B"]


def test_two_stages_that_do_not_fit_and_a_clipped_band() -> None:
    big = {Component.WEIGHTS: 9 * GiB, Component.HEADROOM: 3 * GiB}  # 12 GiB
    small = {Component.WEIGHTS: 6 * GiB, Component.HEADROOM: 2 * GiB}  # 8 GiB
    budget = _budget(
        (
            _device("pipeline stage 0", big, _band(6 * GiB, 40 * GiB)),
            _device("pipeline stage 1", small, _band(5 * GiB, 9 * GiB)),
        ),
        10 * GiB,
    )
    root = parse_svg(render_budget_svg(budget))
    # The scale: the band's 40 GiB is past 3/2 x max(capacity 10, totals 12) = 18 GiB, so the
    # scale ends at 18 GiB (580 / 18 px per GiB) and that band is clipped with an arrow.
    px = BAR_WIDTH / 18
    segs = _rects(root, "segment")
    assert segs["seg-0-weights"][1] == pytest.approx(9 * px, abs=0.006)
    assert segs["seg-1-headroom"][1] == pytest.approx(2 * px, abs=0.006)
    # Stage 0 is 2 GiB past the capacity: outlined in red from 10 to 12 GiB.
    (mx, mw) = _rects(root, "missing")["missing-0"]
    assert mx == pytest.approx(BAR_X + 10 * px, abs=0.006)
    assert mw == pytest.approx(2 * px, abs=0.01)
    assert _rects(root, "free").keys() == {"free-1"}
    assert svg_texts(root, "verdict") == ["does not fit", "fits"]
    assert svg_texts(root, "verdict-bytes") == ["2.00 GiB missing", "2.00 GiB free"]
    bands = _lines(root, "band")
    assert bands[0] == pytest.approx((BAR_X + 6 * px, BAR_X + BAR_WIDTH), abs=0.006)
    assert bands[1] == pytest.approx((BAR_X + 5 * px, BAR_X + 9 * px), abs=0.006)
    assert len([p for p in root.iter(f"{SVG}polygon") if p.get("class") == "band-clipped"]) == 1
    assert "40.00 GiB" in " ".join(svg_texts(root, "band-label"))  # the label keeps the real end
    assert svg_texts(root, "device") == ["Pipeline stage 0", "Pipeline stage 1"]
    assert svg_texts(root, "key-heading")[0].startswith("Pipeline stage 0 (most loaded): ")
    # Axis ticks: at most 8 intervals over 18 GiB need a step >= 2.25, and the first of
    # 1, 2, 5 x 10^k past it is 5: 0, 5, 10, 15 within the scale.
    assert svg_texts(root, "tick") == ["0", "5", "10", "15"]
    assert svg_texts(root, "unit") == ["GiB"]


def test_without_a_device() -> None:
    small = {Component.WEIGHTS: 300 * MiB, Component.CUDA_CONTEXT: 200 * MiB}
    root = parse_svg(render_budget_svg(_budget((_device("every device", small, None),), None)))
    assert svg_texts(root, "title") == ["Memory budget: m<1> & co, no device given"]
    assert not _lines(root, "capacity") and not _rects(root, "free")
    assert svg_texts(root, "verdict") == ["no device given"]
    assert svg_texts(root, "verdict-bytes") == ["500.0 MiB"]
    # Under 2 GiB the axis is in MiB: the scale ends at the total, 500 MiB.
    assert svg_texts(root, "unit") == ["MiB"]
    assert svg_texts(root, "tick") == ["0", "100", "200", "300", "400", "500"]
    segs = _rects(root, "segment")
    assert segs["seg-0-weights"][1] == pytest.approx(BAR_WIDTH * 300 / 500, abs=0.006)


def test_a_real_estimate() -> None:
    w = InferenceWorkload(model=PresetModel(id="llama-3.1-8b"), batch_size=4)
    budget = estimate((w,), CatalogDevice(id="l4-24gb"), Headroom())
    root = parse_svg(render_budget_svg(budget))
    assert svg_texts(root, "title") == ["Memory budget: llama-3.1-8b on NVIDIA L4 24GB"]
    d = budget.devices[0]
    nonzero = [ln for ln in d.lines if ln.bytes]
    assert len(_rects(root, "segment")) == len(nonzero) == len(svg_texts(root, "key-label"))
    assert budget.device is not None and d.band is not None
    capacity = budget.device.memory_total_bytes
    base = max(capacity, d.total_bytes)
    end = max(base, min(d.band.high_bytes, base * 3 // 2))
    x, w_ = _rects(root, "segment")["seg-0-headroom"]
    assert x + w_ == pytest.approx(BAR_X + d.total_bytes * BAR_WIDTH / end, abs=0.01)
    free = capacity - d.total_bytes
    assert svg_texts(root, "verdict") == ["fits" if free >= 0 else "does not fit"]


def test_the_pictures_in_the_docs_are_current() -> None:
    from bench.budget_pictures import check

    assert check() == [], "regenerate: python -m bench.budget_pictures (and review the diff)"


def _estimated(request: dict[str, object]) -> Budget:
    import msgspec

    from vrambudget.core.spec import BudgetRequest

    req = msgspec.convert(request, BudgetRequest)
    return estimate(req.workloads, req.device, req.headroom, software=req.software)


def test_a_serving_engine_that_would_not_start() -> None:
    budget = _estimated(
        {
            "workloads": [
                {
                    "kind": "llm_serving",
                    "model": {"source": "preset", "id": "llama-3.1-70b"},
                    "engine": "vllm",
                }
            ],
            "device": {"source": "catalog", "id": "l4-24gb"},
        }
    )
    assert budget.serving is not None and not budget.serving.would_start
    root = parse_svg(render_budget_svg(budget))
    assert svg_texts(root, "verdict") == ["would not start"]
    missing = budget.total_bytes - budget.device.memory_total_bytes  # type: ignore[union-attr]
    assert svg_texts(root, "verdict-bytes") == [f"{missing / GiB:.2f} GiB missing"]
    subtitle = " ".join(svg_texts(root, "subtitle"))
    assert subtitle.startswith(f"LLM serving, bf16 weights; vLLM {budget.serving.engine_version}.")
    notes = " ".join(svg_texts(root, "footnote"))
    assert "vLLM would not start: no available memory for the cache blocks" in notes


def test_co_located_workloads_are_named_and_long_labels_fit() -> None:
    budget = _estimated(
        {
            "workloads": [
                {
                    "kind": "inference",
                    "model": {"source": "preset", "id": "qwen2.5-7b"},
                    "batch_size": 2,
                },
                {
                    "kind": "inference",
                    "model": {"source": "preset", "id": "gemma-2-2b"},
                    "batch_size": 1,
                },
            ],
            "device": {"source": "catalog", "id": "l4-24gb"},
        }
    )
    root = parse_svg(render_budget_svg(budget))
    assert svg_texts(root, "title") == ["Memory budget: qwen2.5-7b + gemma-2-2b on NVIDIA L4 24GB"]
    subtitle = " ".join(svg_texts(root, "subtitle"))
    assert subtitle.startswith("qwen2.5-7b: inference, bf16 weights; gemma-2-2b: inference")
    # The left column (16 .. 186 px) shortens the long label and drops the long phase; the
    # key under the axis keeps both whole.
    (label,) = svg_texts(root, "device")
    assert label.startswith("Co-located (most") and label.endswith("…") and len(label) < 30
    total = f"{budget.devices[0].total_bytes / GiB:.2f} GiB"
    assert svg_texts(root, "device-total") == [f"{total} at its peak"]
    (heading,) = svg_texts(root, "key-heading")
    assert heading == (
        f"Co-located (most loaded stage of each workload): {total} at its peak "
        "(qwen2.5-7b: prefill; gemma-2-2b: prefill)"
    )


def test_words_for_readers() -> None:
    from vrambudget.core.bands import class_label
    from vrambudget.core.comparison import QUANTITY_LABELS, quantity_label

    assert [c.label for c in Component][:4] == [
        "Weights",
        "Quantization metadata",
        "Adapters",
        "KV cache",
    ]
    assert Component.CUDA_CONTEXT.label == "CUDA context"
    labels = [c.label for c in Component] + list(QUANTITY_LABELS.values())
    assert not [w for w in labels if "_" in w or w[0].islower()]
    assert quantity_label("device_used_peak") == "Device used peak"
    assert quantity_label("some_new_quantity") == "Some new quantity"
    assert class_label("fine_tuning_qlora_multi_gpu") == "QLoRA fine-tuning on several GPUs"
    assert class_label("training_full") == "full training"
    assert class_label("inference") == "inference"
