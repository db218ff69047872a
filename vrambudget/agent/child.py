"""What a probe's child process is told besides the request: the host owner's settings it needs
(entry points, where checkpoints live, engine launchers, the evaluation directory, where to
write a memory snapshot). The child's environment carries none of the agent's
``VRAMBUDGET_AGENT_*`` settings, so everything it needs is passed here, explicitly (it is
pickled to the spawned child)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .settings import AgentSettings

__all__ = ["ChildSettings"]


@dataclass(frozen=True, slots=True)
class ChildSettings:
    entry_points: dict[str, str] = field(default_factory=dict)
    """name -> ``module:function`` a custom workload may name."""
    model_dirs: tuple[str, ...] = ()
    """Directories holding checkpoints as ``<dir>/<owner>/<name>`` (or ``<dir>/<name>``)."""
    engines: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """engine -> argv prefix that starts it (llm_serving probes)."""
    gguf_dir: str | None = None
    """Where llama.cpp's GGUF model files live."""
    eval_dir: str | None = None
    """The host's evaluation files for quality checks."""
    snapshot_path: str | None = None
    """Where this probe's memory snapshot goes (only when the request asked for one)."""
    start_gate: Any = None
    """A ``multiprocessing.Barrier`` the overlapping jobs of one probe pass together before
    their load phases (``overlap``)."""
    snapshot_max_entries: int = 100_000
    """Allocation events the snapshot keeps (the newest)."""
    snapshot_max_bytes: int = 256 << 20
    """A snapshot larger than this is not written (the result says why)."""
    snapshot_retention_s: float = 7 * 86_400.0
    """How long the agent keeps it (the result states its expiry)."""

    @classmethod
    def of(cls, settings: AgentSettings, **probe: object) -> ChildSettings:
        """The host-wide part from the agent's settings; ``probe``: this probe's own fields
        (``snapshot_path``)."""
        return cls(
            entry_points=dict(settings.entry_points),
            model_dirs=tuple(str(d) for d in settings.model_dirs),
            engines=dict(settings.engines),
            gguf_dir=str(settings.gguf_dir) if settings.gguf_dir is not None else None,
            eval_dir=str(settings.eval_dir) if settings.eval_dir is not None else None,
            snapshot_max_entries=settings.snapshot_max_entries,
            snapshot_max_bytes=settings.snapshot_max_bytes,
            snapshot_retention_s=settings.snapshot_retention_s,
            **probe,  # type: ignore[arg-type]
        )
