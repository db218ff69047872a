"""research/committed.py: a fitted file is written, or checked against a fresh fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from research.committed import write_or_check


def test_write_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fit.json"
    assert write_or_check(out, "{}\n", True, "python -m x") == 1  # absent: stale
    assert "fit.json differs from a fresh fit: run python -m x" in capsys.readouterr().err
    assert write_or_check(out, "{}\n", False, "python -m x") == 0
    assert out.read_text() == "{}\n"
    assert write_or_check(out, "{}\n", True, "python -m x") == 0
    assert write_or_check(out, '{"a": 1}\n', True, "python -m x") == 1
    assert out.read_text() == "{}\n"  # a check never writes
