"""Device-memory peak from NVML, sampled in a background thread while the workload runs.

Why sample: NVML has no peak counter for device memory (accounting's ``maxMemoryUsage`` is per
process, and off by default), so the peak is the largest reading seen. A short-lived spike can
fall between two readings; the interval is therefore kept at 5 ms by default and the sampler
reports the interval it actually achieved (mean and worst), so a result says how fine-grained
its peak is. Readings are scheduled on a fixed grid (start + k * interval), not "sleep after
each reading", so the time a reading takes does not stretch the interval; a late reading does
not cause a burst of catch-up readings.

Why watch other processes: device "used" covers every process on the GPU. If another process
allocates or frees during the window, the peak is not the workload's, and the measurement must
be failed as unreliable. The per-process list is polled with the memory, and
``others_changed_bytes`` is the largest change (signed) of the other processes' total against
its value at start -- largest, not final, because a neighbour that allocates and frees inside the
window still spoils the peak.

PID namespaces: NVML reports PIDs as the host sees them. In a container the probe's own
``os.getpid()`` may never appear; the sampler then cannot tell its own memory from the
neighbours', says so with ``others_visible = False`` and reports no change rather than blaming
its own growth on others; the caller decides whether an unverifiable measurement is acceptable.

The GIL: the thread must win the GIL for every reading, and each NVML call (ctypes releases the
GIL) must win it back. Against busy Python threads (the load phase's request streams) a waiting
thread gets the GIL only after the interpreter's switch interval, 5 ms by default -- enough to
break a 10 ms grid. While it runs, the sampler therefore lowers the switch interval to
``switch_interval_s`` (1 ms; never raises it) and restores it at :meth:`NVMLSampler.stop`.
Even so a thread inside a Python-busy process cannot promise 10 ms; ``max_interval_s`` says
what was achieved, and a caller that needs a guarantee runs the sampler in a process with no
workload (it needs only the device, resolved there, and the pid).

The memory API (v2 or v1) is chosen once at :meth:`NVMLSampler.start`, so baseline, peak and
every reading in between are comparable.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from types import TracebackType
from typing import Any, Self

import msgspec

from . import nvml
from .probe import UNRELIABLE_OTHERS_BYTES

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_OTHERS_THRESHOLD_BYTES",
    "DevicesSampler",
    "NVMLSampler",
    "SamplerResult",
]

DEFAULT_INTERVAL_S = 0.005
DEFAULT_OTHERS_THRESHOLD_BYTES = UNRELIABLE_OTHERS_BYTES
"""Other processes changing device memory by more than this make the NVML view unreliable: a
neighbour's CUDA context alone is larger."""


class SamplerResult(msgspec.Struct, frozen=True, kw_only=True):
    baseline_used_bytes: int
    """Device used at :meth:`NVMLSampler.start`."""
    peak_used_bytes: int
    """Largest device used seen, baseline and final reading included."""
    min_used_bytes: int
    final_used_bytes: int
    samples: int
    """Successful readings, baseline and final included."""
    failed_samples: int
    mean_interval_s: float
    """Between consecutive readings: (last - first) / (samples - 1); 0.0 with one reading."""
    max_interval_s: float
    memory_api: nvml.MemoryAPI
    process_peak_bytes: int | None
    """Largest memory NVML attributed to ``pid``; None without a pid or when it never appeared."""
    others_changed_bytes: int
    """Signed largest change of the other processes' memory against the start, over the polls
    that could be read; 0 when ``pid`` never appeared (its own growth would count)."""
    others_changed: bool
    """``abs(others_changed_bytes) > others_threshold_bytes``: the peak is not the workload's."""
    others_visible: bool
    """Whether the other processes' memory could be read and told apart from ``pid``'s on every
    process poll. False: a process's memory unreported, a list refused, or ``pid`` never
    listed (PID namespace); then a small ``others_changed_bytes`` proves nothing."""
    error: str | None = None
    """The last failed reading's error, if any."""


