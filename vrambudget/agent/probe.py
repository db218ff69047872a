"""One probe, run in a fresh spawned child process: build the workload with the shared torch
builders, warm up, reset the peaks, run the load phase, collect both views.

The agent process itself never imports torch or creates a CUDA context; everything here runs in
the child. Views are kept apart: PyTorch's allocator counters (``torch.cuda.memory_stats``; on
a host without CUDA the dispatch-mode tracker of the trace tier, run on real tensors) and NVML's
device counters. On the CPU path the result says ``device: cpu``. The two paths are
``probe_cpu`` and ``probe_cuda``; what they share (the program, the load phase) is ``probe_run``.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from .alloc_conf import apply
from .child import ChildSettings
from .probe_cpu import _measure_cpu
from .probe_cuda import _measure_cuda
from .spec import ProbeRequest, ProbeResult

__all__ = [
    "UNRELIABLE_OTHERS_BYTES",
    "ChildOutcome",
    "child_main",
    "classify",
    "failure_message",
    "measure",
]

# Other processes changing device memory by more than this during the measurement make the NVML
# view meaningless for this probe (status unreliable); the sampler's default threshold too.
UNRELIABLE_OTHERS_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    status: str
    result: ProbeResult | None
    error: str | None


def _ignore(message: tuple[str, Any]) -> None:
    pass


def measure(
    req: ProbeRequest,
    child: ChildSettings,
    notify: Callable[[tuple[str, Any]], None] = _ignore,
) -> ChildOutcome:
    """Run the probe in this process (the child) and classify the outcome; ``notify`` tells
    the parent when the load phase starts and ends."""
    from vrambudget.core.spec import LLMServingWorkload

    if isinstance(req.workload, LLMServingWorkload):  # the engine brings its own torch
        from .engine.run import measure_engine

        return ChildOutcome(*measure_engine(req, child, notify))
    apply(req.expandable_segments, os.environ)  # before any CUDA allocation
    import torch

    run = _measure_cuda if torch.cuda.is_available() else _measure_cpu
    result = run(req, child, notify)
    if result.message is not None:  # both paths set a message only on out-of-memory
        return ChildOutcome("oom", result, result.message)
    if req.quality is not None:  # after the measurement: it cannot disturb the peaks
        from .probe_quality import with_quality

        return ChildOutcome(*with_quality(req, child, result))
    return ChildOutcome("succeeded", result, None)


def classify(status: str, result: ProbeResult | None) -> tuple[str, str | None]:
    """After the parent merged its NVML samples: a measurement during which other processes
    changed device memory by more than ``UNRELIABLE_OTHERS_BYTES`` is ``unreliable``."""
    nv = result.nvml if result is not None else None
    if (
        status == "succeeded"
        and nv is not None
        and nv.others_visible
        and (abs(nv.others_changed_bytes) > UNRELIABLE_OTHERS_BYTES)
    ):
        return "unreliable", (
            f"other processes changed device memory by "
            f"{nv.others_changed_bytes} bytes during the measurement"
        )
    return status, None


def _limit_memory(limit_bytes: int) -> None:
    """Cap this process's private writable memory (``RLIMIT_DATA``: heap and anonymous
    mappings, where CPU tensors live) -- an allocation past it fails in this child instead of
    waking the host's OOM killer. Never raises the hard limit."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _watch_parent(alive: Connection) -> None:
    """SIGKILL this child when the agent process dies in any way: the agent holds the write end
    of ``alive`` and never writes, so a read ends (EOF) only when it is gone. Unlike
    ``PR_SET_PDEATHSIG`` it does not depend on which of the agent's threads started the child.
    An engine the child started is stopped by its supervisor (``engine.supervise``)."""
    import os
    import signal
    import threading

    def watch() -> None:
        try:
            alive.recv()
        except (EOFError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="vrambudget-parent-watch", daemon=True).start()


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when the thread that started it ends (PR_SET_PDEATHSIG); only
    set when that is the agent's main thread, i.e. when the agent dies."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def failure_message(exc: BaseException, frames: int = 3) -> str:
    """A failed probe's error: the exception, then where it was raised -- its last ``frames``
    frames as ``file:line in function`` (paths from the package or site-packages on), so a
    report from a remote GPU host is enough to find the line. At most 4,000 characters."""
    where = []
    for f in traceback.extract_tb(exc.__traceback__)[-frames:]:
        path = f.filename
        for marker in ("/site-packages/", "/vrambudget/"):
            if marker in path:
                path = path[path.index(marker) + 1 :].removeprefix("site-packages/")
                break
        where.append(f"{path}:{f.lineno} in {f.name}")
    at = f" (at {' <- '.join(reversed(where))})" if where else ""
    text = "".join(traceback.format_exception_only(exc)).strip()
    return text[: 4000 - len(at)] + at  # a long message is cut, never the frames


def child_main(
    request_json: bytes,
    child: ChildSettings,
    conn: Connection,
    memory_limit_bytes: int | None = None,
    alive: Connection | None = None,
    pdeathsig: bool = True,
) -> None:
    """Entry point of the spawned child: measure, send (status, result JSON, error) back.
    ``alive``: the agent's lifeline (``_watch_parent``); ``pdeathsig``: the agent started this
    child from its main thread, so ``PR_SET_PDEATHSIG`` means "the agent died"."""
    if pdeathsig:
        _die_with_parent()
    if alive is not None:
        _watch_parent(alive)
    try:
        if memory_limit_bytes is not None:
            _limit_memory(memory_limit_bytes)
        req = msgspec.json.decode(request_json, type=ProbeRequest)
        outcome = measure(req, child, conn.send)
        payload = (
            outcome.status,
            msgspec.json.encode(outcome.result) if outcome.result else None,
            outcome.error,
        )
    except BaseException as exc:  # noqa: BLE001 -- everything becomes a failed result
        payload = ("failed", None, failure_message(exc))
    conn.send(payload)
    conn.close()
