"""The agent's startup line: where it listens, the GPUs NVML sees, where it stores probes, and
the versions that decide what a probe measures (logged once when the app starts, so a log
says which agent on which host answered)."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from .nvml.records import NVMLInventory
from .settings import AgentSettings

__all__ = ["startup_line"]

GiB = 1 << 30


def _version(package: str) -> str | None:
    """An installed distribution's version, without importing it (the agent process never
    imports torch)."""
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _devices(inv: NVMLInventory) -> str:
    if not inv.available:
        return f"no GPU ({inv.error or 'NVML is not available'}): CPU probes only"
    if not inv.gpus:
        return "no GPU: NVML sees none (CPU probes only)"
    gpus = ", ".join(
        f"cuda:{g.index} {g.name} ({g.memory_total_bytes / GiB:.2f} GiB"
        + (", MIG" if g.mig_mode is not None and g.mig_mode.current else "")
        + ")"
        for g in inv.gpus
    )
    driver = f"driver {inv.driver_version}" if inv.driver_version else "driver unknown"
    cuda = f", CUDA {inv.cuda_driver_version}" if inv.cuda_driver_version else ""
    return f"{len(inv.gpus)} GPU(s): {gpus}; {driver}{cuda}"


def startup_line(settings: AgentSettings, inv: NVMLInventory) -> str:
    """``vrambudget agent 0.1.0 on http://127.0.0.1:8100; 1 GPU(s): cuda:0 ...; store ...;
    python 3.12.3, torch ...; engines vllm; auth: on``."""
    store = (settings.data_dir / "agent.sqlite3").resolve()
    versions = [f"python {platform.python_version()}"]
    for package in ("torch", "transformers", "nvidia-ml-py"):
        v = _version(package)
        versions.append(f"{package} {v}" if v else f"{package} not installed")
    engines = ", ".join(sorted(settings.engines)) or "none"
    auth = (
        "on"
        if settings.tokens
        else "no tokens (VRAMBUDGET_AGENT_TOKENS): every authenticated endpoint answers 401"
    )
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return (
        f"vrambudget agent {_version('vrambudget') or '(not installed)'} on "
        f"http://{host}:{settings.port}; {_devices(inv)}; store {store}; "
        f"{', '.join(versions)}; engines {engines}; auth: {auth}"
    )
