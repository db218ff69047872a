"""An engine probe, in the probe's child process: start the engine the recipe names from the
host's launcher, wait until it answers ready, drive the load through its API, stop it --
always -- and report its own startup figures, the load's latencies and the device's peak.

The engine runs in its own process group (``start_new_session``) with ``PR_SET_PDEATHSIG`` so
that it dies with this child; this child stops the whole group in a ``finally`` (SIGTERM, a
grace period, SIGKILL), and turns its own SIGTERM (a cancel or the time limit: the agent
terminates the child) into an exception so that ``finally`` runs then too. stdout and stderr go
to a log file in a temporary directory, read afterwards for the startup figures and the tail.
No torch here: the engine brings its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from vrambudget.core.probe_engine import EngineReport, EngineStartup
from vrambudget.core.probe_report import DeviceView, Iteration, ProbeRequest, ProbeResult
from vrambudget.core.spec import LLMServingWorkload

from ..child import ChildSettings
from .command import engine_command
from .load import LoadResult, drive, latency, preemptions
from .logs import parse_startup
from .recipe import EngineRefused, Recipe, expected, plan

__all__ = ["EngineTerminated", "measure_engine"]

STOP_GRACE_S = 3.0
"""SIGTERM to SIGKILL for the engine's group (the agent gives this child 5 s in all)."""
POLL_S = 0.25
LOG_TAIL_LINES = 40


class EngineTerminated(SystemExit):
    """This child was terminated (cancel, time limit): the engine is stopped on the way out."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the engine's process between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def _terminated_raises() -> Iterator[None]:
    """SIGTERM raises :class:`EngineTerminated` here (once; a second is ignored, so the
    clean-up it leads to is not interrupted)."""

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise EngineTerminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the engine's process group, wait, SIGKILL what is left; reap the leader."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the leader is gone; its group's stragglers are not spared
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        return


def _get(url: str, timeout: float = 2.0) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=timeout, trust_env=False)
    except httpx.HTTPError:
        return None


def _wait_ready(proc: subprocess.Popen[bytes], base: str, timeout_s: float) -> str | None:
    """None once ``/health`` answers 200 (llama.cpp answers 503 while it loads; vLLM and SGLang
    listen only once they are up), else why not."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            return f"the engine exited with code {code} before it was ready"
        r = _get(f"{base}/health")
        if r is not None and r.status_code == 200:
            return None
        if time.monotonic() > deadline:
            return f"the engine did not answer ready within {timeout_s:g} s (stopped)"
        time.sleep(POLL_S)


def _served_model(base: str, fallback: str) -> str:
    r = _get(f"{base}/v1/models")
    try:
        data = r.json()["data"] if r is not None and r.status_code == 200 else []
        return str(data[0]["id"]) if data else fallback
    except (ValueError, KeyError, IndexError, TypeError):
        return fallback


def _metrics(base: str) -> str | None:
    r = _get(f"{base}/metrics")
    return r.text if r is not None and r.status_code == 200 else None


def _device(req: ProbeRequest) -> tuple[Any, Any, int | None]:
    """(NVML inventory, device handle, index) -- None, None, None without NVML."""
    from .. import nvml

    inv = nvml.inventory()
    if not inv.available:
        return None, None, None
    handle, index = nvml.resolve_device(req.device)
    return inv, handle, index


