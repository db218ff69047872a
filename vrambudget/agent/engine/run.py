"""An engine probe, in the probe's child process: start the engine the recipe names from the
host's launcher, wait until it answers ready, drive the load through its API, stop it --
always -- and report its own startup figures, the load's latencies and the device's peak.

The engine runs under a supervisor (``supervise``): the leader of a new session and process
group, which stops the whole group -- the engine and every process it started -- when this
child closes the pipe to it or sends it SIGTERM, and when this child dies in any way (its
``PR_SET_PDEATHSIG`` and the pipe's EOF). Right after starting it this child tells the parent
the group (``("engine_started", EngineGroup)``), so the agent can stop it from outside too
(``group.reap``). This child stops the group in a ``finally`` with SIGTERM ignored (a cancel
arriving then does not cut the clean-up short), and turns its own SIGTERM before that (a cancel
or the time limit: the agent terminates the child) into an exception so that ``finally`` runs
then too -- and records it, for the wait and the load to stop on where Python swallowed that
exception (``Termination``). stdout and stderr go to a log file in a temporary directory, read
afterwards for the startup figures, the engine's version and the tail. No torch here: the
engine brings its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec

from vrambudget.core.probe_engine import EngineReport, EngineStartup
from vrambudget.core.probe_report import DeviceView, Iteration, ProbeRequest, ProbeResult
from vrambudget.core.spec import LLMServingWorkload

from ..child import ChildSettings
from . import supervise
from .command import engine_command, recipe_env
from .group import ENV, EngineGroup, boot_id, reap, start_time
from .load import LoadResult, drive, latency, preemptions
from .logs import engine_version, parse_startup, version_warning
from .recipe import EngineRefused, Recipe, engine_gpus, expected, plan

__all__ = [
    "EngineTerminated",
    "Termination",
    "measure_engine",
    "run_load",
    "start_engine",
    "stop_group",
]

STOP_GRACE_S = 3.0
"""SIGTERM to SIGKILL for the engine's group (the agent gives this child 5 s in all)."""
SUPERVISOR = supervise.__file__
POLL_S = 0.25
LOG_TAIL_LINES = 40


class EngineTerminated(SystemExit):
    """This child was terminated (cancel, time limit): the engine is stopped on the way out."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Termination:
    """This child's SIGTERM, raised as :class:`EngineTerminated` where it lands and kept here
    too: Python ignores an exception raised from a signal handler while a finalizer (an object's
    ``__del__``, a garbage-collected transport) runs, so the loops that can run long -- the wait
    for ready, the load -- also look at ``signum`` (``check``, ``requested``) and stop on it."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def requested(self) -> bool:
        return self.signum is not None

    def check(self) -> None:
        """Raise :class:`EngineTerminated` if SIGTERM arrived (whether or not its first raise
        was swallowed)."""
        if self.signum is not None:
            raise EngineTerminated(128 + self.signum)


@contextlib.contextmanager
def _terminated_raises() -> Iterator[Termination]:
    """SIGTERM raises :class:`EngineTerminated` here and is recorded in the :class:`Termination`
    yielded (once; a second is ignored, so the clean-up it leads to is not interrupted)."""
    term = Termination()

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        term.signum = signum
        term.check()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield term
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_load(main: Coroutine[Any, Any, LoadResult], term: Termination) -> LoadResult:
    """``asyncio.run(main)``; a SIGTERM that lands while a task group runs (anyio's
    ``connect_tcp`` opening a request's connection) comes out wrapped in a
    ``BaseExceptionGroup``, and is raised as the :class:`EngineTerminated` it is (the child
    then exits 143, as for a SIGTERM anywhere else, not 1 with the group's traceback)."""
    try:
        return asyncio.run(main)
    except BaseExceptionGroup as exc:
        if exc.subgroup(EngineTerminated) is not None:
            term.check()
            raise EngineTerminated(128 + signal.SIGTERM) from exc
        raise


