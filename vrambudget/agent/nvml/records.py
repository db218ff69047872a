"""What NVML's answers are turned into: msgspec records (the agent's JSON) and the error for a
device selector that names no GPU."""

from __future__ import annotations

from typing import Literal

import msgspec

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
]

MemoryAPI = Literal["v1", "v2"]
ProcessType = Literal["compute", "graphics"]


class DeviceNotFoundError(LookupError):
    """A device selector (index or UUID) names no GPU on this host, or NVML cannot be asked."""


# msgspec passes frozen=True on to subclasses, type checkers do not: each subclass repeats it.
class _Wire(msgspec.Struct, frozen=True, kw_only=True):
    pass


class MemoryReading(_Wire, frozen=True):
    """One memory query's answer, in the terms of the API that gave it."""

    total_bytes: int
    reserved_bytes: int | None
    """Driver/firmware reservation; only the v2 API reports it (None with v1)."""
    used_bytes: int
    free_bytes: int
    api: MemoryAPI


class MIGMode(_Wire, frozen=True):
    current: bool
    pending: bool
    """The mode after the next GPU reset (a change is pending when it differs from current)."""


class MIGInstance(_Wire, frozen=True):
    """One MIG device (a compute instance inside a GPU instance)."""

    index: int
    """Position among the parent's MIG devices (``nvmlDeviceGetMigDeviceHandleByIndex``)."""
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int


class GPUProcess(_Wire, frozen=True):
    pid: int
    """As NVML reports it: the host's PID namespace, which a container may not share."""
    used_memory_bytes: int | None
    """None where the driver does not report per-process memory (e.g. Windows WDDM)."""
    type: ProcessType
    gpu_instance_id: int | None = None
    """Set only when MIG is on."""
    compute_instance_id: int | None = None


class GPUInfo(_Wire, frozen=True):
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_reserved_bytes: int | None
    """None when only the v1 memory API answered."""
    memory_used_bytes: int
    memory_free_bytes: int
    memory_api: MemoryAPI
    compute_capability: str | None
    """``"major.minor"``, e.g. ``"9.0"`` for Hopper."""
    mig_mode: MIGMode | None
    """None where the GPU has no MIG support."""
    mig_instances: tuple[MIGInstance, ...]
    """Filled only when MIG is currently on."""
    persistence_mode: bool | None
    accounting_mode: bool | None
    processes: tuple[GPUProcess, ...]
    query_errors: dict[str, str] = {}
    """Why an optional field is None or empty: field name -> NVML's error text."""


class NVMLInventory(_Wire, frozen=True):
    available: bool
    """False when NVML cannot be initialised (no driver, no library): then ``error`` says why."""
    error: str | None
    """With ``available``: GPUs that could not be read at all, and why."""
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    """The newest CUDA version the driver supports, ``"12.4"``."""
    nvml_version: str | None = None
    gpus: tuple[GPUInfo, ...] = ()


class HostInfo(_Wire, frozen=True):
    cpu_model: str | None
    num_cpus: int | None
    """Logical CPUs on the host (``os.cpu_count``)."""
    num_cpus_usable: int | None
    """Logical CPUs this process may run on (affinity, cgroup cpusets)."""
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    """``MemAvailable``: what can be allocated without swapping, not merely ``MemFree``."""
