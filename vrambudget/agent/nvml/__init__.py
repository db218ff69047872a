"""What NVML says about this host's GPUs: the inventory behind ``GET /v1/device`` and the few
readings a probe takes (device used, one process's used, accounting peak).

Why a seam: every NVML call goes through a ``binding`` argument -- by default NVIDIA's official
binding (``nvidia-ml-py``, module ``pynvml``), imported only when first needed -- so the agent
imports on hosts without it, and tests pass a fake built from the binding's real structures
(``tests/support/fake_nvml.py``). The agent process never creates a CUDA context; NVML is all it
uses.

Why it never raises from :func:`inventory`: a host without a driver, or a GPU that refuses one
query, is an answer ("NVML is not available: ...", "persistence mode: Not Supported"), not a
500. Optional per-GPU queries fail one at a time; the reason lands in ``query_errors``.

Memory, two APIs: ``nvmlDeviceGetMemoryInfo_v2`` (drivers from R510 on) reports ``reserved``
(driver/firmware) separately; the v1 call does not, and its ``used`` is ``total - free``, so it
counts the reserved memory as used. Which one answered is recorded (``memory_api``). Peaks and
baselines of one measurement must come from the same API -- the sampler picks one at its start.

Init: ``nvmlInit`` is reference counted by the library; calling it per request would grow the
count without bound, so a binding is initialised once per process and left initialised (NVML
holds no GPU memory). A failed init is retried on the next call: a driver may appear later.

Modules: ``records`` (what the answers hold), ``binding`` (loading and initialising the
binding), ``readings`` (memory, processes, device selectors), ``inventory`` (``GET /v1/device``)
and ``host`` (CPU and RAM, from ``/proc``).
"""

from __future__ import annotations

from .binding import binding_errors, load_binding
from .host import host_info
from .inventory import inventory
from .readings import (
    accounting_max_memory,
    device_used_bytes,
    memory_info,
    process_used_bytes,
    processes,
    resolve_device,
)
from .records import (
    DeviceNotFoundError,
    GPUInfo,
    GPUProcess,
    HostInfo,
    MemoryAPI,
    MemoryReading,
    MIGInstance,
    MIGMode,
    NVMLInventory,
    ProcessType,
)

__all__ = [
    "DeviceNotFoundError",
    "GPUInfo",
    "GPUProcess",
    "HostInfo",
    "MIGInstance",
    "MIGMode",
    "MemoryAPI",
    "MemoryReading",
    "NVMLInventory",
    "ProcessType",
    "accounting_max_memory",
    "binding_errors",
    "device_used_bytes",
    "host_info",
    "inventory",
    "load_binding",
    "memory_info",
    "process_used_bytes",
    "processes",
    "resolve_device",
]
