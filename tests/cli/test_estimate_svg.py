"""``vrambudget estimate --svg FILE`` (vrambudget/cli/main.py): the budget's picture."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.comparisons import parse_svg, svg_texts
from vrambudget.cli.main import main
from vrambudget.core.budget_chart import render_budget_svg
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import CatalogDevice, Headroom, InferenceWorkload, PresetModel


def test_estimate_writes_the_picture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.svg"
    assert (
        main(["estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm5-80gb", "--svg", str(out)])
        == 0
    )
    assert "13,476,831,232" in capsys.readouterr().out  # the table is still printed
    w = InferenceWorkload(
        model=PresetModel(id="llama-2-7b"), prompt_tokens=1024, generated_tokens=256
    )
    budget = estimate((w,), CatalogDevice(id="h100-sxm5-80gb"), Headroom())
    assert out.read_text(encoding="utf-8") == render_budget_svg(budget)
    root = parse_svg(out.read_text(encoding="utf-8"))
    assert svg_texts(root, "title") == ["Memory budget: llama-2-7b on NVIDIA H100 SXM5 80GB"]
    assert svg_texts(root, "verdict") == ["fits"]


def test_estimate_svg_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.svg"
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--json", "--svg", str(out)]) == 0
    assert capsys.readouterr().out.lstrip().startswith("{")
    assert svg_texts(parse_svg(out.read_text()), "verdict") == ["no device given"]


def test_estimate_svg_unwritable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "missing-dir" / "b.svg"
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--svg", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
