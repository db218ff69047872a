"""The shared SVG helpers (vrambudget/core/svg.py): numbers a reader sees."""

from __future__ import annotations

import pytest

from vrambudget.core.svg import human_bytes, num, percent, ticks
from vrambudget.core.units import GiB, KiB, MiB


@pytest.mark.parametrize(
    ("p", "text"),
    [
        (19.1, "+19.1%"),
        (-33.33, "-33.3%"),
        (0.0, "0.0%"),
        (-0.0, "0.0%"),  # never "-0.0%"
        (-0.04, "-0.04%"),  # one decimal would print -0.0: two
        (0.004, "0.0%"),  # rounds to zero at two decimals too
        (-0.001, "0.0%"),
        (100.0, "+100.0%"),
    ],
)
def test_percent(p: float, text: str) -> None:
    assert percent(p) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (KiB, "1.0 KiB"),
        (3 * MiB + MiB // 5, "3.2 MiB"),
        (1023 * MiB, "1023.0 MiB"),
        (GiB, "1.00 GiB"),
        (16060522496, "14.96 GiB"),  # llama-3.1-8b's bf16 weights
        (-5 * GiB // 2, "-2.50 GiB"),
        (-1, "-1 B"),
    ],
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    ("top", "expected"),
    [
        (21.95, [0, 5, 10, 15, 20, 25]),  # 21.95 / 8 = 2.74 -> step 5
        (8, [0, 1, 2, 3, 4, 5, 6, 7, 8]),
        (1000, [0, 200, 400, 600, 800, 1000]),  # 125 -> 200
        (0.6, [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),
        (0, [0]),
    ],
)
def test_ticks(top: float, expected: list[float]) -> None:
    assert ticks(top) == pytest.approx(expected)


def test_num_is_stable_text() -> None:
    assert [num(x) for x in (1.0, 1.5, 2.125, -0.001, 288.0283203125)] == [
        "1",
        "1.5",
        "2.12",
        "0",
        "288.03",
    ]
