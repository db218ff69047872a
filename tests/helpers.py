from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.spec import Workload


def workload(**fields: object) -> Workload:
    """Decode a workload exactly as the API would (defaults, tags and checks included)."""
    return msgspec.convert(fields, Workload)


@pytest.fixture
def make_workload():
    return workload
