"""A fake NVML binding, built from the real binding's structures.

Why not a MagicMock: the point of testing ``vrambudget.agent.nvml`` without a GPU is that it must
meet the
binding's real shapes. So every value this fake returns is what ``pynvml`` itself would build,
taken from NVIDIA's official binding as installed here (``nvidia-ml-py`` 13.615.71,
``site-packages/pynvml.py``):

- memory: real ``pynvml.c_nvmlMemory_t`` (total/free/used) and ``pynvml.c_nvmlMemory_v2_t``
  (version/total/reserved/free/used) ctypes structs; v2 is asked for with
  ``nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)`` exactly as the binding's
  signature has it, and a wrong version answers ArgumentVersionMismatch;
- processes: real ``c_nvmlProcessInfo_v3_t`` (pid/usedGpuMemory/gpuInstanceId/
  computeInstanceId) passed through the binding's own ``nvmlStructToFriendlyObject``, with
  ``usedGpuMemory`` None when NVML says "not available", as the binding does; instance ids are
  0xFFFFFFFF without MIG (NVML's documented value);
- accounting: a real ``c_nvmlAccountingStats_t``, including the binding's quirk that a
  "not available" ``maxMemoryUsage`` raises TypeError (it assigns None to a ctypes field);
- MIG mode as the binding returns it, a list ``[current, pending]``; compute capability a
  tuple; strings already decoded (``convertStrBytes``); CUDA driver version an int (12040);
- errors: the real ``pynvml.NVMLError`` hierarchy (``pynvml.NVMLError(code)`` gives the
  ``NVMLError_*`` subclass), so ``except pynvml.NVMLError`` works on the fake's errors, and
  calls before ``nvmlInit`` raise ``NVMLError_Uninitialized`` as the real ones do.

Memory relations follow the NVML reference (docs.nvidia.com/deploy/nvml-api, nvmlMemory_t and
nvmlMemory_v2_t): v1 ``total = free + used`` with used the "sum of reserved and allocated";
v2 reports ``reserved`` on its own, modelled here as ``total = reserved + used + free``.

The H100 total, 85,520,809,984 bytes, is 81,559 MiB: what NVML (nvidia-smi) reports for an
"80 GB" H100, per Modal's table in https://thundergolfer.com/blog/nvidia-gpu-memory-capacity.

Scripting: each device memory read advances that GPU one step along ``timeline`` (used bytes,
and optionally the process list from that step on), so a sampler polled by hand sees a
scripted world step by step; past the end the last step stays.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml

__all__ = [
    "H100_TOTAL_BYTES",
    "FakeClock",
    "FakeGPU",
    "FakeHandle",
    "FakeMIG",
    "FakeNVML",
    "FakeProcess",
    "Step",
]

H100_TOTAL_BYTES = 81_559 * 2**20  # 85_520_809_984
_NA_UINT = 0xFFFFFFFF
_NA_ULL = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


@dataclass(frozen=True)
class FakeHandle:
    """Opaque like the binding's ``c_nvmlDevice_t``."""

    gpu: int
    mig: int | None = None


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None
    """None: NVML's "not available" (the binding turns it into None)."""
    kind: str = "compute"
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass
class Step:
    used_bytes: int
    processes: list[FakeProcess] | None = None
    """Replaces the GPU's process list from this step on; None keeps it."""


@dataclass
class FakeMIG:
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    total_bytes: int
    used_bytes: int = 0


@dataclass
class FakeGPU:
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "NVIDIA H100 80GB HBM3"
    total_bytes: int = H100_TOTAL_BYTES
    reserved_bytes: int = 512 * 2**20
    used_bytes: int = 0
    """Allocated, v2 terms (reserved not included)."""
    compute_capability: tuple[int, int] = (9, 0)
    mig_mode: list[int] | None = None
    """``[current, pending]``; None: MIG not supported (NotSupported)."""
    mig_slots: int = 7
    mig_devices: dict[int, FakeMIG] = field(default_factory=dict)
    persistence_mode: int | None = pynvml.NVML_FEATURE_ENABLED
    accounting_mode: int | None = pynvml.NVML_FEATURE_DISABLED
    accounting_max_memory: dict[int, int | None] = field(default_factory=dict)
    """pid -> maxMemoryUsage (None: "not available"); used only with accounting enabled."""
    processes: list[FakeProcess] = field(default_factory=list)
    graphics_supported: bool = True
    processes_error: int | None = None
    """An NVML error code the process-list calls answer with (e.g. NO_PERMISSION)."""
    memory_v2_error: int | None = None
    """FUNCTION_NOT_FOUND (old library) or NOT_SUPPORTED: the v2 memory call fails so."""
    memory_error: int | None = None
    """Every memory call fails with this code (a lost GPU)."""
    timeline: list[Step] = field(default_factory=list)


class FakeClock:
    """``time.perf_counter`` stand-in: every call returns ``step_s`` later than the last."""

    def __init__(self, step_s: float, start: float = 100.0) -> None:
        self.step_s = step_s
        self.now = start - step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # the real class maps the code to its NVMLError_* subclass


