"""NVML inventory, readings and the peak sampler, against a fake binding built from the real
binding's structures (``tests/fake_nvml.py``: ctypes structs, error classes and return shapes
of ``nvidia-ml-py``'s ``pynvml``), plus the real binding on this host where it finds no driver.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import sys
import time
from pathlib import Path

import msgspec
import pynvml
import pytest

from vrambudget.agent import nvml
from vrambudget.agent.sampler import NVMLSampler, SamplerResult
from tests.fake_nvml import (
    H100_TOTAL_BYTES,
    FakeClock,
    FakeGPU,
    FakeHandle,
    FakeMIG,
    FakeNVML,
    FakeProcess,
    Step,
)

MiB = 2**20
GiB = 2**30
OWN_PID = 4242


def _two_gpus(**kw: object) -> FakeNVML:
    return FakeNVML([
        FakeGPU(uuid="GPU-aaaa", used_bytes=3 * GiB,
                processes=[FakeProcess(pid=100, used_bytes=2 * GiB),
                           FakeProcess(pid=101, used_bytes=GiB, kind="graphics")], **kw),
        FakeGPU(uuid="GPU-bbbb", used_bytes=0, **kw),
    ])


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
        "550.54.15", "12.4", "12.550.54.15")
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
        nvml.GPUProcess(pid=101, used_memory_bytes=GiB, type="graphics"))
    assert g.query_errors == {"mig_mode": "NVMLError_NotSupported: Not Supported"}
    assert inv.gpus[1].index == 1 and inv.gpus[1].processes == ()
    doc = msgspec.json.decode(msgspec.json.encode(inv))  # the wire form the API serves
    assert doc["gpus"][0]["memory_total_bytes"] == 85_520_809_984
    assert isinstance(doc["gpus"][0]["memory_used_bytes"], int)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                                  pynvml.NVML_ERROR_NOT_SUPPORTED,
                                  pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH])
def test_inventory_falls_back_to_v1_memory(code: int) -> None:
    fake = _two_gpus(memory_v2_error=code)
    g = nvml.inventory(fake).gpus[0]
    assert g.memory_api == "v1" and g.memory_reserved_bytes is None
    assert g.memory_used_bytes == 3 * GiB + 512 * MiB  # v1 used counts the reservation
    assert g.memory_used_bytes + g.memory_free_bytes == g.memory_total_bytes
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] >= 1 and fake.calls["nvmlDeviceGetMemoryInfo"]


def test_v2_failure_other_than_unsupported_is_not_hidden() -> None:
    fake = FakeNVML([FakeGPU(uuid="GPU-a"), FakeGPU(uuid="GPU-lost",
                                                    memory_error=pynvml.NVML_ERROR_GPU_IS_LOST)])
    inv = nvml.inventory(fake)
    assert inv.available and [g.uuid for g in inv.gpus] == ["GPU-a"]
    assert inv.error == "GPU 1: NVMLError_GpuIsLost: GPU is lost"


def test_inventory_mig_on_lists_instances() -> None:
    gpu = FakeGPU(mig_mode=[pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE],
                  mig_devices={0: FakeMIG(1, 0, "MIG-one", 10 * GiB, GiB),
                               3: FakeMIG(2, 0, "MIG-two", 20 * GiB)},
                  processes=[FakeProcess(pid=7, used_bytes=GiB, gpu_instance_id=1,
                                         compute_instance_id=0)])
    g = nvml.inventory(FakeNVML([gpu])).gpus[0]
    assert g.mig_mode == nvml.MIGMode(current=True, pending=True)
    assert g.mig_instances == (
        nvml.MIGInstance(index=0, gpu_instance_id=1, compute_instance_id=0, uuid="MIG-one",
                         memory_total_bytes=10 * GiB, memory_used_bytes=GiB),
        nvml.MIGInstance(index=3, gpu_instance_id=2, compute_instance_id=0, uuid="MIG-two",
                         memory_total_bytes=20 * GiB, memory_used_bytes=0))
    assert g.processes[0].gpu_instance_id == 1 and g.processes[0].compute_instance_id == 0


def test_mig_pending_only_lists_no_instances() -> None:
    gpu = FakeGPU(mig_mode=[pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE],
                  mig_devices={0: FakeMIG(1, 0, "MIG-one", GiB)})
    g = nvml.inventory(FakeNVML([gpu])).gpus[0]
    assert g.mig_mode == nvml.MIGMode(current=False, pending=True) and g.mig_instances == ()


def test_not_supported_fields_fail_alone() -> None:
    gpu = FakeGPU(persistence_mode=None, accounting_mode=None, graphics_supported=False,
                  processes=[FakeProcess(pid=5, used_bytes=None)])  # WDDM-style: no per-pid
    inv = nvml.inventory(FakeNVML([gpu]))
    g = inv.gpus[0]
    assert inv.available and inv.error is None
    assert g.persistence_mode is None and g.accounting_mode is None and g.mig_mode is None
    assert g.processes == (nvml.GPUProcess(pid=5, used_memory_bytes=None, type="compute"),)
    assert set(g.query_errors) == {"persistence_mode", "accounting_mode", "mig_mode",
                                   "processes.graphics"}
    assert all("Not Supported" in v for v in g.query_errors.values())


def test_refused_process_list_is_reported_not_fatal() -> None:
    gpu = FakeGPU(processes_error=pynvml.NVML_ERROR_NO_PERMISSION)
    g = nvml.inventory(FakeNVML([gpu])).gpus[0]
    assert g.processes == ()
    assert g.query_errors["processes.compute"] == (
        "NVMLError_NoPermission: Insufficient Permissions")


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


@pytest.mark.parametrize(("raw", "text"), [(12040, "12.4"), (12090, "12.9"), (13000, "13.0"),
                                           (11080, "11.8")])
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
    with pytest.raises(LookupError, match="no GPU with UUID 'GPU-zzzz'.*0=GPU-aaaa, 1=GPU-bbbb"):
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
    gpu = FakeGPU(accounting_mode=pynvml.NVML_FEATURE_ENABLED,
                  accounting_max_memory={OWN_PID: 5 * GiB, 77: None})
    fake = FakeNVML([gpu])
    h, _ = nvml.resolve_device(0, fake)
    assert nvml.accounting_max_memory(h, OWN_PID, fake) == 5 * GiB
    assert nvml.accounting_max_memory(h, 1, fake) is None  # pid unknown: NotFound
    assert nvml.accounting_max_memory(h, 77, fake) is None  # binding's TypeError quirk
    gpu.accounting_mode = pynvml.NVML_FEATURE_DISABLED
    assert nvml.accounting_max_memory(h, OWN_PID, fake) is None


def test_host_info_from_proc_files(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:       131072000 kB\nMemFree:  1000 kB\n"
                                      "MemAvailable:   65536000 kB\n")
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core "
                                      "Processor\n")
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


# ------------------------------------------------------------------------------- sampler --

def _scripted(timeline: list[Step], *, processes: list[FakeProcess] | None = None,
              **kw: object) -> tuple[FakeNVML, FakeHandle]:
    fake = FakeNVML([FakeGPU(used_bytes=timeline[0].used_bytes, timeline=timeline,
                             processes=processes or [], **kw)])
    handle, _ = nvml.resolve_device(0, fake)
    return fake, handle


def _run_manually(sampler: NVMLSampler, readings: int) -> SamplerResult:
    sampler.start(background=False)
    for _ in range(readings):
        sampler.sample()
    return sampler.stop()


def test_sampler_peak_over_a_scripted_sequence() -> None:
    used = [10 * GiB, 12 * GiB, 17 * GiB, 15 * GiB, 11 * GiB, 10 * GiB]
    fake, h = _scripted([Step(u) for u in used])
    s = NVMLSampler(h, binding=fake, clock=FakeClock(0.005))
    r = _run_manually(s, len(used) - 2)  # start + 4 + the final reading in stop()
    assert (r.baseline_used_bytes, r.peak_used_bytes, r.min_used_bytes, r.final_used_bytes) == (
        10 * GiB, 17 * GiB, 10 * GiB, 10 * GiB)
    assert r.samples == 6 and r.failed_samples == 0 and r.memory_api == "v2"
    assert r.mean_interval_s == pytest.approx(0.005) and r.max_interval_s == pytest.approx(0.005)
    assert r.process_peak_bytes is None
    assert (r.others_changed_bytes, r.others_changed, r.others_visible) == (0, False, True)
    assert s.stop() is r  # stop is idempotent


def test_sampler_tracks_its_own_process_peak() -> None:
    def own(b: int) -> list[FakeProcess]:
        return [FakeProcess(pid=OWN_PID, used_bytes=b), FakeProcess(pid=9, used_bytes=GiB)]

    fake, h = _scripted([Step(2 * GiB, own(GiB)), Step(6 * GiB, own(5 * GiB)),
                         Step(3 * GiB, own(2 * GiB))])
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.004)), 1)
    assert r.peak_used_bytes == 6 * GiB and r.process_peak_bytes == 5 * GiB
    assert (r.others_changed_bytes, r.others_visible) == (0, True)


def test_sampler_flags_others_that_came_and_went() -> None:
    mine = FakeProcess(pid=OWN_PID, used_bytes=GiB)
    intruder = FakeProcess(pid=555, used_bytes=500 * MiB)
    fake, h = _scripted([Step(GiB, [mine]), Step(GiB + 500 * MiB, [mine, intruder]),
                         Step(GiB, [mine]), Step(GiB, [mine])])
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.005)), 2)
    assert r.others_changed_bytes == 500 * MiB and r.others_changed  # gone by the end
    assert r.final_used_bytes == GiB


def test_sampler_others_leaving_is_a_negative_change_and_small_ones_pass() -> None:
    mine = FakeProcess(pid=OWN_PID, used_bytes=GiB)
    fake, h = _scripted([Step(3 * GiB, [mine, FakeProcess(pid=8, used_bytes=2 * GiB)]),
                         Step(GiB, [mine])])
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.005)), 0)
    assert r.others_changed_bytes == -2 * GiB and r.others_changed

    fake, h = _scripted([Step(GiB, [mine, FakeProcess(pid=8, used_bytes=10 * MiB)]),
                         Step(GiB, [mine, FakeProcess(pid=8, used_bytes=20 * MiB)])])
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.005)), 0)
    assert r.others_changed_bytes == 10 * MiB and not r.others_changed


def test_sampler_cannot_see_others_when_its_pid_is_never_listed() -> None:
    """A container's PID namespace: NVML lists host PIDs, so our own growth would look like a
    neighbour's. The sampler says it cannot tell instead of failing every probe."""
    fake, h = _scripted([Step(GiB, [FakeProcess(pid=31337, used_bytes=GiB)]),
                         Step(9 * GiB, [FakeProcess(pid=31337, used_bytes=9 * GiB)])])
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.005)), 0)
    assert r.peak_used_bytes == 9 * GiB and r.process_peak_bytes is None
    assert (r.others_changed_bytes, r.others_changed, r.others_visible) == (0, False, False)


