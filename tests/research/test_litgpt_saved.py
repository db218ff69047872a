"""research/litgpt_saved.py's formula column is the one research/stack_behaviours.md section 2d
quotes against LitGPT's own saved tensors (the LitGPT side needs an unpacked litgpt wheel and
is run by hand)."""

from __future__ import annotations

import re
from pathlib import Path

from research.litgpt_saved import CASES, formula_activations

NOTE = Path(__file__).parents[2] / "research" / "stack_behaviours.md"


def test_the_note_quotes_the_current_formula() -> None:
    section = NOTE.read_text().split("## 2d.")[1].split("\n## ")[0]
    rows = re.findall(r"^\| (?:MHA|GQA|MQA) .*$", section, flags=re.M)
    assert len(rows) == len(CASES)
    for row, case in zip(rows, CASES, strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        real, formula = (int(c.replace(",", "")) for c in cells[3:5])
        assert formula == formula_activations(case)
        assert cells[5] == f"{(formula - real) / real:+.1%}"