class FakeNVML:
    """Module-like: the ``pynvml`` names ``vrambudget.agent.nvml`` calls, with the real constants
    and error classes copied onto the instance."""

    def __init__(
        self,
        gpus: list[FakeGPU] | None = None,
        *,
        init_error: int | None = None,
        driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040,
        nvml_version: str = "12.550.54.15",
    ) -> None:
        for name in dir(pynvml):  # NVMLError*, NVML_* constants, nvmlMemory_v2, ...
            if name.startswith(("NVMLError", "NVML_", "NVMLLibraryMismatchError")) or (
                name == "nvmlMemory_v2"
            ):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.nvml_version = nvml_version
        self.initialized = 0
        self.calls: Counter[str] = Counter()

    # ----------------------------------------------------------------- helpers --

    def _enter(self, name: str) -> None:
        self.calls[name] += 1
        if not self.initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: FakeHandle) -> FakeGPU:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.gpu < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[handle.gpu]

    def _mig(self, handle: FakeHandle) -> FakeMIG:
        gpu = self._gpu(handle)
        if handle.mig is None or handle.mig not in gpu.mig_devices:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.mig_devices[handle.mig]

    # ------------------------------------------------------------------ system --

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise _error(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    # ----------------------------------------------------------------- devices --

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByUUID")
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return FakeHandle(i)
            for slot, mig in gpu.mig_devices.items():
                if mig.uuid == uuid:
                    return FakeHandle(i, slot)
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetIndex")
        self._gpu(handle)
        if handle.mig is not None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.gpu

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: FakeHandle) -> FakeHandle:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        self._mig(handle)
        return FakeHandle(handle.gpu)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        self._enter("nvmlDeviceGetName")
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        self._enter("nvmlDeviceGetUUID")
        if handle.mig is not None:
            return self._mig(handle).uuid
        return self._gpu(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        """Same signature as the binding: no version -> v1 struct, a version -> v2 struct."""
        self._enter("nvmlDeviceGetMemoryInfo" + ("_v2" if version else ""))
        gpu = self._gpu(handle)
        if gpu.memory_error is not None:
            raise _error(gpu.memory_error)
        if version and gpu.memory_v2_error is not None:
            raise _error(gpu.memory_v2_error)
        if version and version != pynvml.nvmlMemory_v2:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if handle.mig is not None:
            mig = self._mig(handle)
            total, reserved, used = mig.total_bytes, 0, mig.used_bytes
        else:
            if gpu.timeline:
                step = gpu.timeline.pop(0)
                gpu.used_bytes = step.used_bytes
                if step.processes is not None:
                    gpu.processes = list(step.processes)
            total, reserved, used = gpu.total_bytes, gpu.reserved_bytes, gpu.used_bytes
        free = total - reserved - used
        if version:
            return pynvml.c_nvmlMemory_v2_t(
                version=version, total=total, reserved=reserved, free=free, used=used
            )
        return pynvml.c_nvmlMemory_t(total=total, free=free, used=total - free)

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeHandle) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability")
        return self._gpu(handle).compute_capability

    def nvmlDeviceGetPersistenceMode(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPersistenceMode")
        mode = self._gpu(handle).persistence_mode
        if mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return mode

    def nvmlDeviceGetAccountingMode(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetAccountingMode")
        mode = self._gpu(handle).accounting_mode
        if mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return mode

    def nvmlDeviceGetAccountingStats(self, handle: FakeHandle, pid: int) -> Any:
        """NVML: NOT_SUPPORTED when accounting is unsupported or disabled, NOT_FOUND for a pid
        it has no record of. Then the binding's own post-processing, quirk included."""
        self._enter("nvmlDeviceGetAccountingStats")
        gpu = self._gpu(handle)
        if gpu.accounting_mode != pynvml.NVML_FEATURE_ENABLED:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if pid not in gpu.accounting_max_memory:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        value = gpu.accounting_max_memory[pid]
        stats = pynvml.c_nvmlAccountingStats_t(
            gpuUtilization=50,
            memoryUtilization=20,
            maxMemoryUsage=_NA_ULL if value is None else value,
            time=1000,
            startTime=1_700_000_000_000_000,
            isRunning=1,
        )
        if stats.maxMemoryUsage == _NA_ULL:
            stats.maxMemoryUsage = None  # what the binding does; ctypes raises TypeError
        return stats

    # --------------------------------------------------------------------- MIG --

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        mode = self._gpu(handle).mig_mode
        if mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        return self._gpu(handle).mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        gpu = self._gpu(handle)
        if not 0 <= index < gpu.mig_slots:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index not in gpu.mig_devices:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeHandle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId")
        return self._mig(handle).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeHandle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId")
        return self._mig(handle).compute_instance_id

    # --------------------------------------------------------------- processes --

    def _processes(self, handle: FakeHandle, kind: str) -> list[Any]:
        gpu = self._gpu(handle)
        if gpu.processes_error is not None:
            raise _error(gpu.processes_error)
        if kind == "graphics" and not gpu.graphics_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = []
        for p in gpu.processes:
            if p.kind != kind:
                continue
            struct = pynvml.c_nvmlProcessInfo_v3_t(
                pid=p.pid,
                usedGpuMemory=_NA_ULL if p.used_bytes is None else p.used_bytes,
                gpuInstanceId=_NA_UINT if p.gpu_instance_id is None else p.gpu_instance_id,
                computeInstanceId=(
                    _NA_UINT if p.compute_instance_id is None else p.compute_instance_id
                ),
            )
            obj = pynvml.nvmlStructToFriendlyObject(struct)
            if obj.usedGpuMemory == _NA_ULL:
                obj.usedGpuMemory = None  # as the binding does (WDDM, see its comment)
            out.append(obj)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        return self._processes(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses")
        return self._processes(handle, "graphics")
