"""The service's settings: defaults, ``VRAMBUDGET_*`` environment variables and their ranges."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from vrambudget.core.calibration import profiles_from
from vrambudget.http.origins import parse_origins
from vrambudget.hub import HubSettings

from .tracing import DEFAULT_ENTRY, ENTRY_PATTERN

__all__ = ["CORS_ORIGINS_ENV", "Settings", "SettingsError"]


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
    "answer_cache_entries": ("VRAMBUDGET_ANSWER_CACHE_ENTRIES", 0, 1 << 24),
    "answer_cache_bytes": ("VRAMBUDGET_ANSWER_CACHE_BYTES", 0, 1 << 40),
    "compute_workers": ("VRAMBUDGET_COMPUTE_WORKERS", 1, 256),
    "compute_time_limit_s": ("VRAMBUDGET_COMPUTE_TIME_LIMIT_S", 0.1, 3600),
    "compute_max_pending": ("VRAMBUDGET_COMPUTE_MAX_PENDING", 1, 1 << 16),
    "max_answer_bytes": ("VRAMBUDGET_MAX_ANSWER_BYTES", 1 << 16, 1 << 32),
    "cache_max_age_s": ("VRAMBUDGET_CACHE_MAX_AGE_S", 0, 31_536_000),
}
CORS_ORIGINS_ENV = "VRAMBUDGET_CORS_ORIGINS"


def _default_compute_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


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
    answer_cache_entries: int = 4096
    """Analytic answers kept (LRU by the sha256 of the canonical request); 0 disables the cache."""
    answer_cache_bytes: int = 64 << 20
    """Bytes of analytic answers kept (keys are 32-byte hashes); the LRU evicts to stay under."""
    compute_workers: int = field(default_factory=_default_compute_workers)
    """Worker processes computing analytic budgets, fits and comparisons (default: the CPU
    cores, at most 4), so that no request holds the event loop."""
    compute_time_limit_s: float = 10.0
    """A budget, fit or comparison computing longer is stopped (its worker killed): 422."""
    compute_max_pending: int = 64
    """Computations running or waiting for a worker; beyond, 503 + Retry-After."""
    max_answer_bytes: int = 16 << 20
    """An encoded answer larger than this is refused (422) instead of sent."""
    profiles_dir: str | None = None
    """Directory of calibration profiles (``vrambudget calibrate``); none: built-in defaults."""
    cors_origins: tuple[str, ...] = ("*",)
    """Origins whose pages may call the service (``VRAMBUDGET_CORS_ORIGINS``, comma-separated:
    ``https://catalog.example.com``, ``https://*.example.com``; empty: CORS off). Default
    ``*``: the service is a public calculator with no cookies, sessions or credentials, so an
    answer read by any page tells that page nothing it could not ask for itself, and a
    catalog's widget on any domain can call it. Browsers never send credentials to ``*``. A
    service inside a private network or with a token for private Hub repositories should list its
    own pages instead (docs/HTTP.md)."""
    cache_max_age_s: int = 3600
    """``max-age`` of the answers that are fixed for a deployment (catalogs) or pure functions
    of the request (docs/HTTP.md); 0: ``no-cache`` (revalidate with the ``ETag`` each time).
    An hour: a catalog corrected by a deployment reaches every page within the hour."""
    hub: HubSettings = field(default_factory=HubSettings)
    """Where `hub` models are fetched from (``VRAMBUDGET_HUB_ENDPOINT``, ``_TOKEN`` (else
    ``HF_TOKEN``), ``_TIMEOUT_S``, ``_CACHE_DIR``); the token is never echoed."""

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
        try:
            origins = parse_origins(",".join(self.cors_origins), CORS_ORIGINS_ENV)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        object.__setattr__(self, "cors_origins", origins)
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
            "answer_cache_entries",
            "answer_cache_bytes",
            "compute_workers",
            "compute_time_limit_s",
            "compute_max_pending",
            "max_answer_bytes",
            "cache_max_age_s",
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
        cors = os.environ.get(CORS_ORIGINS_ENV)
        if cors is not None:
            try:
                values["cors_origins"] = parse_origins(cors, CORS_ORIGINS_ENV)
            except ValueError as exc:
                raise SettingsError(str(exc)) from None
        try:
            values["hub"] = HubSettings.from_env(os.environ)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        return cls(**values)
