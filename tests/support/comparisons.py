"""A CUDA-shaped comparison and SVG readers, shared by the chart and CLI tests."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from vrambudget.core.comparison import (
    Comparison,
    HeadroomAdvice,
    QuantityComparison,
    TierComparison,
)

__all__ = ["MIB", "SVG", "cuda_comparison", "parse_svg", "quantity", "svg_texts"]

SVG = "{http://www.w3.org/2000/svg}"

MIB = 1 << 20


def quantity(name: str, est: int | None, meas: int | None, verdict: str) -> QuantityComparison:
    diff = None if est is None or meas is None else est - meas
    pct = None if diff is None or not meas else round(diff / meas * 100, 2)
    return QuantityComparison(
        name=name,
        components=(),
        estimate_bytes=est,
        measured_bytes=meas,
        difference_bytes=diff,
        difference_percent=pct,
        verdict=verdict,  # type: ignore[arg-type]
        measured_by="test",
    )


def cuda_comparison() -> Comparison:
    analytic = (
        quantity("resident_after_load", 1000 * MIB, 1000 * MIB, "within"),
        quantity("kv_cache", 300 * MIB, 200 * MIB, "over"),
        quantity("allocated_peak", 2000 * MIB, 2100 * MIB, "within"),
        quantity("working_set_peak", 400 * MIB, 600 * MIB, "under"),
        quantity("communication_buffers", 0, None, "not_applicable"),
        quantity("runtime_workspace", 0, 0, "within"),
        quantity("device_used_peak", 3000 * MIB, 3300 * MIB, "within"),
        quantity("unexplained", 0, 50 * MIB, "under"),
    )
    trace = (
        quantity("resident_after_load", 1000 * MIB, 1000 * MIB, "within"),
        quantity("kv_cache", 200 * MIB, 200 * MIB, "within"),
        quantity("allocated_peak", 2050 * MIB, 2100 * MIB, "within"),
        quantity("working_set_peak", 640 * MIB, 600 * MIB, "within"),
        quantity("communication_buffers", 0, None, "not_applicable"),
        quantity("device_used_peak", 3200 * MIB, 3300 * MIB, "within"),
        quantity("unexplained", 0, 50 * MIB, "under"),
    )
    return Comparison(
        probe_id="p<2>",
        model="qwen<2>",
        status="succeeded",
        device="cuda",
        device_name="NVIDIA <H100> & co",
        gpu_id="h100-sxm5-80gb",
        tolerance_percent=10.0,
        tolerance_bytes=MIB,
        views=("torch", "nvml"),
        degraded=(),
        tiers=(
            TierComparison(
                method="analytic",
                estimate_subtotal_bytes=3000 * MIB,
                quantities=analytic,
                components=(),
            ),
            TierComparison(
                method="trace", estimate_subtotal_bytes=3200 * MIB, quantities=trace, components=()
            ),
        ),
        headroom=HeadroomAdvice(fraction=0.07, bytes=210 * MIB, reasons=("test",)),
    )


def parse_svg(svg: str) -> ET.Element:
    root = ET.fromstring(svg.encode())
    assert root.tag == f"{SVG}svg" and root.get("version") == "1.1"
    return root


def svg_texts(root: ET.Element, cls: str | None = None) -> list[str]:
    return [
        "".join(t.itertext())
        for t in root.iter(f"{SVG}text")
        if cls is None or (t.get("class") or "").split()[:1] == [cls]
    ]
