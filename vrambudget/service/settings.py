"""The service's settings: defaults, ``VRAMBUDGET_*`` environment variables and their ranges."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from vrambudget.core.calibration import profiles_from

from .tracing import DEFAULT_ENTRY, ENTRY_PATTERN

__all__ = ["Settings", "SettingsError"]


class SettingsError(ValueError):
    """A setting (usually an environment variable) with a value the service cannot run with."""


# field -> (environment variable, smallest, largest) of the numeric settings
_LIMITS: dict[str, tuple[str, float, float]] = {
    "port": ("VRAMBUDGET_PORT", 0, 65535),
    "max_body_bytes": ("VRAMBUDGET_MAX_BODY_BYTES", 1, 1 << 40),
    "trace_workers": ("VRAMBUDGET_TRACE_WORKERS", 1, 256),
    "trace_time_limit_s": ("VRAMBUDGET_TRACE_TIME_LIMIT_S", 0.1, 86400),
    "trace_max_pending": ("VRAMBUDGET_TRACE_MAX_PENDING", 1, 1 << 16),
    "trace_cache_entries": ("VRAMBUDGET_TRACE_CACHE_ENTRIES", 0, 1 << 24),
}


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 1 << 20
    trace_workers: int = 1
    """Worker processes running traces (each imports torch: ~1 s to start, some 100s of MiB)."""
    trace_time_limit_s: float = 60.0
    """A trace running longer is stopped (its worker killed) and answered 422."""
    trace_max_pending: int = 4
    """Distinct traces running or waiting; beyond, 503 + Retry-After."""
    trace_cache_entries: int = 256
    """Trace answers kept (LRU by the canonical request hash); 0 disables the cache."""
    trace_entry: str = DEFAULT_ENTRY
    """The engine, as ``module:function`` taking a BudgetRequest and returning a Budget."""
    profiles_dir: str | None = None
    """Directory of calibration profiles (``vrambudget calibrate``); none: built-in defaults."""

    def __post_init__(self) -> None:
        for name, (env, lo, hi) in _LIMITS.items():
            value = getattr(self, name)
            if not lo <= value <= hi:  # NaN fails too
                raise SettingsError(
                    f"{env} (setting {name}) must be in {lo:g} .. {hi:g}, got {value!r}"
                )
        if self.profiles_dir is not None:
            try:
                profiles_from(self.profiles_dir)
            except ValueError as exc:
                raise SettingsError(
                    f"VRAMBUDGET_PROFILES_DIR (setting profiles_dir): {exc}"
                ) from None
        if not ENTRY_PATTERN.match(self.trace_entry):
            raise SettingsError(
                f"VRAMBUDGET_TRACE_ENTRY (setting trace_entry) must be "
                f"'module:function', e.g. {DEFAULT_ENTRY!r}; "
                f"got {self.trace_entry!r}"
            )

    @classmethod
    def from_env(cls) -> Settings:
        """Settings from ``VRAMBUDGET_*`` environment variables; a bad value raises
        :class:`SettingsError` naming the variable, so the service refuses to start."""
        default = cls()
        values: dict[str, Any] = {}
        for name in (
            "host",
            "port",
            "max_body_bytes",
            "trace_workers",
            "trace_time_limit_s",
            "trace_max_pending",
            "trace_cache_entries",
            "trace_entry",
            "profiles_dir",
        ):
            env = _LIMITS[name][0] if name in _LIMITS else f"VRAMBUDGET_{name.upper()}"
            raw = os.environ.get(env)
            if raw is None:
                continue
            kind = type(getattr(default, name)) if getattr(default, name) is not None else str
            try:
                values[name] = kind(raw.strip()) if kind is not str else raw.strip()
            except ValueError:
                article = "a number" if kind is float else "an integer"
                raise SettingsError(f"{env} must be {article}, got {raw!r}") from None
        return cls(**values)
