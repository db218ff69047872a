"""The recorded event stream (pure data; the recorder fills it, the replay reads it). The event
kinds are the allocator replay's (:mod:`vrambudget.core.allocator.replay`), which the analytic
walk of image generation writes too."""

from __future__ import annotations

from dataclasses import dataclass, field

from vrambudget.core.allocator.replay import ALLOC, EMPTY_CACHE, FREE

__all__ = ["ALLOC", "EMPTY_CACHE", "FREE", "Trace"]


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
