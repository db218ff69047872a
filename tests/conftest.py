"""Shared fixtures and the test tiers.

Fast tier (everything but real processes, fuzzing and the trace oracle grid; about a minute on
a 2-core machine):

    .venv/bin/python -m pytest -m "not e2e and not fuzz and not trace_grid"

Everything (what ``scripts/test`` and the README run):

    .venv/bin/python -m pytest

Markers (registered in pyproject.toml, ``--strict-markers``): ``e2e`` is set here on every test
under tests/e2e/ (real agent/service processes on 127.0.0.1), ``fuzz`` on every test under
tests/fuzz/ (schemathesis), ``trace_grid`` by tests/trace/test_oracle.py (the oracle grid) and
the GPU campaign's CPU dry run (tests/bench), ``gpu`` by tests that need a CUDA device. Plain
helpers (functions, classes) are in tests/support/.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.workloads import workload

_TESTS = Path(__file__).resolve().parent
_BY_DIRECTORY = {"e2e": pytest.mark.e2e, "fuzz": pytest.mark.fuzz}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _unique_node_ids(items)
    for item in items:
        try:
            top = item.path.resolve().relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        if top in _BY_DIRECTORY:
            item.add_marker(_BY_DIRECTORY[top])


def _unique_node_ids(items: list[pytest.Item]) -> None:
    """Schemathesis' ``schema.parametrize()`` names each operation's item
    ``test_api_conforms[POST /v1/fits]`` but leaves every node id ``...::test_api_conforms``.
    pytest-xdist schedules and reports by node id, so under ``-n`` only one of those items ran
    (and an operation schemathesis could not generate for went unseen). Each such item gets the
    node id its name says."""
    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and item.name != item.nodeid.rsplit("::", 1)[-1]:
            nodeid = f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}"
            if hasattr(item, "_id"):  # pytest 9: a structured NodeId behind ``nodeid``
                item._id = type(item._id).parse(nodeid)
            else:
                item._nodeid = nodeid


@pytest.fixture
def make_workload() -> Any:
    """``workload(**fields)``: a workload decoded exactly as the API would."""
    return workload


@pytest.fixture(scope="session")
def cpu_comparison() -> Any:
    """A real comparison: a CPU probe of a tiny model (real torch, about a second), compared
    with its analytic estimate. Session-scoped: the chart and CLI tests share one."""
    import msgspec

    from tests.support.workloads import INFER
    from vrambudget.agent.child import ChildSettings
    from vrambudget.agent.probe import measure
    from vrambudget.agent.spec import ProbeRequest, ProbeResource
    from vrambudget.core.compare import compare, estimate_input
    from vrambudget.core.estimate import estimate
    from vrambudget.core.spec import Headroom

    req = msgspec.convert({"workload": INFER, "iterations": 2}, ProbeRequest)
    out = measure(req, ChildSettings())
    rep = ProbeResource(
        id="p1", status=out.status, created_at=0, updated_at=0, request=req, result=out.result
    )
    inp = estimate_input(rep)
    b = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
    return compare(rep, {"analytic": b}, inp)
