"""How a workload tells its observer what is happening: phases, iterations, and which memory
component the tensors it creates belong to.

The trace tier's recorder implements these to attribute every allocation; the probe agent
implements ``phase`` to take per-phase peaks; ``Marks()`` itself does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the trace replay imports HOST without torch
    import torch

__all__ = ["HOST", "Marks"]

HOST = "host"
"""Tag of a tensor that a CUDA run keeps in host memory (e.g. the CPU ``step`` counters of
non-fused torch optimizers); fake tensors all live on ``cpu``, so the recorder must be told."""


class Marks:
    """No-op observer; subclasses override what they need."""

    def iteration(self, index: int) -> None:
        """Iteration ``index`` (0-based) of the workload starts."""

    def phase(self, name: str) -> None:
        """A phase (load, prefill, decode, forward, backward, optimizer_step) starts."""

    def push_scope(self, tag: str) -> None:
        """Tensors created from now on belong to component ``tag`` (until ``pop_scope``) unless
        tagged otherwise later."""

    def pop_scope(self) -> None:
        """End the innermost ``push_scope``."""

    @contextmanager
    def scope(self, tag: str) -> Iterator[None]:
        self.push_scope(tag)
        try:
            yield
        finally:
            self.pop_scope()

    @contextmanager
    def module(self, name: str) -> Iterator[None]:
        """Tensors created inside were made by module ``name`` (e.g. ``layers.3``)."""
        yield

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` runs (the cached free segments are released)."""

    def tag(self, tensor: torch.Tensor, tag: str, part: str | None = None) -> None:
        """``tensor``'s storage belongs to component ``tag`` (retroactively), optionally under a
        named part (e.g. a parameter's name)."""
