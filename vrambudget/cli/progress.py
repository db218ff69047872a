"""A progress line on stderr for the slow steps (resolving a model through the framework or
the Hub, a trace, a fit over the catalog): the phase and the seconds elapsed, redrawn in place
while the step runs, and only when stderr is a terminal (a pipe, a file or a CI log stays
quiet: the output a script reads is unchanged)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["progress"]

INTERVAL_S = 0.5
"""How often the line is redrawn, and how long a step runs before it is first drawn (a step
quicker than that leaves no trace)."""


def _tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


@contextmanager
def progress(phase: str, stream: TextIO | None = None) -> Iterator[None]:
    """While the block runs, ``vrambudget: <phase> ... 3.5 s`` on a terminal's stderr (from
    :data:`INTERVAL_S` on); the line is cleared when the block ends (however it ends)."""
    out = stream if stream is not None else sys.stderr
    if not _tty(out):
        yield
        return
    start = time.monotonic()
    done = threading.Event()

    drawn = False

    def draw() -> None:
        nonlocal drawn
        while not done.wait(INTERVAL_S):
            out.write(f"\r\x1b[2Kvrambudget: {phase} ... {time.monotonic() - start:.1f} s")
            out.flush()
            drawn = True

    thread = threading.Thread(target=draw, name="vrambudget-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if drawn:
            out.write("\r\x1b[2K")
            out.flush()
