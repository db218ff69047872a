"""The readings a probe takes: memory (v2, else v1), the processes on a device, one process's
used bytes, the accounting peak, and device selectors (index or UUID) resolved to handles."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .binding import _describe, _error_types, _init, _resolve, binding_errors
from .records import DeviceNotFoundError, GPUProcess, MemoryAPI, MemoryReading, ProcessType

__all__ = [
    "accounting_max_memory",
    "device_used_bytes",
    "memory_info",
    "process_used_bytes",
    "processes",
    "resolve_device",
]

# NVML's "no value" for unsigned ints: instance ids of a process on a GPU without MIG.
_UINT_NOT_AVAILABLE = 0xFFFFFFFF

# The v2 memory call is missing (library older than the binding), refuses the struct version,
# or is unsupported on the device: fall back to v1. Anything else is a real failure.
_V2_FALLBACK_ERRORS = (
    "NVMLError_NotSupported",
    "NVMLError_FunctionNotFound",
    "NVMLError_ArgumentVersionMismatch",
    "NVMLLibraryMismatchError",
)

_PROCESS_CALLS: tuple[tuple[ProcessType, str], ...] = (
    ("compute", "nvmlDeviceGetComputeRunningProcesses"),
    ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
)


def memory_info(
    handle: Any, binding: Any | None = None, *, api: MemoryAPI | None = None
) -> MemoryReading:
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
            return MemoryReading(
                total_bytes=int(m.total),
                reserved_bytes=int(m.reserved),
                used_bytes=int(m.used),
                free_bytes=int(m.free),
                api="v2",
            )
    m = b.nvmlDeviceGetMemoryInfo(handle)
    return MemoryReading(
        total_bytes=int(m.total),
        reserved_bytes=None,
        used_bytes=int(m.used),
        free_bytes=int(m.free),
        api="v1",
    )


def device_used_bytes(
    handle: Any, binding: Any | None = None, *, api: MemoryAPI | None = None
) -> int:
    """Device memory in use, all processes together (see :func:`memory_info` for ``api``)."""
    return memory_info(handle, binding, api=api).used_bytes


def processes(
    handle: Any,
    binding: Any | None = None,
    *,
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
            out.append(
                GPUProcess(
                    pid=int(e.pid),
                    used_memory_bytes=None if used is None else int(used),
                    type=kind,
                    gpu_instance_id=None if gi in (None, _UINT_NOT_AVAILABLE) else int(gi),
                    compute_instance_id=None if ci in (None, _UINT_NOT_AVAILABLE) else int(ci),
                )
            )
    return tuple(out)


def process_used_bytes(handle: Any, pid: int, binding: Any | None = None) -> int | None:
    """Memory NVML attributes to ``pid`` on the device; None when the pid is not listed (not
    running there, or in another PID namespace) or its memory is not reported. A process in
    both the compute and the graphics list is one context: the larger number, not the sum."""
    used = [
        p.used_memory_bytes
        for p in processes(handle, binding)
        if p.pid == pid and p.used_memory_bytes is not None
    ]
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
        raise DeviceNotFoundError(
            f"cannot resolve GPU {selector!r}: nvidia-ml-py is not installed ({exc})"
        ) from None
    errors = binding_errors(b)
    try:
        _init(b)
        count = int(b.nvmlDeviceGetCount())
    except errors as exc:
        raise DeviceNotFoundError(
            f"cannot resolve GPU {selector!r}: NVML is not available ({_describe(exc)})"
        ) from None
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
        raise DeviceNotFoundError(
            f"no GPU with UUID {uuid!r}; this host has: {_known_uuids(b, count) or 'no GPUs'}"
        ) from None
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
