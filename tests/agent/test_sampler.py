"""The peak sampler (vrambudget/agent/sampler.py) against a fake NVML binding built from the real
binding's structures (tests/support/fake_nvml.py): scripted readings, other processes, the
thread's interval."""

from __future__ import annotations

import sys
import time

import pynvml
import pytest

from tests.support.fake_nvml import (
    FakeClock,
    FakeGPU,
    FakeHandle,
    FakeNVML,
    FakeProcess,
    Step,
)
from vrambudget.agent import nvml
from vrambudget.agent.sampler import DevicesSampler, NVMLSampler, SamplerResult

MiB = 2**20

GiB = 2**30

OWN_PID = 4242


# ------------------------------------------------------------------------------- sampler --


def _scripted(
    timeline: list[Step], *, processes: list[FakeProcess] | None = None, **kw: object
) -> tuple[FakeNVML, FakeHandle]:
    fake = FakeNVML(
        [
            FakeGPU(
                used_bytes=timeline[0].used_bytes,
                timeline=timeline,
                processes=processes or [],
                **kw,
            )
        ]
    )
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
        10 * GiB,
        17 * GiB,
        10 * GiB,
        10 * GiB,
    )
    assert r.samples == 6 and r.failed_samples == 0 and r.memory_api == "v2"
    assert r.mean_interval_s == pytest.approx(0.005) and r.max_interval_s == pytest.approx(0.005)
    assert r.process_peak_bytes is None
    assert (r.others_changed_bytes, r.others_changed, r.others_visible) == (0, False, True)
    assert s.stop() is r  # stop is idempotent


def test_sampler_tracks_its_own_process_peak() -> None:
    def own(b: int) -> list[FakeProcess]:
        return [FakeProcess(pid=OWN_PID, used_bytes=b), FakeProcess(pid=9, used_bytes=GiB)]

    fake, h = _scripted(
        [Step(2 * GiB, own(GiB)), Step(6 * GiB, own(5 * GiB)), Step(3 * GiB, own(2 * GiB))]
    )
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.004)), 1)
    assert r.peak_used_bytes == 6 * GiB and r.process_peak_bytes == 5 * GiB
    assert (r.others_changed_bytes, r.others_visible) == (0, True)


def test_sampler_flags_others_that_came_and_went() -> None:
    mine = FakeProcess(pid=OWN_PID, used_bytes=GiB)
    intruder = FakeProcess(pid=555, used_bytes=500 * MiB)
    fake, h = _scripted(
        [
            Step(GiB, [mine]),
            Step(GiB + 500 * MiB, [mine, intruder]),
            Step(GiB, [mine]),
            Step(GiB, [mine]),
        ]
    )
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.005)), 2)
    assert r.others_changed_bytes == 500 * MiB and r.others_changed  # gone by the end
    assert r.final_used_bytes == GiB


def test_sampler_others_leaving_is_a_negative_change_and_small_ones_pass() -> None:
    mine = FakeProcess(pid=OWN_PID, used_bytes=GiB)
    fake, h = _scripted(
        [Step(3 * GiB, [mine, FakeProcess(pid=8, used_bytes=2 * GiB)]), Step(GiB, [mine])]
    )
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.005)), 0)
    assert r.others_changed_bytes == -2 * GiB and r.others_changed

    fake, h = _scripted(
        [
            Step(GiB, [mine, FakeProcess(pid=8, used_bytes=10 * MiB)]),
            Step(GiB, [mine, FakeProcess(pid=8, used_bytes=20 * MiB)]),
        ]
    )
    r = _run_manually(NVMLSampler(h, pid=OWN_PID, binding=fake, clock=FakeClock(0.005)), 0)
    assert r.others_changed_bytes == 10 * MiB and not r.others_changed


def test_sampler_cannot_see_others_when_its_pid_is_never_listed() -> None:
    """A container's PID namespace: NVML lists host PIDs, so our own growth would look like a
    neighbour's. The sampler says it cannot tell instead of failing every probe."""
    fake, h = _scripted(
        [
            Step(GiB, [FakeProcess(pid=31337, used_bytes=GiB)]),
            Step(9 * GiB, [FakeProcess(pid=31337, used_bytes=9 * GiB)]),
        ]
    )
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
    fake, h = _scripted(
        [Step(GiB), Step(2 * GiB)], memory_v2_error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    )
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


# ------------------------------------------------------- an engine's group, several GPUs --


def test_sampler_counts_every_process_of_an_engine_s_group() -> None:
    """vLLM V1 / SGLang: the memory belongs to the engine's workers, not its leader; every pid
    of the group is the workload's, summed per poll, and none of them counts as "others"."""
    leader, core, worker = 100, 101, 102

    def group(core_b: int, worker_b: int) -> list[FakeProcess]:
        return [
            FakeProcess(pid=core, used_bytes=core_b),
            FakeProcess(pid=worker, used_bytes=worker_b),
            FakeProcess(pid=9, used_bytes=GiB),
        ]

    fake, h = _scripted(
        [
            Step(5 * GiB, group(2 * GiB, 2 * GiB)),
            Step(9 * GiB, group(3 * GiB, 5 * GiB)),
            Step(5 * GiB, group(2 * GiB, 2 * GiB)),
        ]
    )
    s = NVMLSampler(h, pids={leader, core, worker}, binding=fake, clock=FakeClock(0.005))
    r = _run_manually(s, 1)
    assert r.process_peak_bytes == 3 * GiB + 5 * GiB  # both workers, at the same poll
    assert (r.others_changed_bytes, r.others_visible) == (0, True)
    # the leader alone (what the agent passed before) sees none of it
    fake, h = _scripted([Step(5 * GiB, group(2 * GiB, 2 * GiB)), Step(9 * GiB, group(3, 5))])
    r = _run_manually(NVMLSampler(h, pid=leader, binding=fake, clock=FakeClock(0.005)), 1)
    assert r.process_peak_bytes is None and r.others_visible is False


def test_devices_sampler_reads_the_most_loaded_gpu() -> None:
    a = FakeGPU(uuid="GPU-a", used_bytes=GiB, timeline=[Step(GiB), Step(7 * GiB), Step(6 * GiB)])
    b = FakeGPU(
        uuid="GPU-b",
        used_bytes=2 * GiB,
        timeline=[
            Step(2 * GiB, [FakeProcess(pid=OWN_PID, used_bytes=GiB)]),
            Step(8 * GiB, [FakeProcess(pid=OWN_PID, used_bytes=GiB), FakeProcess(9, 80 * MiB)]),
            Step(3 * GiB),
        ],
    )
    fake = FakeNVML([a, b])
    samplers = [
        NVMLSampler(
            nvml.resolve_device(i, fake)[0], pid=OWN_PID, binding=fake, clock=FakeClock(0.005)
        )
        for i in (0, 1)
    ]
    multi = DevicesSampler(samplers)
    for s in samplers:
        s.start(background=False)
        s.sample()
    r = multi.stop()
    # GPU b peaked highest (8 GiB): its baseline and peak; the worst of the others' changes
    assert (r.baseline_used_bytes, r.peak_used_bytes) == (2 * GiB, 8 * GiB)
    assert r.others_changed_bytes == 80 * MiB and r.others_changed
    assert r.others_visible is False  # GPU a never listed the workload's pid
    assert r.samples == 3
    with pytest.raises(ValueError, match="no devices"):
        DevicesSampler([])