def start_engine(
    argv: list[str], log: Any, workdir: Path, env: dict[str, str], devices: tuple[int, ...]
) -> tuple[subprocess.Popen[bytes], EngineGroup]:
    """Start ``argv`` under its supervisor, in a new process group, with a fresh token in the
    environment of every process of the group; (the supervisor, the group's identity)."""
    token = secrets.token_hex(16)
    proc = subprocess.Popen(
        [sys.executable, "-I", SUPERVISOR, str(os.getpid()), f"{STOP_GRACE_S:g}", "--", *argv],
        stdin=subprocess.PIPE,  # its EOF (this child closed it, or died) stops the group
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env={**env, ENV: token},
        start_new_session=True,
    )
    group = EngineGroup(
        pgid=proc.pid,
        start_time=start_time(proc.pid),
        boot_id=boot_id(),
        token=token,
        devices=devices,
    )
    return proc, group


def stop_group(proc: subprocess.Popen[bytes], group: EngineGroup) -> None:
    """Stop the engine's group and reap its supervisor, with SIGTERM ignored meanwhile (a cancel
    or the time limit arriving now must not cut the stop short): EOF and SIGTERM to the
    supervisor (which sends SIGTERM to the group, waits ``STOP_GRACE_S``, then SIGKILL); if it
    has not finished a second later, SIGKILL to whatever of the group is left."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S + 1.0)
        except subprocess.TimeoutExpired:
            pass
        reap(group)  # only what is still there, by its identity
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _get(url: str, timeout: float = 2.0) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=timeout, trust_env=False)
    except httpx.HTTPError:
        return None


def _wait_ready(
    proc: subprocess.Popen[bytes], base: str, timeout_s: float, term: Termination
) -> str | None:
    """None once ``/health`` answers 200 (llama.cpp answers 503 while it loads; vLLM and SGLang
    listen only once they are up), else why not."""
    deadline = time.monotonic() + timeout_s
    while True:
        term.check()
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
    env = {**os.environ, **recipe_env(recipe.launch)}  # the child's: without the agent's settings
    gpu = next((g for g in inv.gpus if g.index == index), None) if inv is not None else None
    given = engine_gpus(inv, index, w.parallelism.devices)
    if given:  # the probe's device first, then as many more as tensor x pipeline x data
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.uuid) for g in given)
    workdir = Path(tempfile.mkdtemp(prefix="vrambudget-engine-"))
    log_path = workdir / "engine.log"
    started = False
    startup_s: float | None = None
    exit_code: int | None = None
    why: str | None = None
    load = LoadResult()
    preempted: float | None = None
    try:
        with _terminated_raises() as term, open(log_path, "wb") as log:
            t0 = time.monotonic()
            proc, group = start_engine(argv, log, workdir, env, tuple(int(g.index) for g in given))
            try:
                notify(("engine_started", group))  # the agent can stop it from outside too
                why = _wait_ready(proc, base, recipe.load.ready_timeout_s, term)
                if why is None:
                    started, startup_s = True, time.monotonic() - t0
                    model = _served_model(base, recipe.model)
                    before = _metrics(base)
                    try:
                        load = run_load(
                            drive(
                                base,
                                recipe.engine,
                                model,
                                recipe.load,
                                recipe.prompt_tokens,
                                recipe.vocab_size,
                                random.randrange(1 << 30),
                                lambda: notify(("load_start", proc.pid)),
                                term.requested,
                            ),
                            term,
                        )
                    finally:
                        notify(("load_end", None))
                    term.check()  # a load cut short by SIGTERM is not a result
                    after = _metrics(base)
                    p0, p1 = preemptions(recipe.engine, before), preemptions(recipe.engine, after)
                    preempted = p1 - p0 if p0 is not None and p1 is not None else p1
                    if proc.poll() is not None:
                        why = f"the engine exited with code {proc.returncode} during the load"
            finally:
                running = proc.poll() is None
                stop_group(proc, group)
                if not running:
                    exit_code = proc.returncode
            term.check()  # a SIGTERM swallowed late (the last wait, the metrics) ends it too
        lines = log_path.read_text(errors="replace").splitlines()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    startup = parse_startup(recipe.engine, lines)
    report = _report(recipe, argv, started, startup_s, exit_code, startup, load, preempted, lines)
    report = _with_version(report, recipe, engine_version(recipe.engine, lines))
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


def _with_version(report: EngineReport, recipe: Recipe, installed: str | None) -> EngineReport:
    """The installed engine's version (from its log) beside the release the recipe follows."""
    serving = recipe.budget.serving
    modelled = serving.modelled_version if serving is not None else None
    return msgspec.structs.replace(
        report,
        version=installed,
        modelled_version=modelled,
        version_warning=version_warning(recipe.engine, installed, modelled),
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