def measure_engine(
    req: ProbeRequest, child: ChildSettings, notify: Callable[[tuple[str, Any]], None]
) -> tuple[str, ProbeResult | None, str | None]:
    """(status, result, error) of the engine probe ``req``: ``succeeded``, or ``failed`` with
    the result kept (``engine.started`` false, its exit code and log tail) when the engine did
    not start or died during the load."""
    from .. import nvml

    w = req.workload
    assert isinstance(w, LLMServingWorkload)
    inv, handle, index = _device(req)
    try:
        recipe = plan(req, child.engines, inv, model_dirs=child.model_dirs, gguf_dir=child.gguf_dir)
    except EngineRefused as exc:
        return "failed", None, str(exc)
    baseline = nvml.device_used_bytes(handle) if handle is not None else None
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    prefix = child.engines[recipe.engine]
    argv = engine_command(recipe.engine, recipe.launch, prefix, recipe.model, port, child.gguf_dir)
    env = dict(os.environ)  # the child's: already without the agent's settings
    gpu = next((g for g in inv.gpus if g.index == index), None) if inv is not None else None
    if gpu is not None and w.parallelism.tensor * w.parallelism.pipeline == 1:
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid  # one GPU per replica: the probe's own
    workdir = Path(tempfile.mkdtemp(prefix="vrambudget-engine-"))
    log_path = workdir / "engine.log"
    started = False
    startup_s: float | None = None
    exit_code: int | None = None
    why: str | None = None
    load = LoadResult()
    preempted: float | None = None
    try:
        with _terminated_raises(), open(log_path, "wb") as log:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # a fresh child: no other thread to deadlock
            )
            try:
                why = _wait_ready(proc, base, recipe.load.ready_timeout_s)
                if why is None:
                    started, startup_s = True, time.monotonic() - t0
                    model = _served_model(base, recipe.model)
                    before = _metrics(base)
                    try:
                        load = asyncio.run(
                            drive(
                                base,
                                recipe.engine,
                                model,
                                recipe.load,
                                recipe.prompt_tokens,
                                recipe.vocab_size,
                                random.randrange(1 << 30),
                                lambda: notify(("load_start", proc.pid)),
                            )
                        )
                    finally:
                        notify(("load_end", None))
                    after = _metrics(base)
                    p0, p1 = preemptions(recipe.engine, before), preemptions(recipe.engine, after)
                    preempted = p1 - p0 if p0 is not None and p1 is not None else p1
                    if proc.poll() is not None:
                        why = f"the engine exited with code {proc.returncode} during the load"
            finally:
                running = proc.poll() is None
                stop_group(proc)
                if not running:
                    exit_code = proc.returncode
        lines = log_path.read_text(errors="replace").splitlines()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    startup = parse_startup(recipe.engine, lines)
    report = _report(recipe, argv, started, startup_s, exit_code, startup, load, preempted, lines)
    result = _result(req, inv, gpu, baseline, report, load, why)
    return ("succeeded" if why is None else "failed"), result, why


def _report(
    recipe: Recipe,
    argv: list[str],
    started: bool,
    startup_s: float | None,
    exit_code: int | None,
    startup: EngineStartup,
    load: LoadResult,
    preempted: float | None,
    lines: list[str],
) -> EngineReport:
    wall = load.wall_s
    ok = len(load.end_to_end)
    show_tail = not started or exit_code is not None or load.errors > 0
    return EngineReport(
        engine=recipe.engine,
        command=tuple(argv),
        started=started,
        startup_s=startup_s,
        exit_code=exit_code,
        startup=startup,
        expected=expected(recipe, startup.kv_cache_tokens),
        requests=load.requests,
        errors=load.errors,
        preemptions=round(preempted) if preempted is not None else None,
        ttft=latency(load.ttft),
        inter_token=latency(load.inter_token),
        end_to_end=latency(load.end_to_end),
        output_tokens_per_s=load.output_tokens / wall if wall > 0 else 0.0,
        requests_per_s=ok / wall if wall > 0 else 0.0,
        prompt_tokens=recipe.prompt_tokens,
        output_tokens=recipe.load.output_tokens,
        log_tail=tuple(lines[-LOG_TAIL_LINES:]) if show_tail else (),
    )


def _result(
    req: ProbeRequest,
    inv: Any,
    gpu: Any,
    baseline: int | None,
    report: EngineReport,
    load: LoadResult,
    why: str | None,
) -> ProbeResult:
    e2e = report.end_to_end
    view = (
        DeviceView(  # the parent's sampler fills in the peak (runner.py)
            baseline_used_bytes=baseline,
            peak_used_bytes=0,
            samples=0,
            sample_interval_s=0.0,
            max_sample_interval_s=0.0,
            process_peak_used_bytes=None,
            accounting_max_memory_bytes=None,
            cuda_context_bytes=0,
            others_changed_bytes=0,
            others_visible=False,
        )
        if gpu is not None and baseline is not None
        else None
    )
    # The engine's peak resident memory: it was reaped, so it is among this child's children.
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return ProbeResult(
        device="cuda" if gpu is not None else "cpu",
        device_name=str(gpu.name) if gpu is not None else "cpu",
        torch_version=None,
        cuda_version=None,
        driver_version=inv.driver_version if gpu is not None else None,
        torch=None,
        nvml=view,
        host_peak_rss_bytes=rss,
        iterations=Iteration(
            p50_s=e2e.p50_s or 0.0,
            p95_s=e2e.p95_s or 0.0,
            count=e2e.count,
            throughput_per_s=report.requests_per_s,
            errors=load.errors,
        ),
        outputs_finite=True,
        message=why if why is not None else (load.first_error if load.errors else None),
        memory_total_bytes=int(gpu.memory_total_bytes) if gpu is not None else None,
        compute_capability=getattr(gpu, "compute_capability", None) if gpu is not None else None,
        engine=report,
    )
