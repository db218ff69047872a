"""Trace entry points for tests/service/test_tracing.py. They run inside the trace pool's spawned
worker processes (``VRAMBUDGET_TRACE_ENTRY=tests.support.trace_entries:scripted``), so they behave
like
the engine from the outside: take a BudgetRequest, return a Budget or raise.

``scripted`` picks a behaviour from the first workload's ``name``:

==================  =======================================================================
``sleep:S[:tag]``   sleep S seconds, then answer like ``tiny`` (S past the limit: a timeout)
``invalid``         raise InvalidWorkload at ``workloads[0].model``
``crash``           ``os._exit(137)``: the worker dies as if killed for memory
``boom``            raise RuntimeError (an engine bug)
anything else       ``tiny``
==================  =======================================================================

Every call appends ``<pid> <name>`` to the file named by ``$VRAMBUDGET_TEST_TRACE_CALLS`` (the
workers inherit the environment when they are spawned), so tests can count engine calls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest

CALLS_ENV = "VRAMBUDGET_TEST_TRACE_CALLS"


def calls(path: Path, name: str | None = None) -> list[str]:
    """The workload names the fixtures were called with (all, or those equal to ``name``)."""
    if not path.exists():
        return []
    names = [line.split(" ", 1)[1] for line in path.read_text().splitlines() if line]
    return names if name is None else [n for n in names if n == name]


def _record(name: str) -> None:
    path = os.environ.get(CALLS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {name}\n")


def tiny(request: BudgetRequest) -> Budget:
    """A real (if trivial) trace-tier answer: the analytic budget, marked as a trace, with one
    warning computed by torch in this worker (so the test sees torch was importable here)."""
    import torch

    _record(request.workloads[0].name or "")
    budget = estimate(request.workloads, request.device, request.headroom)
    n = int(torch.ones(3).sum().item())
    return msgspec.structs.replace(
        budget, method="trace", warnings=(*budget.warnings, f"fixture: torch summed {n}")
    )


def scripted(request: BudgetRequest) -> Budget:
    name = request.workloads[0].name or ""
    if name.startswith("sleep:"):
        time.sleep(float(name.split(":")[1]))
        return tiny(request)
    if name == "invalid":
        _record(name)
        raise InvalidWorkload("workloads[0].model", "the fixture does not trace this model")
    if name == "crash":
        _record(name)
        os._exit(137)
    if name == "boom":
        _record(name)
        raise RuntimeError("fixture engine bug")
    return tiny(request)
