"""The inventory behind ``GET /v1/device``: every GPU with its memory, MIG mode and instances,
processes and optional queries; never raises (a failure is part of the answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .binding import _describe, _error_types, _init, _resolve, binding_errors
from .readings import memory_info, processes
from .records import GPUInfo, MIGInstance, MIGMode, NVMLInventory, ProcessType

__all__ = ["inventory"]

_T = TypeVar("_T")


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
        available=True,
        error="; ".join(problems) or None,
        driver_version=_maybe(b, b.nvmlSystemGetDriverVersion),
        cuda_driver_version=_cuda_driver_version(b),
        nvml_version=_maybe(b, b.nvmlSystemGetNVMLVersion),
        gpus=tuple(gpus),
    )


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
    mig = (
        None
        if modes is None
        else MIGMode(
            current=int(modes[0]) == b.NVML_DEVICE_MIG_ENABLE,
            pending=int(modes[1]) == b.NVML_DEVICE_MIG_ENABLE,
        )
    )
    instances = (
        optional("mig_instances", lambda: _mig_instances(b, handle))
        if (mig is not None and mig.current)
        else ()
    )
    persistence = optional("persistence_mode", lambda: b.nvmlDeviceGetPersistenceMode(handle))
    accounting = optional("accounting_mode", lambda: b.nvmlDeviceGetAccountingMode(handle))
    refused: dict[ProcessType, BaseException] = {}
    procs = processes(handle, b, errors=refused)
    errors.update({f"processes.{kind}": _describe(exc) for kind, exc in refused.items()})
    return GPUInfo(
        index=index,
        uuid=str(b.nvmlDeviceGetUUID(handle)),
        name=str(b.nvmlDeviceGetName(handle)),
        memory_total_bytes=mem.total_bytes,
        memory_reserved_bytes=mem.reserved_bytes,
        memory_used_bytes=mem.used_bytes,
        memory_free_bytes=mem.free_bytes,
        memory_api=mem.api,
        compute_capability=None if cc is None else f"{int(cc[0])}.{int(cc[1])}",
        mig_mode=mig,
        mig_instances=instances or (),
        persistence_mode=_enabled(b, persistence),
        accounting_mode=_enabled(b, accounting),
        processes=procs,
        query_errors=errors,
    )


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
        out.append(
            MIGInstance(
                index=slot,
                gpu_instance_id=int(b.nvmlDeviceGetGpuInstanceId(mh)),
                compute_instance_id=int(b.nvmlDeviceGetComputeInstanceId(mh)),
                uuid=str(b.nvmlDeviceGetUUID(mh)),
                memory_total_bytes=mem.total_bytes,
                memory_used_bytes=mem.used_bytes,
            )
        )
    return tuple(out)