class NVMLSampler:
    """Polls one device's used memory every ``interval_s`` (and optionally one pid's) from
    :meth:`start` to :meth:`stop`. Also a context manager; the result is then ``.result``.

    ``start(background=False)`` leaves the polling to the caller (:meth:`sample`): tests drive a
    scripted binding and clock with it, deterministically.
    """

    def __init__(
        self,
        handle: Any,
        *,
        pid: int | None = None,
        pids: Collection[int] = (),
        interval_s: float = DEFAULT_INTERVAL_S,
        others_threshold_bytes: int = DEFAULT_OTHERS_THRESHOLD_BYTES,
        processes_every: int = 1,
        switch_interval_s: float | None = 0.001,
        binding: Any | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        if processes_every < 1:
            raise ValueError("processes_every must be >= 1")
        self.handle = handle
        self.pid = pid
        self.own = frozenset(pids) | ({pid} if pid is not None else frozenset())
        """The workload's processes: ``pid`` and ``pids`` (an engine's whole group)."""
        self.interval_s = interval_s
        self.others_threshold_bytes = others_threshold_bytes
        self.processes_every = processes_every
        self.binding = nvml.load_binding() if binding is None else binding
        self.clock = clock
        self.switch_interval_s = switch_interval_s
        self._saved_switch_interval: float | None = None
        self.result: SamplerResult | None = None
        self._errors = nvml.binding_errors(self.binding)
        self._not_supported: type[BaseException] = self.binding.NVMLError_NotSupported
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._kinds: list[nvml.ProcessType] = ["compute", "graphics"]
        self._api: nvml.MemoryAPI = "v2"
        self._baseline = self._peak = self._min = self._last = 0
        self._samples = self._failed = 0
        self._first_t = self._last_t = 0.0
        self._max_interval = 0.0
        self._error: str | None = None
        self._process_peak: int | None = None
        self._others_baseline: int | None = None
        self._others_change = 0
        self._others_visible = True
        self._pid_seen = not self.own

    # -------------------------------------------------------------------------- control --

    def start(self, *, background: bool = True) -> Self:
        """Take the baseline reading now (raising if NVML cannot read the device at all),
        then poll in a daemon thread unless ``background`` is False."""
        if self._started:
            raise RuntimeError("sampler already started")
        first = nvml.memory_info(self.handle, self.binding)
        self._api = first.api
        self._started = True
        self._record(self.clock(), first.used_bytes)
        self._baseline = first.used_bytes
        self._poll_processes()
        if background:
            if self.switch_interval_s is not None and (
                sys.getswitchinterval() > self.switch_interval_s
            ):
                self._saved_switch_interval = sys.getswitchinterval()
                sys.setswitchinterval(self.switch_interval_s)
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> SamplerResult:
        """Stop polling, take a final reading, and return the result (again on later calls)."""
        if self.result is not None:
            return self.result
        if not self._started:
            raise RuntimeError("sampler not started")
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None
        self.sample()
        n = self._samples
        # a pid never listed means another PID namespace: its memory hid among "others"
        visible = self._others_visible and self._pid_seen
        change = self._others_change if self._pid_seen else 0
        self.result = SamplerResult(
            baseline_used_bytes=self._baseline,
            peak_used_bytes=self._peak,
            min_used_bytes=self._min,
            final_used_bytes=self._last,
            samples=n,
            failed_samples=self._failed,
            mean_interval_s=(self._last_t - self._first_t) / (n - 1) if n > 1 else 0.0,
            max_interval_s=self._max_interval,
            memory_api=self._api,
            process_peak_bytes=self._process_peak,
            others_changed_bytes=change,
            others_changed=abs(change) > self.others_threshold_bytes,
            others_visible=visible,
            error=self._error,
        )
        return self.result

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------------- sampling --

    def sample(self) -> None:
        """One reading: device used, and every ``processes_every`` readings the process list.
        A failed reading is counted and remembered, not raised: one NVML timeout must not lose
        the peak gathered so far."""
        if not self._started:
            raise RuntimeError("sampler not started")
        t = self.clock()
        try:
            used = nvml.device_used_bytes(self.handle, self.binding, api=self._api)
        except self._errors as exc:
            self._failed += 1
            self._error = f"{type(exc).__name__}: {exc}"
            return
        self._record(t, used)
        if self._samples % self.processes_every == 0:
            self._poll_processes()

    def _run(self) -> None:
        interval = self.interval_s
        due = time.perf_counter() + interval
        while not self._stop.is_set():
            delay = due - time.perf_counter()
            if delay > 0 and self._stop.wait(delay):
                break
            self.sample()
            due += interval
            due = max(due, time.perf_counter())  # fell behind (GIL, slow call): no burst

    def _record(self, t: float, used: int) -> None:
        if self._samples == 0:
            self._first_t = t
            self._peak = self._min = used
        else:
            self._max_interval = max(self._max_interval, t - self._last_t)
            self._peak = max(self._peak, used)
            self._min = min(self._min, used)
        self._last_t = t
        self._last = used
        self._samples += 1

    def _poll_processes(self) -> None:
        refused: dict[nvml.ProcessType, BaseException] = {}
        procs = nvml.processes(self.handle, self.binding, kinds=self._kinds, errors=refused)
        for kind, exc in refused.items():
            if isinstance(exc, self._not_supported):  # it will not change: stop asking
                self._kinds.remove(kind)
            if kind == "compute" or not isinstance(exc, self._not_supported):
                self._others_visible = False  # this poll says nothing about the others
                return
        mine: dict[int, int] = {}
        others: dict[int, int] = {}
        for p in procs:
            if p.pid in self.own:
                if p.used_memory_bytes is not None:
                    mine[p.pid] = max(mine.get(p.pid, 0), p.used_memory_bytes)
                continue
            if p.used_memory_bytes is None:
                self._others_visible = False
                continue
            # one context can be listed as compute and as graphics: count it once
            others[p.pid] = max(others.get(p.pid, 0), p.used_memory_bytes)
        if any(p.pid in self.own for p in procs):
            self._pid_seen = True
        own = sum(mine.values()) if mine else None  # the group's processes together
        if own is not None:
            self._process_peak = own if self._process_peak is None else max(self._process_peak, own)
        total = sum(others.values())
        if self._others_baseline is None:
            self._others_baseline = total
        change = total - self._others_baseline
        if abs(change) > abs(self._others_change):
            self._others_change = change


class DevicesSampler:
    """One :class:`NVMLSampler` per GPU of a multi-GPU workload (an engine given several GPUs),
    read as one result: the device whose peak was highest (the most loaded GPU, as budgets are
    per GPU) gives the baseline, the peak and the process peak; the others' changes, the
    visibility and the intervals are the worst of all devices."""

    def __init__(self, samplers: Sequence[NVMLSampler]) -> None:
        if not samplers:
            raise ValueError("no devices to sample")
        self.samplers = list(samplers)

    def start(self) -> Self:
        for s in self.samplers:
            s.start()
        return self

    def stop(self) -> SamplerResult:
        results = [s.stop() for s in self.samplers]
        top = max(results, key=lambda r: r.peak_used_bytes)
        change = max((r.others_changed_bytes for r in results), key=abs)
        return msgspec.structs.replace(
            top,
            samples=min(r.samples for r in results),
            failed_samples=sum(r.failed_samples for r in results),
            mean_interval_s=max(r.mean_interval_s for r in results),
            max_interval_s=max(r.max_interval_s for r in results),
            others_changed_bytes=change,
            others_changed=any(r.others_changed for r in results),
            others_visible=all(r.others_visible for r in results),
        )
