"""The host beside the GPUs: CPU model and count, RAM total and available (``/proc``)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from .records import HostInfo

__all__ = ["host_info"]


def host_info(
    *, meminfo: Path = Path("/proc/meminfo"), cpuinfo: Path = Path("/proc/cpuinfo")
) -> HostInfo:
    """CPU and RAM from ``/proc`` (Linux), else ``os.sysconf``: no psutil needed for four
    numbers. The paths are parameters so tests can hand in a fixture."""
    total, available = _meminfo(meminfo)
    if total is None:
        total = _sysconf_bytes("SC_PHYS_PAGES")
    if available is None:
        available = _sysconf_bytes("SC_AVPHYS_PAGES")
    try:
        usable: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return HostInfo(
        cpu_model=_cpu_model(cpuinfo) or platform.processor() or None,
        num_cpus=os.cpu_count(),
        num_cpus_usable=usable,
        ram_total_bytes=total,
        ram_available_bytes=available,
    )


def _meminfo(path: Path) -> tuple[int | None, int | None]:
    fields: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():  # "MemTotal:  131072000 kB"
                scale = 1024 if parts[1:] == ["kB"] else 1
                fields[key.strip()] = int(parts[0]) * scale
    except OSError:
        pass
    return fields.get("MemTotal"), fields.get("MemAvailable")


def _sysconf_bytes(name: str) -> int | None:
    try:
        pages = os.sysconf(name)
        size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _cpu_model(path: Path) -> str | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return None
