"""Entry points the agent tests configure (``VRAMBUDGET_AGENT_ENTRY_POINTS``)."""

from __future__ import annotations

import time
from typing import Any


class _Sleeper:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, iterations: int) -> None:
        for _ in range(iterations):
            time.sleep(self.seconds)


def sleeper(*, device: Any, marks: Any, seconds: float = 60.0) -> _Sleeper:
    """A workload that only waits: for time limits, cancellation and full queues."""
    return _Sleeper(seconds)
