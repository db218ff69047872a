"""The ``vrambudget`` command line (vrambudget/cli/main.py): estimate, chart, agent openapi."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import msgspec
import pytest

from tests.support import ROOT
from vrambudget.cli.main import main
from vrambudget.core.chart import render_comparison_svg
from vrambudget.core.comparison import (
    Comparison,
    HeadroomAdvice,
    QuantityComparison,
    TierComparison,
)


def test_cli_prints_the_agent_openapi(capsys: pytest.CaptureFixture[str]) -> None:
    from vrambudget.cli.main import main

    assert main(["agent", "openapi"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(
        (ROOT / "openapi" / "agent.json").read_text()
    )


SVG = "{http://www.w3.org/2000/svg}"

MIB = 1 << 20


def _q(name: str, est: int | None, meas: int | None, verdict: str) -> QuantityComparison:
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


def _cuda() -> Comparison:
    analytic = (
        _q("resident_after_load", 1000 * MIB, 1000 * MIB, "within"),
        _q("kv_cache", 300 * MIB, 200 * MIB, "over"),
        _q("allocated_peak", 2000 * MIB, 2100 * MIB, "within"),
        _q("working_set_peak", 400 * MIB, 600 * MIB, "under"),
        _q("communication_buffers", 0, None, "not_applicable"),
        _q("runtime_workspace", 0, 0, "within"),
        _q("device_used_peak", 3000 * MIB, 3300 * MIB, "within"),
        _q("unexplained", 0, 50 * MIB, "under"),
    )
    trace = (
        _q("resident_after_load", 1000 * MIB, 1000 * MIB, "within"),
        _q("kv_cache", 200 * MIB, 200 * MIB, "within"),
        _q("allocated_peak", 2050 * MIB, 2100 * MIB, "within"),
        _q("working_set_peak", 640 * MIB, 600 * MIB, "within"),
        _q("communication_buffers", 0, None, "not_applicable"),
        _q("device_used_peak", 3200 * MIB, 3300 * MIB, "within"),
        _q("unexplained", 0, 50 * MIB, "under"),
    )
    return Comparison(
        probe_id="p<2>",
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


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg.encode())
    assert root.tag == f"{SVG}svg" and root.get("version") == "1.1"
    return root


def _texts(root: ET.Element, cls: str | None = None) -> list[str]:
    return [
        "".join(t.itertext())
        for t in root.iter(f"{SVG}text")
        if cls is None or (t.get("class") or "").split()[:1] == [cls]
    ]


def test_cli_writes_a_file(tmp_path: Path, cpu_comparison: Comparison) -> None:
    src = tmp_path / "c.json"
    src.write_bytes(msgspec.json.encode(cpu_comparison))
    out = tmp_path / "c.svg"
    assert main(["chart", str(src), "-o", str(out), "--title", "CPU <test>"]) == 0
    root = _parse(out.read_text())
    assert _texts(root, "title") == ["CPU <test>"]
    assert out.read_text() == render_comparison_svg(cpu_comparison, title="CPU <test>")


def test_cli_reads_a_probe_resource_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c = _cuda()
    probe = {"id": "p<2>", "status": "succeeded", "comparison": msgspec.to_builtins(c)}
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(json.dumps(probe).encode())))
    assert main(["chart", "-"]) == 0
    assert capsys.readouterr().out == render_comparison_svg(c)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "not JSON"),
        (b'{"probe_id": "x"}', "not a comparison"),
        (b'{"id": "p1", "comparison": null}', "no comparison"),
        (b"[1, 2]", "not a comparison"),
    ],
)
def test_cli_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    src = tmp_path / "bad.json"
    src.write_bytes(content)
    assert main(["chart", str(src)]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
    assert "Traceback" not in captured.err


def test_cli_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chart", str(tmp_path / "absent.json")]) == 2
    assert "absent.json" in capsys.readouterr().err


def test_estimate_table(capsys):
    assert main(["estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm5-80gb"]) == 0
    out = capsys.readouterr().out
    assert "weights" in out and "13,476,831,232" in out and "fits" in out


def test_estimate_json_file(tmp_path, capsys):
    f = tmp_path / "w.json"
    f.write_text(
        json.dumps({"kind": "training", "model": {"source": "preset", "id": "qwen2.5-0.5b"}})
    )
    assert main(["estimate", "--file", str(f), "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)
    assert budget["workloads"][0]["kind"] == "training"


def test_estimate_serving_prints_the_engine_summary(tmp_path, capsys):
    f = tmp_path / "serving.json"
    f.write_text(
        json.dumps(
            {
                "workloads": [
                    {
                        "kind": "llm_serving",
                        "model": {"source": "preset", "id": "llama-3.1-8b"},
                        "max_model_len": 8192,
                        "gpu_memory_utilization": 0.9,
                    }
                ],
                "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
            }
        )
    )
    assert main(["estimate", "--file", str(f)]) == 0
    out = capsys.readouterr().out
    # The numbers of docs/API.md's serving example.
    assert "vllm 0.19.0 on NVIDIA H100 SXM5 80GB: starts" in out
    assert "443,600 tokens (27,725 blocks of 16); max concurrency 54.1504" in out


def test_estimate_error_is_clear(capsys):
    assert main(["estimate", "--model", "llama-2-7b", "--batch", "0"]) == 2
    assert "batch_size" in capsys.readouterr().err
