"""What a probe's child process is told besides the request: the host owner's settings it needs
(entry points, where checkpoints live, engine launchers, the evaluation directory, where to
write a memory snapshot). The child's environment carries none of the agent's
``VRAMBUDGET_AGENT_*`` settings, so everything it needs is passed here, explicitly (it is
pickled to the spawned child)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    snapshot_max_entries: int = 100_000

    @classmethod
    def of(cls, settings: AgentSettings, **probe: object) -> ChildSettings:
        """The host-wide part from the agent's settings; ``probe``: this probe's own fields
        (``snapshot_path``)."""
        return cls(
            entry_points=dict(settings.entry_points),
            model_dirs=tuple(str(d) for d in settings.model_dirs),
            **probe,  # type: ignore[arg-type]
        )
