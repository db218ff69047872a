"""NVML inventory, readings and the peak sampler, against a fake binding built from the real
binding's structures (``tests/support/fake_nvml.py``: ctypes structs, error classes and return
shapes
of ``nvidia-ml-py``'s ``pynvml``), plus the real binding on this host where it finds no driver.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
from pathlib import Path

import msgspec
import pynvml
import pytest

from tests.support.fake_nvml import (
    H100_TOTAL_BYTES,
    FakeGPU,
    FakeHandle,
    FakeMIG,
    FakeNVML,
    FakeProcess,
)
from vrambudget.agent import nvml

MiB = 2**20

GiB = 2**30

OWN_PID = 4242


def _two_gpus(**kw: object) -> FakeNVML:
    return FakeNVML(
        [
            FakeGPU(
                uuid="GPU-aaaa",
                used_bytes=3 * GiB,
                processes=[
                    FakeProcess(pid=100, used_bytes=2 * GiB),
                    FakeProcess(pid=101, used_bytes=GiB, kind="graphics"),
                ],
                **kw,
            ),
            FakeGPU(uuid="GPU-bbbb", used_bytes=0, **kw),
        ]
    )


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------- inventory --


def test_inventory_v2_memory_and_every_field() -> None:
    inv = nvml.inventory(_two_gpus())
    assert inv.available and inv.error is None
    assert (inv.driver_version, inv.cuda_driver_version, inv.nvml_version) == (
        "550.54.15",
        "12.4",
        "12.550.54.15",
    )
    g = inv.gpus[0]
    assert (g.index, g.uuid, g.name) == (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3")
    assert g.memory_api == "v2"
    assert g.memory_total_bytes == H100_TOTAL_BYTES == 85_520_809_984
    assert g.memory_reserved_bytes == 512 * MiB and g.memory_used_bytes == 3 * GiB
    assert g.memory_free_bytes == H100_TOTAL_BYTES - 512 * MiB - 3 * GiB
    assert g.compute_capability == "9.0"
    assert g.mig_mode is None and g.mig_instances == ()
    assert g.persistence_mode is True and g.accounting_mode is False
    assert g.processes == (
        nvml.GPUProcess(pid=100, used_memory_bytes=2 * GiB, type="compute"),
        nvml.GPUProcess(pid=101, used_memory_bytes=GiB, type="graphics"),
    )
    assert g.query_errors == {"mig_mode": "NVMLError_NotSupported: Not Supported"}
    assert inv.gpus[1].index == 1 and inv.gpus[1].processes == ()
    doc = msgspec.json.decode(msgspec.json.encode(inv))  # the wire form the API serves
    assert doc["gpus"][0]["memory_total_bytes"] == 85_520_809_984
    assert isinstance(doc["gpus"][0]["memory_used_bytes"], int)


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    ],
)
def test_inventory_falls_back_to_v1_memory(code: int) -> None:
    fake = _two_gpus(memory_v2_error=code)
    g = nvml.inventory(fake).gpus[0]
    assert g.memory_api == "v1" and g.memory_reserved_bytes is None
    assert g.memory_used_bytes == 3 * GiB + 512 * MiB  # v1 used counts the reservation
    assert g.memory_used_bytes + g.memory_free_bytes == g.memory_total_bytes
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] >= 1 and fake.calls["nvmlDeviceGetMemoryInfo"]


def test_v2_failure_other_than_unsupported_is_not_hidden() -> None:
    fake = FakeNVML(
        [
            FakeGPU(uuid="GPU-a"),
            FakeGPU(uuid="GPU-lost", memory_error=pynvml.NVML_ERROR_GPU_IS_LOST),
        ]
    )
    inv = nvml.inventory(fake)
    assert inv.available and [g.uuid for g in inv.gpus] == ["GPU-a"]
    assert inv.error == "GPU 1: NVMLError_GpuIsLost: GPU is lost"


def test_inventory_mig_on_lists_instances() -> None:
    gpu = FakeGPU(
        mig_mode=[pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE],
        mig_devices={
            0: FakeMIG(1, 0, "MIG-one", 10 * GiB, GiB),
            3: FakeMIG(2, 0, "MIG-two", 20 * GiB),
        },
        processes=[FakeProcess(pid=7, used_bytes=GiB, gpu_instance_id=1, compute_instance_id=0)],
    )
    g = nvml.inventory(FakeNVML([gpu])).gpus[0]
    assert g.mig_mode == nvml.MIGMode(current=True, pending=True)
    assert g.mig_instances == (
        nvml.MIGInstance(
            index=0,
            gpu_instance_id=1,
            compute_instance_id=0,
            uuid="MIG-one",
            memory_total_bytes=10 * GiB,
            memory_used_bytes=GiB,
        ),
        nvml.MIGInstance(
            index=3,
            gpu_instance_id=2,
            compute_instance_id=0,
            uuid="MIG-two",
            memory_total_bytes=20 * GiB,
            memory_used_bytes=0,
        ),
    )
    assert g.processes[0].gpu_instance_id == 1 and g.processes[0].compute_instance_id == 0


def test_mig_pending_only_lists_no_instances() -> None:
    gpu = FakeGPU(
        mig_mode=[pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE],
        mig_devices={0: FakeMIG(1, 0, "MIG-one", GiB)},
    )
    g = nvml.inventory(FakeNVML([gpu])).gpus[0]
    assert g.mig_mode == nvml.MIGMode(current=False, pending=True) and g.mig_instances == ()


def test_not_supported_fields_fail_alone() -> None:
    gpu = FakeGPU(
        persistence_mode=None,
        accounting_mode=None,
        graphics_supported=False,
        processes=[FakeProcess(pid=5, used_bytes=None)],
    )  # WDDM-style: no per-pid
    inv = nvml.inventory(FakeNVML([gpu]))
    g = inv.gpus[0]
    assert inv.available and inv.error is None
    assert g.persistence_mode is None and g.accounting_mode is None and g.mig_mode is None
    assert g.processes == (nvml.GPUProcess(pid=5, used_memory_bytes=None, type="compute"),)
    assert set(g.query_errors) == {
        "persistence_mode",
        "accounting_mode",
        "mig_mode",
        "processes.graphics",
    }
    assert all("Not Supported" in v for v in g.query_errors.values())


def test_refused_process_list_is_reported_not_fatal() -> None:
    gpu = FakeGPU(processes_error=pynvml.NVML_ERROR_NO_PERMISSION)
    g = nvml.inventory(FakeNVML([gpu])).gpus[0]
    assert g.processes == ()
    assert g.query_errors["processes.compute"] == (
        "NVMLError_NoPermission: Insufficient Permissions"
    )


def test_no_driver_with_the_fake() -> None:
    inv = nvml.inventory(FakeNVML(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert not inv.available and inv.gpus == ()
    assert inv.error == "NVMLError_DriverNotLoaded: Driver Not Loaded"


def test_no_driver_with_the_real_binding() -> None:
    if _driver_present():
        pytest.skip("libnvidia-ml.so.1 loads here: this test is for hosts without a driver")
    inv = nvml.inventory()
    assert inv.available is False and inv.gpus == ()
    assert inv.error == "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    with pytest.raises(nvml.DeviceNotFoundError, match="NVML is not available"):
        nvml.resolve_device(0)


def test_the_binding_is_nvidias_official_one() -> None:
    dist = importlib.metadata.distribution("nvidia-ml-py")
    assert Path(pynvml.__file__).resolve() == Path(dist.locate_file("pynvml.py")).resolve()
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("pynvml")  # the deprecated wrapper is not installed


def test_inventory_never_raises_on_a_broken_binding() -> None:
    class Broken(FakeNVML):
        def nvmlDeviceGetCount(self) -> int:
            raise RuntimeError("binding bug")

    inv = nvml.inventory(Broken())
    assert not inv.available and inv.error == "unexpected: RuntimeError: binding bug"


@pytest.mark.parametrize(
    ("raw", "text"), [(12040, "12.4"), (12090, "12.9"), (13000, "13.0"), (11080, "11.8")]
)
def test_cuda_driver_version_decoding(raw: int, text: str) -> None:
    assert nvml.inventory(FakeNVML(cuda_driver_version=raw)).cuda_driver_version == text


# ------------------------------------------------------------------------------ readings --


def test_resolve_device_by_index_uuid_and_mig_uuid() -> None:
    fake = _two_gpus()
    fake.gpus[1].mig_devices = {2: FakeMIG(3, 0, "MIG-x", GiB)}
    assert nvml.resolve_device(1, fake) == (FakeHandle(1), 1)
    assert nvml.resolve_device("0", fake) == (FakeHandle(0), 0)
    assert nvml.resolve_device("GPU-bbbb", fake) == (FakeHandle(1), 1)
    assert nvml.resolve_device("MIG-x", fake) == (FakeHandle(1, 2), 1)


def test_resolve_device_unknown_says_what_exists() -> None:
    fake = _two_gpus()
    with pytest.raises(nvml.DeviceNotFoundError, match=r"index 2: this host has indices 0\.\.1"):
        nvml.resolve_device(2, fake)
    with pytest.raises(LookupError, match=r"no GPU with UUID 'GPU-zzzz'.*0=GPU-aaaa, 1=GPU-bbbb"):
        nvml.resolve_device("GPU-zzzz", fake)
    with pytest.raises(nvml.DeviceNotFoundError, match="this host has no GPUs"):
        nvml.resolve_device(0, FakeNVML())
    with pytest.raises(nvml.DeviceNotFoundError, match="not True"):
        nvml.resolve_device(True, fake)  # type: ignore[arg-type]
    with pytest.raises(nvml.DeviceNotFoundError, match="Driver Not Loaded"):
        nvml.resolve_device(0, FakeNVML(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))


def test_device_and_process_used_bytes() -> None:
    fake = _two_gpus()
    fake.gpus[0].processes.append(FakeProcess(pid=100, used_bytes=2 * GiB, kind="graphics"))
    h, _ = nvml.resolve_device(0, fake)
    assert nvml.device_used_bytes(h, fake) == 3 * GiB
    assert nvml.device_used_bytes(h, fake, api="v1") == 3 * GiB + 512 * MiB
    assert nvml.process_used_bytes(h, 100, fake) == 2 * GiB  # one context, listed twice
    assert nvml.process_used_bytes(h, 999, fake) is None


def test_pinned_v2_raises_instead_of_mixing_apis() -> None:
    fake = _two_gpus(memory_v2_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    h, _ = nvml.resolve_device(0, fake)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.device_used_bytes(h, fake, api="v2")


def test_accounting_max_memory() -> None:
    gpu = FakeGPU(
        accounting_mode=pynvml.NVML_FEATURE_ENABLED,
        accounting_max_memory={OWN_PID: 5 * GiB, 77: None},
    )
    fake = FakeNVML([gpu])
    h, _ = nvml.resolve_device(0, fake)
    assert nvml.accounting_max_memory(h, OWN_PID, fake) == 5 * GiB
    assert nvml.accounting_max_memory(h, 1, fake) is None  # pid unknown: NotFound
    assert nvml.accounting_max_memory(h, 77, fake) is None  # binding's TypeError quirk
    gpu.accounting_mode = pynvml.NVML_FEATURE_DISABLED
    assert nvml.accounting_max_memory(h, OWN_PID, fake) is None


def test_host_info_from_proc_files(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal:       131072000 kB\nMemFree:  1000 kB\nMemAvailable:   65536000 kB\n"
    )
    (tmp_path / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
    )
    h = nvml.host_info(meminfo=tmp_path / "meminfo", cpuinfo=tmp_path / "cpuinfo")
    assert h.cpu_model == "AMD EPYC 9654 96-Core Processor"
    assert h.ram_total_bytes == 131072000 * 1024 and h.ram_available_bytes == 65536000 * 1024
    real = nvml.host_info()
    assert real.num_cpus and real.num_cpus >= 1
    assert real.ram_total_bytes and real.ram_available_bytes
    assert 0 < real.ram_available_bytes <= real.ram_total_bytes


def test_host_info_without_proc_falls_back_to_sysconf(tmp_path: Path) -> None:
    h = nvml.host_info(meminfo=tmp_path / "none", cpuinfo=tmp_path / "none")
    assert h.ram_total_bytes and h.ram_total_bytes > 0
