"""The recorded event stream (pure data; the recorder fills it, the replay reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ALLOC", "EMPTY_CACHE", "FREE", "Trace"]

ALLOC, FREE, EMPTY_CACHE = 0, 1, 2


@dataclass
class Trace:
    """The event stream and what is known about each storage."""

    events: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(kind, handle, nbytes, phase index) in program order."""
    tags: dict[int, str] = field(default_factory=dict)
    """Component of each storage (``host``: not on the device)."""
    parts: dict[int, str] = field(default_factory=dict)
    modules: dict[int, str] = field(default_factory=dict)
    phases: list[tuple[int, str]] = field(default_factory=list)
    """(iteration, phase name) per phase index."""
    sources: dict[int, str] = field(default_factory=dict)
    """Where each storage was allocated (``package/file.py:line function``), when the recorder
    was asked to keep sources (``Recorder(sources=True)``: the allocation attribution)."""
