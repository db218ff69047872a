"""The parent side of a probe: spawn a fresh child, enforce the time limit, cancel on request.

``spawn`` (not ``fork``): the child starts from a clean interpreter, so no CUDA state, thread or
lock of the agent process leaks into it, and the agent itself never initializes CUDA.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from dataclasses import dataclass

from .probe import child_main

__all__ = ["ChildResult", "ProbeProcess"]

_POLL_S = 0.05
_KILL_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class ChildResult:
    status: str
    """succeeded | oom | unreliable | failed | timeout | cancelled"""
    result_json: bytes | None
    error: str | None


class ProbeProcess:
    """One child process running one probe. ``wait()`` blocks (run it in a thread)."""

    def __init__(self, request_json: bytes, entry_points: dict[str, str], time_limit_s: float
                 ) -> None:
        ctx = mp.get_context("spawn")
        self._recv, send = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=child_main, args=(request_json, entry_points, send),
                                    daemon=True, name="vrambudget-probe")
        self._send = send
        self._time_limit_s = time_limit_s
        self._cancel = threading.Event()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def start(self) -> None:
        self._process.start()
        self._send.close()  # the child holds the only write end: EOF when it dies

    def cancel(self) -> None:
        self._cancel.set()

    def _stop(self) -> None:
        self._process.terminate()
        self._process.join(_KILL_GRACE_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def wait(self) -> ChildResult:
        deadline = time.monotonic() + self._time_limit_s
        try:
            while True:
                if self._cancel.is_set():
                    self._stop()
                    return ChildResult("cancelled", None, "cancelled by request")
                if time.monotonic() > deadline:
                    self._stop()
                    return ChildResult("timeout", None,
                                       f"killed at the time limit of {self._time_limit_s:g} s")
                try:
                    ready = self._recv.poll(_POLL_S)
                except (EOFError, OSError):
                    ready = True
                if ready:
                    try:
                        status, result_json, error = self._recv.recv()
                    except (EOFError, OSError):
                        self._process.join(_KILL_GRACE_S)
                        return ChildResult("failed", None, f"probe process exited with code "
                                           f"{self._process.exitcode} without a result")
                    self._process.join(_KILL_GRACE_S)
                    if self._process.is_alive():
                        self._stop()
                    return ChildResult(status, result_json, error)
        finally:
            self._recv.close()
