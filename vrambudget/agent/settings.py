"""The agent's configuration, from ``VRAMBUDGET_AGENT_*`` environment variables.

Nothing here is taken from a request: tokens, the callback allow-list, the webhook secret and
the entry points a custom workload may name are the host owner's decisions.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from vrambudget.http.origins import parse_origins

__all__ = ["AgentSettings", "AgentSettingsError"]

_ENTRY = re.compile(r"^[A-Za-z0-9_.-]+=[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class AgentSettingsError(ValueError):
    """A setting the agent cannot run with (the message names the variable and what it
    allows)."""


_NUMBERS: tuple[tuple[str, str, type, float, float], ...] = (
    ("PORT", "port", int, 0, 65535),
    ("MAX_QUEUE", "max_queue", int, 1, 10_000),
    ("RETRY_AFTER_S", "retry_after_s", int, 1, 86_400),
    ("MAX_TIME_LIMIT_S", "max_time_limit_s", float, 1, 86_400),
    ("MAX_BODY_BYTES", "max_body_bytes", int, 1024, 1 << 30),
    ("BODY_TIMEOUT_S", "body_timeout_s", float, 0.1, 600),
    ("CPU_MEMORY_LIMIT_BYTES", "cpu_memory_limit_bytes", int, 0, 1 << 50),
    ("MIN_FREE_BYTES", "min_free_bytes", int, 0, 1 << 50),
    ("DELIVERY_CONCURRENCY", "delivery_concurrency", int, 1, 256),
    ("SNAPSHOT_MAX_BYTES", "snapshot_max_bytes", int, 1, 1 << 40),
    ("SNAPSHOT_MAX_ENTRIES", "snapshot_max_entries", int, 1, 100_000_000),
    ("SNAPSHOT_RETENTION_S", "snapshot_retention_s", float, 1, 3650 * 86_400),
)
"""Every numeric setting: its variable (after ``VRAMBUDGET_AGENT_``), field, type and the
range it allows (a day for a probe's time limit and Retry-After; ten years of snapshot
retention; a request body of 1 KiB .. 1 GiB)."""


def _range(kind: type, lo: float, hi: float) -> str:
    """``1 .. 10000``; powers of two written as such (``1 .. 2**40``)."""

    def word(x: float) -> str:
        n = int(x)
        if kind is int and n >= 1 << 20 and n & (n - 1) == 0:
            return f"2**{n.bit_length() - 1}"
        return f"{x:g}" if kind is float else str(n)

    return f"{word(lo)} .. {word(hi)}"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    host: str = "127.0.0.1"
    port: int = 8100
    data_dir: Path = Path("./agent-data")
    """SQLite database of probes, results and the callback outbox."""
    tokens: tuple[bytes, ...] = ()
    """Accepted bearer tokens; none configured means every authenticated endpoint answers 401."""
    callback_allow_list: tuple[str, ...] = ()
    """Origins or host patterns callbacks may go to; empty: callbacks off."""
    service_allow_list: tuple[str, ...] = ()
    """Calculation services a probe's ``service_url`` may name (same syntax); empty: off."""
    webhook_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    """HMAC key of the Standard Webhooks signatures (``whsec_...`` or raw)."""
    entry_points: dict[str, str] = field(default_factory=dict)
    """name -> ``module:function`` that a custom workload may name."""
    max_queue: int = 8
    """Probes waiting per device; beyond, 429 + Retry-After."""
    retry_after_s: int = 30
    max_time_limit_s: float = 3600.0
    max_body_bytes: int = 1 << 20
    body_timeout_s: float = 10.0
    """A request body must arrive within this long (else 408): no held-open submissions."""
    cpu_memory_limit_bytes: int | None = None
    """Host-memory cap of a CPU probe (0: none); unset: half the host's RAM (``limits``)."""
    min_free_bytes: int = 64 << 20
    """Below this much free space under ``data_dir``, /readyz fails and submissions get 503."""
    delivery_concurrency: int = 8
    """Callbacks (and comparison requests) in flight at once."""
    snapshot_max_bytes: int = 256 << 20
    """A memory snapshot larger than this is not kept (the result says why)."""
    snapshot_max_entries: int = 100_000
    """Allocation events a memory snapshot keeps (the newest)."""
    snapshot_retention_s: float = 7 * 86_400.0
    """Memory snapshots are deleted this long after they were written."""
    model_dirs: tuple[Path, ...] = ()
    """Directories of checkpoints (``<dir>/<owner>/<name>``) a probe loads real weights from
    (besides the host's Hugging Face cache)."""
    engines: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """engine -> argv prefix that starts it (``VRAMBUDGET_AGENT_ENGINES``, llm_serving probes)."""
    gguf_dir: Path | None = None
    """Where llama.cpp's GGUF files live (a recipe's ``-m`` file is looked up here)."""
    eval_dir: Path | None = None
    """The host's evaluation files a quality check's ``eval_set`` may name (by file name)."""
    cors_origins: tuple[str, ...] = ()
    """Origins whose pages may call the agent (``VRAMBUDGET_AGENT_CORS_ORIGINS``, the same form
    as the service's ``VRAMBUDGET_CORS_ORIGINS``); empty, the default: none."""

    def __post_init__(self) -> None:
        for name, key, kind, lo, hi in _NUMBERS:
            value = getattr(self, key)
            if value is None:
                continue
            if not lo <= value <= hi:
                raise AgentSettingsError(
                    f"VRAMBUDGET_AGENT_{name} must be in {_range(kind, lo, hi)}, got {value}"
                )
        from .webhooks.signing import decode_secret

        try:
            decode_secret(self.webhook_secret)
        except ValueError as exc:
            raise AgentSettingsError(
                f"VRAMBUDGET_AGENT_WEBHOOK_SECRET: {exc} (allowed: whsec_<base64>, as the "
                "Standard Webhooks libraries write it, or base64 text)"
            ) from None
        from .webhooks.allow_list import validate_allow_list

        for name, entries in (
            ("CALLBACK_ALLOW", self.callback_allow_list),
            ("SERVICE_ALLOW", self.service_allow_list),
        ):
            try:
                validate_allow_list(entries)
            except ValueError as exc:
                raise AgentSettingsError(f"VRAMBUDGET_AGENT_{name}: {exc}") from None
        try:
            origins = parse_origins(",".join(self.cors_origins), "VRAMBUDGET_AGENT_CORS_ORIGINS")
        except ValueError as exc:
            raise AgentSettingsError(str(exc)) from None
        object.__setattr__(self, "cors_origins", origins)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AgentSettings:
        e = dict(os.environ) if env is None else env

        def get(name: str) -> str | None:
            value = e.get(f"VRAMBUDGET_AGENT_{name}")
            return value.strip() if value is not None else None

        tokens: list[bytes] = [
            t.strip().encode() for t in (get("TOKENS") or "").split(",") if t.strip()
        ]
        token_file = get("TOKEN_FILE")
        if token_file:
            try:
                lines = Path(token_file).read_text().splitlines()
            except OSError as exc:
                raise AgentSettingsError(f"VRAMBUDGET_AGENT_TOKEN_FILE: {exc}") from None
            tokens += [
                line.strip().encode() for line in lines if line.strip() and not line.startswith("#")
            ]
        entries: dict[str, str] = {}
        for item in (get("ENTRY_POINTS") or "").split(","):
            item = item.strip()
            if not item:
                continue
            if not _ENTRY.match(item):
                raise AgentSettingsError(
                    f"VRAMBUDGET_AGENT_ENTRY_POINTS: {item!r} is not name=module:function"
                )
            name, target = item.split("=", 1)
            entries[name] = target
        kwargs: dict[str, object] = {
            "tokens": tuple(tokens),
            "entry_points": entries,
            "callback_allow_list": tuple(
                x.strip() for x in (get("CALLBACK_ALLOW") or "").split(",") if x.strip()
            ),
            "service_allow_list": tuple(
                x.strip() for x in (get("SERVICE_ALLOW") or "").split(",") if x.strip()
            ),
            "cors_origins": tuple(
                x.strip() for x in (get("CORS_ORIGINS") or "").split(",") if x.strip()
            ),
        }
        model_dirs = [Path(x) for x in (get("MODEL_DIRS") or "").split(os.pathsep) if x.strip()]
        for d in model_dirs:
            if not d.is_dir():
                raise AgentSettingsError(f"VRAMBUDGET_AGENT_MODEL_DIRS: {d} is not a directory")
        kwargs["model_dirs"] = tuple(model_dirs)
        eval_dir = get("EVAL_DIR")
        if eval_dir:
            if not Path(eval_dir).is_dir():
                raise AgentSettingsError(
                    f"VRAMBUDGET_AGENT_EVAL_DIR: {eval_dir} is not a directory"
                )
            kwargs["eval_dir"] = Path(eval_dir)
        from .engine.launchers import parse_engines

        try:
            kwargs["engines"] = parse_engines(get("ENGINES"))
        except ValueError as exc:
            raise AgentSettingsError(f"VRAMBUDGET_AGENT_ENGINES: {exc}") from None
        gguf_dir = get("GGUF_DIR")
        if gguf_dir:
            if not Path(gguf_dir).is_dir():
                raise AgentSettingsError(
                    f"VRAMBUDGET_AGENT_GGUF_DIR: {gguf_dir} is not a directory"
                )
            kwargs["gguf_dir"] = Path(gguf_dir)
        if get("HOST"):
            kwargs["host"] = get("HOST")
        if get("DATA_DIR"):
            kwargs["data_dir"] = Path(get("DATA_DIR") or ".")
        secret = get("WEBHOOK_SECRET")
        if secret:
            kwargs["webhook_secret"] = secret.encode()
        for name, key, kind, lo, hi in _NUMBERS:
            raw = get(name)
            if raw is None:
                continue
            try:
                kwargs[key] = kind(raw)
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise AgentSettingsError(
                    f"VRAMBUDGET_AGENT_{name} must be a number ({what} in "
                    f"{_range(kind, lo, hi)}), got {raw!r}"
                ) from None
        return cls(**kwargs)  # type: ignore[arg-type]
