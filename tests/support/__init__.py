"""Plain helpers the tests share (functions, classes, constants); fixtures live in conftest.py.

Imported as ``tests.support.<module>`` (the repository root is on ``sys.path``: pytest's
``pythonpath = ["."]``), also by worker processes that load ``tests.support.*`` entry points.
"""

from __future__ import annotations

from pathlib import Path

#: The repository root (openapi/, docs/, research/ are read from here).
ROOT = Path(__file__).resolve().parents[2]
