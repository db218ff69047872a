"""Kept for bench/trace_accuracy.py and bench/gpu_trace_vs_real.py, which import
``tests.trace_grid``; the grid lives in tests/support/trace_grid.py. Remove this file once they
import ``tests.support.trace_grid``."""

from tests.support.trace_grid import GRID, compare  # noqa: F401
