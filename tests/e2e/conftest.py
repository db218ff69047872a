"""Fixtures of the end-to-end tests (real processes on 127.0.0.1; marked ``e2e``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.processes import Receiver


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """A webhook receiver, up for the whole module."""
    with Receiver() as r:
        yield r