def test_sampler_refused_process_list_means_others_unknown() -> None:
    fake, h = _scripted([Step(GiB)], processes_error=pynvml.NVML_ERROR_NO_PERMISSION)
    r = _run_manually(NVMLSampler(h, binding=fake, clock=FakeClock(0.005)), 2)
    assert r.others_visible is False and r.others_changed_bytes == 0


def test_sampler_without_graphics_list_stops_asking_for_it() -> None:
    fake, h = _scripted([Step(GiB)], graphics_supported=False)
    r = _run_manually(NVMLSampler(h, binding=fake, clock=FakeClock(0.005)), 5)
    assert r.others_visible is True
    assert fake.calls["nvmlDeviceGetGraphicsRunningProcesses"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == r.samples


def test_sampler_uses_v1_throughout_when_v2_is_missing() -> None:
    fake, h = _scripted([Step(GiB), Step(2 * GiB)],
                        memory_v2_error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    r = _run_manually(NVMLSampler(h, binding=fake, clock=FakeClock(0.005)), 1)
    assert r.memory_api == "v1"
    assert r.peak_used_bytes == 2 * GiB + 512 * MiB  # v1 terms: reservation included
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1  # tried once, at start


def test_sampler_counts_failed_readings_and_keeps_the_peak() -> None:
    fake, h = _scripted([Step(GiB), Step(4 * GiB)])
    s = NVMLSampler(h, binding=fake, clock=FakeClock(0.005))
    s.start(background=False)
    s.sample()
    fake.gpus[0].memory_error = pynvml.NVML_ERROR_TIMEOUT
    s.sample()
    r = s.stop()
    assert r.peak_used_bytes == 4 * GiB and r.samples == 2 and r.failed_samples == 2
    assert r.error == "NVMLError_Timeout: Timeout"


def test_sampler_misuse() -> None:
    fake, h = _scripted([Step(GiB)])
    s = NVMLSampler(h, binding=fake)
    with pytest.raises(RuntimeError, match="not started"):
        s.stop()
    s.start(background=False)
    with pytest.raises(RuntimeError, match="already started"):
        s.start()
    with pytest.raises(ValueError):
        NVMLSampler(h, binding=fake, interval_s=0)


def test_sampler_thread_keeps_a_10ms_interval() -> None:
    """For real: the background thread with the real clock, 0.2 s."""
    fake, h = _scripted([Step(GiB)], processes=[FakeProcess(pid=OWN_PID, used_bytes=GiB)])
    s = NVMLSampler(h, pid=OWN_PID, binding=fake).start()
    time.sleep(0.2)
    r = s.stop()
    assert r.samples >= 20, r
    assert r.mean_interval_s <= 0.010, r
    assert r.max_interval_s < 0.050, r  # one scheduler hiccup at most, never a stall
    assert r.failed_samples == 0 and r.process_peak_bytes == GiB


def test_sampler_lowers_the_switch_interval_only_while_it_runs() -> None:
    fake, h = _scripted([Step(GiB)])
    before = sys.getswitchinterval()
    s = NVMLSampler(h, binding=fake, switch_interval_s=0.0005).start()
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    s.stop()
    assert sys.getswitchinterval() == before


def test_sampler_as_context_manager_sees_a_spike() -> None:
    fake, h = _scripted([Step(GiB)])
    with NVMLSampler(h, binding=fake) as s:
        time.sleep(0.02)
        fake.gpus[0].used_bytes = 7 * GiB
        time.sleep(0.02)
        fake.gpus[0].used_bytes = GiB
        time.sleep(0.02)
    assert s.result is not None
    assert s.result.peak_used_bytes == 7 * GiB and s.result.final_used_bytes == GiB
    assert s.result.baseline_used_bytes == GiB
