"""What NVML says about this host's GPUs: the inventory behind ``GET /v1/device`` and the few
readings a probe takes (device used, one process's used, accounting peak).

Why a seam: every NVML call goes through a ``binding`` argument -- by default NVIDIA's official
binding (``nvidia-ml-py``, module ``pynvml``), imported only when first needed -- so the agent
imports on hosts without it, and tests pass a fake built from the binding's real structures
(``tests/fake_nvml.py``). The agent process never creates a CUDA context; NVML is all it uses.

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
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar

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

MemoryAPI = Literal["v1", "v2"]
ProcessType = Literal["compute", "graphics"]

_T = TypeVar("_T")

# NVML's "no value" for unsigned ints: instance ids of a process on a GPU without MIG.
_UINT_NOT_AVAILABLE = 0xFFFFFFFF

# The v2 memory call is missing (library older than the binding), refuses the struct version,
# or is unsupported on the device: fall back to v1. Anything else is a real failure.
_V2_FALLBACK_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound",
                       "NVMLError_ArgumentVersionMismatch", "NVMLLibraryMismatchError")

_PROCESS_CALLS: tuple[tuple[ProcessType, str], ...] = (
    ("compute", "nvmlDeviceGetComputeRunningProcesses"),
    ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
)


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


# ------------------------------------------------------------------------------ binding --

_init_lock = threading.Lock()
_initialized: dict[int, Any] = {}  # id -> binding; the value keeps the id from being reused


def load_binding() -> Any:
    """The official binding, imported on first use (raises ImportError without it)."""
    import pynvml

    return pynvml


def binding_errors(binding: Any) -> tuple[type[BaseException], ...]:
    """What a binding call can raise for an NVML failure. ``NVMLLibraryMismatchError`` is not
    an ``NVMLError``: the unversioned process-list wrappers turn FunctionNotFound into it."""
    errors: list[type[BaseException]] = [binding.NVMLError]
    mismatch = getattr(binding, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type):
        errors.append(mismatch)
    return tuple(errors)


def _error_types(binding: Any, names: Iterable[str]) -> tuple[type[BaseException], ...]:
    return tuple(t for n in names if isinstance(t := getattr(binding, n, None), type))


def _resolve(binding: Any | None) -> Any:
    return load_binding() if binding is None else binding


def _init(binding: Any) -> None:
    with _init_lock:
        if id(binding) in _initialized:
            return
        binding.nvmlInit()
        _initialized[id(binding)] = binding


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------ readings --

def memory_info(handle: Any, binding: Any | None = None, *,
                api: MemoryAPI | None = None) -> MemoryReading:
    """The device's memory, from the v2 API where the driver has it, else v1.

    ``api`` pins the version (a sampler does, so that all its readings are comparable); a
    pinned ``"v2"`` that fails raises instead of falling back.
    """
    b = _resolve(binding)
    if api != "v1" and hasattr(b, "nvmlMemory_v2"):
        try:
            m = b.nvmlDeviceGetMemoryInfo(handle, version=b.nvmlMemory_v2)
        except _error_types(b, _V2_FALLBACK_ERRORS):
            if api == "v2":
                raise
        else:
            return MemoryReading(total_bytes=int(m.total), reserved_bytes=int(m.reserved),
                                 used_bytes=int(m.used), free_bytes=int(m.free), api="v2")
    m = b.nvmlDeviceGetMemoryInfo(handle)
    return MemoryReading(total_bytes=int(m.total), reserved_bytes=None, used_bytes=int(m.used),
                         free_bytes=int(m.free), api="v1")


def device_used_bytes(handle: Any, binding: Any | None = None, *,
                      api: MemoryAPI | None = None) -> int:
    """Device memory in use, all processes together (see :func:`memory_info` for ``api``)."""
    return memory_info(handle, binding, api=api).used_bytes


def processes(handle: Any, binding: Any | None = None, *,
              kinds: Iterable[ProcessType] = ("compute", "graphics"),
              errors: dict[ProcessType, BaseException] | None = None,
              ) -> tuple[GPUProcess, ...]:
    """Processes with a context on the device. A list the driver refuses is left out, and the
    exception goes to ``errors[kind]`` when a dict is given."""
    b = _resolve(binding)
    out: list[GPUProcess] = []
    wanted = set(kinds)
    for kind, name in _PROCESS_CALLS:
        if kind not in wanted:
            continue
        try:
            entries = getattr(b, name)(handle)
        except binding_errors(b) as exc:
            if errors is not None:
                errors[kind] = exc
            continue
        for e in entries:
            used = e.usedGpuMemory
            gi = getattr(e, "gpuInstanceId", _UINT_NOT_AVAILABLE)
            ci = getattr(e, "computeInstanceId", _UINT_NOT_AVAILABLE)
            out.append(GPUProcess(
                pid=int(e.pid), used_memory_bytes=None if used is None else int(used), type=kind,
                gpu_instance_id=None if gi in (None, _UINT_NOT_AVAILABLE) else int(gi),
                compute_instance_id=None if ci in (None, _UINT_NOT_AVAILABLE) else int(ci)))
    return tuple(out)


def process_used_bytes(handle: Any, pid: int, binding: Any | None = None) -> int | None:
    """Memory NVML attributes to ``pid`` on the device; None when the pid is not listed (not
    running there, or in another PID namespace) or its memory is not reported. A process in
    both the compute and the graphics list is one context: the larger number, not the sum."""
    used = [p.used_memory_bytes for p in processes(handle, binding)
            if p.pid == pid and p.used_memory_bytes is not None]
    return max(used) if used else None


def accounting_max_memory(handle: Any, pid: int, binding: Any | None = None) -> int | None:
    """The driver's own peak for ``pid`` (``nvmlDeviceGetAccountingStats().maxMemoryUsage``):
    None when accounting is off or unsupported, the pid is unknown to it, or no value exists.

    TypeError is caught on purpose: for a "not available" value the binding tries to assign
    None to the ctypes field, which ctypes refuses (checked against nvidia-ml-py 13.615.71).
    """
    b = _resolve(binding)
    errors: tuple[type[BaseException], ...] = (*binding_errors(b), TypeError)
    try:
        stats = b.nvmlDeviceGetAccountingStats(handle, pid)
    except errors:
        return None
    value = stats.maxMemoryUsage
    return None if value is None else int(value)


def resolve_device(selector: int | str, binding: Any | None = None) -> tuple[Any, int]:
    """``(handle, index)`` for a GPU index (``0``, ``"0"``) or UUID (``"GPU-..."``; a MIG
    device's ``"MIG-..."`` gives its handle and the parent's index). Raises
    :class:`DeviceNotFoundError` with what the host does have."""
    if isinstance(selector, bool) or not isinstance(selector, (int, str)):
        raise DeviceNotFoundError(f"a device is an index or a UUID, not {selector!r}")
    try:
        b = _resolve(binding)
    except ImportError as exc:
        raise DeviceNotFoundError(f"cannot resolve GPU {selector!r}: nvidia-ml-py is not "
                                  f"installed ({exc})") from None
    errors = binding_errors(b)
    try:
        _init(b)
        count = int(b.nvmlDeviceGetCount())
    except errors as exc:
        raise DeviceNotFoundError(f"cannot resolve GPU {selector!r}: NVML is not available "
                                  f"({_describe(exc)})") from None
    if isinstance(selector, int) or selector.strip().isdigit():
        index = int(selector)
        if not 0 <= index < count:
            have = f"indices 0..{count - 1}" if count else "no GPUs"
            raise DeviceNotFoundError(f"no GPU with index {index}: this host has {have}")
        try:
            return b.nvmlDeviceGetHandleByIndex(index), index
        except errors as exc:
            raise DeviceNotFoundError(f"GPU {index}: {_describe(exc)}") from None
    uuid = selector.strip()
    try:
        handle = b.nvmlDeviceGetHandleByUUID(uuid)
    except errors:
        raise DeviceNotFoundError(f"no GPU with UUID {uuid!r}; this host has: "
                                  f"{_known_uuids(b, count) or 'no GPUs'}") from None
    try:
        return handle, int(b.nvmlDeviceGetIndex(handle))
    except errors:
        pass
    try:  # a MIG device handle has no index of its own
        parent = b.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        return handle, int(b.nvmlDeviceGetIndex(parent))
    except errors as exc:
        raise DeviceNotFoundError(f"GPU {uuid!r}: no index ({_describe(exc)})") from None


def _known_uuids(b: Any, count: int) -> str:
    uuids = []
    for i in range(count):
        try:
            uuids.append(f"{i}={b.nvmlDeviceGetUUID(b.nvmlDeviceGetHandleByIndex(i))}")
        except binding_errors(b):
            uuids.append(f"{i}=?")
    return ", ".join(uuids)


# ----------------------------------------------------------------------------- inventory --

def inventory(binding: Any | None = None) -> NVMLInventory:
    """Every GPU NVML sees, with what each will say. Never raises."""
    try:
        b = _resolve(binding)
    except ImportError as exc:
        return NVMLInventory(available=False, error=f"nvidia-ml-py is not installed: {exc}")
    try:
        return _inventory(b)
    except Exception as exc:  # noqa: BLE001 -- a binding bug must not take the endpoint down
        return NVMLInventory(available=False, error=f"unexpected: {_describe(exc)}")


def _inventory(b: Any) -> NVMLInventory:
    errors = binding_errors(b)
    try:
        _init(b)
        count = int(b.nvmlDeviceGetCount())
    except errors as exc:
        return NVMLInventory(available=False, error=_describe(exc))
    gpus: list[GPUInfo] = []
    problems: list[str] = []
    for index in range(count):
        try:
            gpus.append(_gpu(b, index))
        except errors as exc:
            problems.append(f"GPU {index}: {_describe(exc)}")
    return NVMLInventory(
        available=True, error="; ".join(problems) or None,
        driver_version=_maybe(b, b.nvmlSystemGetDriverVersion),
        cuda_driver_version=_cuda_driver_version(b),
        nvml_version=_maybe(b, b.nvmlSystemGetNVMLVersion),
        gpus=tuple(gpus))


def _maybe(b: Any, call: Callable[[], _T]) -> _T | None:
    try:
        return call()
    except binding_errors(b):
        return None


def _cuda_driver_version(b: Any) -> str | None:
    """NVML encodes CUDA 12.4 as 12040 (1000 * major + 10 * minor)."""
    for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
        call = getattr(b, name, None)
        if call is None:
            continue
        value = _maybe(b, call)
        if value is not None:
            return f"{int(value) // 1000}.{int(value) % 1000 // 10}"
    return None


def _gpu(b: Any, index: int) -> GPUInfo:
    """One GPU: the handle, identity and memory must answer; every other field may fail alone."""
    handle = b.nvmlDeviceGetHandleByIndex(index)
    mem = memory_info(handle, b)
    errors: dict[str, str] = {}

    def optional(field: str, call: Callable[[], _T]) -> _T | None:
        try:
            return call()
        except binding_errors(b) as exc:
            errors[field] = _describe(exc)
            return None

    cc = optional("compute_capability", lambda: b.nvmlDeviceGetCudaComputeCapability(handle))
    modes = optional("mig_mode", lambda: b.nvmlDeviceGetMigMode(handle))
    mig = None if modes is None else MIGMode(
        current=int(modes[0]) == b.NVML_DEVICE_MIG_ENABLE,
        pending=int(modes[1]) == b.NVML_DEVICE_MIG_ENABLE)
    instances = optional("mig_instances", lambda: _mig_instances(b, handle)) if (
        mig is not None and mig.current) else ()
    persistence = optional("persistence_mode", lambda: b.nvmlDeviceGetPersistenceMode(handle))
    accounting = optional("accounting_mode", lambda: b.nvmlDeviceGetAccountingMode(handle))
    refused: dict[ProcessType, BaseException] = {}
    procs = processes(handle, b, errors=refused)
    errors.update({f"processes.{kind}": _describe(exc) for kind, exc in refused.items()})
    return GPUInfo(
        index=index, uuid=str(b.nvmlDeviceGetUUID(handle)), name=str(b.nvmlDeviceGetName(handle)),
        memory_total_bytes=mem.total_bytes, memory_reserved_bytes=mem.reserved_bytes,
        memory_used_bytes=mem.used_bytes, memory_free_bytes=mem.free_bytes,
        memory_api=mem.api,
        compute_capability=None if cc is None else f"{int(cc[0])}.{int(cc[1])}",
        mig_mode=mig, mig_instances=instances or (),
        persistence_mode=_enabled(b, persistence), accounting_mode=_enabled(b, accounting),
        processes=procs,
        query_errors=errors)


def _enabled(b: Any, state: Any) -> bool | None:
    return None if state is None else int(state) == b.NVML_FEATURE_ENABLED


def _mig_instances(b: Any, handle: Any) -> tuple[MIGInstance, ...]:
    """MIG devices by slot; an empty slot answers NotFound and is skipped."""
    empty = _error_types(b, ("NVMLError_NotFound", "NVMLError_InvalidArgument"))
    out: list[MIGInstance] = []
    for slot in range(int(b.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mh = b.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except empty:
            continue
        mem = memory_info(mh, b)
        out.append(MIGInstance(
            index=slot, gpu_instance_id=int(b.nvmlDeviceGetGpuInstanceId(mh)),
            compute_instance_id=int(b.nvmlDeviceGetComputeInstanceId(mh)),
            uuid=str(b.nvmlDeviceGetUUID(mh)), memory_total_bytes=mem.total_bytes,
            memory_used_bytes=mem.used_bytes))
    return tuple(out)


# ---------------------------------------------------------------------------------- host --

def host_info(*, meminfo: Path = Path("/proc/meminfo"),
              cpuinfo: Path = Path("/proc/cpuinfo")) -> HostInfo:
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
    return HostInfo(cpu_model=_cpu_model(cpuinfo) or platform.processor() or None,
                    num_cpus=os.cpu_count(), num_cpus_usable=usable,
                    ram_total_bytes=total, ram_available_bytes=available)


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
