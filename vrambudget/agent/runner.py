"""The parent side of a probe: spawn a fresh child, enforce the time limit, cancel on request.

``spawn`` (not ``fork``): the child starts from a clean interpreter, so no CUDA state, thread or
lock of the agent process leaks into it, and the agent itself never initializes CUDA.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from typing import Any

import msgspec

from .child import ChildSettings
from .engine.group import EngineGroup, members, reap
from .probe import child_main, classify
from .spec import ProbeResult

__all__ = ["ChildResult", "ProbeProcess"]

_POLL_S = 0.05
_KILL_GRACE_S = 5.0

# The agent's own configuration (bearer tokens, the webhook secret, allow-lists) is none of a
# probe's business: removed from the environment the child is exec'd with.
_SECRET_PREFIXES = ("VRAMBUDGET_AGENT_",)
_ENV_LOCK = threading.Lock()


def scrubbed(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the agent's settings (every ``VRAMBUDGET_AGENT_*``)."""
    return {k: v for k, v in env.items() if not k.upper().startswith(_SECRET_PREFIXES)}


@dataclass(frozen=True, slots=True)
class ChildResult:
    status: str
    """succeeded | oom | unreliable | failed | timeout | cancelled"""
    result_json: bytes | None
    error: str | None


class ProbeProcess:
    """One child process running one probe. ``wait()`` blocks (run it in a thread)."""

    def __init__(
        self,
        request_json: bytes,
        child: ChildSettings,
        time_limit_s: float,
        sampler_factory: Callable[[frozenset[int], tuple[int, ...]], Any] | None = None,
        *,
        memory_limit_bytes: int | None = None,
        on_engine: Callable[[EngineGroup], None] | None = None,
    ) -> None:
        """``sampler_factory(pids, devices)`` returns an NVML sampler (``start()``/``stop()``)
        for the child's load phase, of the workload's processes on ``devices`` (NVML indices;
        empty: the probe's device); it runs here, in the agent, which does no work of its own,
        so its polls are not starved by the workload's threads. ``memory_limit_bytes``: the
        child's ``RLIMIT_DATA``, set before it imports torch (CPU probes; see ``limits``).
        ``on_engine(group)``: an engine probe's child started its engine (the agent stores the
        group, to stop it after a crash); this process stops what is left of the group whenever
        the child ends (``engine.group.reap``)."""
        self._sampler_factory = sampler_factory
        self._on_engine = on_engine
        self._engine: EngineGroup | None = None
        self._sampler: Any = None
        self._samples: Any = None
        self._ctx = ctx = mp.get_context("spawn")
        self._recv, send = ctx.Pipe(duplex=False)
        # The child's lifeline: this process holds the write end and never writes; when this
        # process dies in any way the child reads EOF and ends (``probe._watch_parent``).
        self._alive_r, self._alive_w = ctx.Pipe(duplex=False)
        self._args = (request_json, child, send, memory_limit_bytes, self._alive_r)
        self._process = self._built = self._child(pdeathsig=False)
        self._send = send
        self._time_limit_s = time_limit_s
        self._cancel = threading.Event()
        self._stop_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _child(self, *, pdeathsig: bool) -> SpawnProcess:
        return self._ctx.Process(
            target=child_main,
            args=(*self._args, pdeathsig),
            daemon=True,
            name="vrambudget-probe",
        )

    def start(self) -> None:
        # ``spawn`` execs the interpreter with this process's environment: take the agent's
        # secrets out of it for the instant of the exec (under a lock: two starts at once
        # must not restore each other's half-scrubbed copy).
        with _ENV_LOCK:
            removed = {k: v for k, v in os.environ.items() if k not in scrubbed({k: v})}
            for k in removed:
                del os.environ[k]
            try:
                # PR_SET_PDEATHSIG fires when the *thread* that forked the child ends: set
                # only when that is the main thread, which lives as long as this process (the
                # lifeline pipe covers every other case).
                main = threading.current_thread() is threading.main_thread()
                if self._process is self._built:  # (not a test's stand-in)
                    self._process = self._built = self._child(pdeathsig=main)
                self._process.start()
            finally:
                os.environ.update(removed)
        self._send.close()  # the child holds the only write end: EOF when it dies
        self._alive_r.close()

    def kill(self) -> None:
        """Stop the child now (it may not have started or may be gone already), and what is
        left of its engine."""
        if self._process.pid is not None and self._process.is_alive():
            self._stop()
        self._reap_engine()

    def _reap_engine(self) -> None:
        """SIGKILL whatever of the child's engine group is still there (nothing once the child
        stopped it): the child may have been killed, or have died, before it could."""
        if self._engine is not None:
            reap(self._engine)

    def cancel(self) -> None:
        self._cancel.set()

    def _stop(self) -> None:
        # Under a lock: ``wait()``'s thread and ``kill()`` (a worker torn down, the agent
        # stopping) may both stop the child; one waitpid each would race for its status.
        with self._stop_lock:
            self._process.terminate()
            self._process.join(_KILL_GRACE_S)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()

    def wait(self) -> ChildResult:
        deadline = time.monotonic() + self._time_limit_s
        try:
            while True:
                if self._cancel.is_set():
                    self._stop()
                    return ChildResult("cancelled", None, "cancelled by request")
                if time.monotonic() > deadline:
                    self._stop()
                    return ChildResult(
                        "timeout", None, f"killed at the time limit of {self._time_limit_s:g} s"
                    )
                try:
                    ready = self._recv.poll(_POLL_S)
                except (EOFError, OSError):
                    ready = True
                if ready:
                    try:
                        message = self._recv.recv()
                        if len(message) == 2:  # ("load_start", pid), ("engine_started", g), ...
                            self._phase(*message)
                            continue
                        status, result_json, error = message
                    except (EOFError, OSError):
                        self._process.join(_KILL_GRACE_S)
                        return ChildResult(
                            "failed",
                            None,
                            f"probe process exited with code "
                            f"{self._process.exitcode} without a result",
                        )
                    self._process.join(_KILL_GRACE_S)
                    if self._process.is_alive():
                        self._stop()
                    return self._merge(status, result_json, error)
        finally:
            self._end_sampling()
            self._recv.close()
            if self._process.is_alive():  # e.g. an error here: the child does not outlive us
                self._stop()
            self._reap_engine()
            self._alive_w.close()

    def _phase(self, name: str, value: Any) -> None:
        if name == "engine_started" and isinstance(value, EngineGroup):
            self._engine = value
            if self._on_engine is not None:
                self._on_engine(value)
        elif name == "load_start" and self._sampler_factory is not None and value is not None:
            if self._engine is not None:  # every process of the engine's group, on its GPUs
                pids = frozenset(members(self._engine)) | {int(value)}
                self._sampler = self._sampler_factory(pids, self._engine.devices)
            else:
                self._sampler = self._sampler_factory(frozenset({int(value)}), ())
            self._sampler.start()
        elif name == "load_end":
            self._end_sampling()

    def _end_sampling(self) -> None:
        if self._sampler is not None:
            self._samples = self._sampler.stop()
            self._sampler = None

    def _merge(self, status: str, result_json: bytes | None, error: str | None) -> ChildResult:
        """Put the parent's NVML samples into the child's device view, then classify. The
        child's ``baseline_used_bytes`` (read before the workload) stays: the sampler's first
        reading, taken when the load phase began, is ``load_baseline_used_bytes``."""
        if result_json is None:
            return ChildResult(status, None, error)
        result = msgspec.json.decode(result_json, type=ProbeResult)
        nv, s = result.nvml, self._samples
        if nv is not None and s is not None:
            result = msgspec.structs.replace(
                result,
                nvml=msgspec.structs.replace(
                    nv,
                    load_baseline_used_bytes=s.baseline_used_bytes,
                    peak_used_bytes=s.peak_used_bytes,
                    samples=s.samples,
                    sample_interval_s=s.mean_interval_s,
                    max_sample_interval_s=s.max_interval_s,
                    process_peak_used_bytes=s.process_peak_bytes,
                    others_changed_bytes=s.others_changed_bytes,
                    others_visible=s.others_visible,
                ),
            )
        status, why = classify(status, result)
        return ChildResult(status, msgspec.json.encode(result), why or error)
