"""The ``vrambudget`` command line (vrambudget/cli/main.py): estimate, chart, agent openapi."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pytest

from tests.support import ROOT
from tests.support.comparisons import cuda_comparison, parse_svg, svg_texts
from vrambudget.cli.main import main
from vrambudget.core.chart import render_comparison_svg
from vrambudget.core.comparison import (
    Comparison,
)


def test_cli_prints_the_agent_openapi(capsys: pytest.CaptureFixture[str]) -> None:
    from vrambudget.cli.main import main

    assert main(["agent", "openapi"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(
        (ROOT / "openapi" / "agent.json").read_text()
    )


def test_cli_writes_a_file(tmp_path: Path, cpu_comparison: Comparison) -> None:
    src = tmp_path / "c.json"
    src.write_bytes(msgspec.json.encode(cpu_comparison))
    out = tmp_path / "c.svg"
    assert main(["chart", str(src), "-o", str(out), "--title", "CPU <test>"]) == 0
    root = parse_svg(out.read_text())
    assert svg_texts(root, "title") == ["CPU <test>"]
    assert out.read_text() == render_comparison_svg(cpu_comparison, title="CPU <test>")


def test_cli_reads_a_probe_resource_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cuda_comparison()
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
    assert "weights" in out and "13,476,831,232" in out
    assert out.rstrip().splitlines()[-1].startswith("FITS NVIDIA H100 SXM5 80GB (79.20 GiB)")


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
                        "engine_version": "0.19.0",
                    }
                ],
                "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
            }
        )
    )
    assert main(["estimate", "--file", str(f)]) == 0
    out = capsys.readouterr().out
    # The numbers of docs/API.md's serving example.
    assert "vllm 0.19.0 (rules of 0.19.0) on NVIDIA H100 SXM5 80GB: starts" in out
    assert "443,600 tokens; max concurrency 54.1504 at 8,192 tokens per request" in out
    assert "launch: vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 1" in out


def test_estimate_error_is_clear(capsys):
    assert main(["estimate", "--model", "llama-2-7b", "--batch", "0"]) == 2
    assert "batch_size" in capsys.readouterr().err


def test_without_the_framework_a_config_is_refused_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without transformers installed, a config of a family without a closed form is a clear
    error naming the field and the extra (the framework is imported lazily, so the check is
    whether it is installed, not whether a module imports)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformers" else real(name, *a),
    )
    phi = tmp_path / "phi.json"
    phi.write_text(json.dumps({"model_type": "phi", "hidden_size": 256, "num_hidden_layers": 2}))
    assert main(["estimate", "--config", str(phi)]) == 2
    err = capsys.readouterr().err
    assert "workloads[0].model" in err and "transformers is not installed" in err
    assert "vrambudget[trace]" in err
