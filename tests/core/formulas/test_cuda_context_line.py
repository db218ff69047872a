"""The bare CUDA context at a process's start as a line in the GPU's resident threads
(vrambudget/core/formulas/cuda_context.py ``start_context``): fitted to three published bare
lazy-loading contexts, checked against them and against start-up logs of GPUs the fit did not
see, and read for every NVIDIA catalog GPU through its SM count by SGLang's start-up; the
budget's own context line keeps its per-class constants."""

from __future__ import annotations

import math

import pytest

from vrambudget.core.catalog import gpus
from vrambudget.core.device import resolve_device
from vrambudget.core.formulas.cuda_context import (
    CONTEXT_INTERCEPT,
    CONTEXT_PER_THREAD,
    CONTEXT_POINTS,
    default_context,
    start_context,
)
from vrambudget.core.spec import CatalogDevice
from vrambudget.core.units import MiB

# The three measurements, by hand: (resident threads, bytes).
# RTX 3090: 82 SMs x 1536; RTX 6000 Ada: 142 x 1536; H100 / H200: 132 x 2048.
POINTS = [(82 * 1536, 256 * MiB), (142 * 1536, 426 * MiB), (132 * 2048, 548_995_072)]


def _by_hand() -> tuple[float, float]:
    """Ordinary least squares, the textbook closed form in floats."""
    n = len(POINTS)
    sx = sum(x for x, _ in POINTS)
    sy = sum(y for _, y in POINTS)
    sxx = sum(x * x for x, _ in POINTS)
    sxy = sum(x * y for x, y in POINTS)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - slope * sx) / n, slope


def test_the_line_is_the_least_squares_fit_of_the_three_measurements() -> None:
    assert [(p.resident_threads, p.bytes) for p in CONTEXT_POINTS] == POINTS
    intercept, slope = _by_hand()
    assert float(CONTEXT_INTERCEPT) == pytest.approx(intercept, rel=1e-9)
    assert float(CONTEXT_PER_THREAD) == pytest.approx(slope, rel=1e-9)
    # about 22.5 MiB plus 1.94 KiB per resident thread
    assert intercept / MiB == pytest.approx(22.53, abs=0.01)
    assert slope == pytest.approx(1942.1, abs=0.1)


def test_each_measurement_lies_within_0_6_mib_of_the_line() -> None:
    intercept, slope = _by_hand()
    for x, y in POINTS:
        assert abs(intercept + slope * x - y) < 0.6 * MiB


@pytest.mark.parametrize(
    ("sm", "cc", "threads"),
    [
        (142, "8.9", 142 * 1536),  # L40S, RTX 6000 Ada
        (128, "8.9", 128 * 1536),  # RTX 4090
        (108, "8.0", 108 * 2048),  # A100
        (148, "10.0", 148 * 2048),  # B200: above the measured range, the line goes on
    ],
)
def test_a_gpu_takes_the_line_at_its_resident_threads(sm: int, cc: str, threads: int) -> None:
    intercept, slope = _by_hand()
    got = start_context(sm, cc)
    assert got is not None
    value, source = got
    assert value == math.ceil(intercept + slope * threads)
    assert f"{sm} SMs x" in source and "CUDA C++ Programming Guide" in source


def test_each_point_is_its_catalog_gpus_sm_count_and_capability() -> None:
    for p in CONTEXT_POINTS:
        for gpu_id in p.gpu_ids:
            g = gpus()[gpu_id]
            assert (g.sm_count, g.compute_capability) == (p.sm_count, p.compute_capability)


def test_the_l40s_worked_number() -> None:
    """The docstring's worked number: 142 SMs x 1536 = 218,112 resident threads."""
    intercept, slope = _by_hand()
    assert math.ceil(intercept + slope * 218_112) == 447_228_195
    got = start_context(142, "8.9")
    assert got is not None and got[0] == 447_228_195


def test_below_the_smallest_measured_gpu_the_line_is_not_extrapolated() -> None:
    """A T4 (40 SMs x 1024) and an L4 (58 x 1536) hold fewer resident threads than the RTX
    3090: they take its value, not less. The L4's own start (an SGLang 0.4.3 log on 4 x L4:
    21.63 GiB free after 'Init torch distributed ends. mem usage=0.13 GB', of 21.95 GiB) shows
    about 0.19 GiB, below that value: the floor errs on the safe side."""
    floor = start_context(82, "8.6")
    assert floor is not None
    for sm, cc in ((40, "7.5"), (58, "8.9")):
        got = start_context(sm, cc)
        assert got is not None and got[0] == floor[0]
        assert "fewer than the smallest measured GPU" in got[1]
    l4_log = round((21.95 - 21.63 - 0.13) * (1 << 30))
    assert l4_log < floor[0]


def test_threads_per_sm_not_tabled_gives_no_line() -> None:
    assert start_context(28, "6.1") is None


def test_the_budget_keeps_its_per_class_context() -> None:
    """The budget's context line is not the start line (default_context's docstring says
    why): 534 MiB on 9.x/10.x, 426 MiB elsewhere, whatever the SM count."""
    assert default_context("9.0", "nvidia")[0] == 534 * MiB
    assert default_context("8.9", "nvidia")[0] == 426 * MiB
    assert default_context(None, "amd")[0] == 426 * MiB


@pytest.mark.parametrize("gpu_id", sorted(g.id for g in gpus().values() if g.vendor == "nvidia"))
def test_every_nvidia_catalog_gpu_carries_its_sm_count_to_the_engines(gpu_id: str) -> None:
    g = gpus()[gpu_id]
    ctx = resolve_device(CatalogDevice(id=gpu_id))
    assert ctx is not None and ctx.sm_count == g.sm_count
    assert start_context(ctx.sm_count or 0, ctx.compute_capability or "") is not None
