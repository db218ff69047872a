"""The per-device workers: one probe at a time, its estimate fetched first (round trip), its
child run with NVML sampling from this process, its outcome stored with its callback and
comparison in one transaction."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec

from vrambudget.core.compare import COMPARABLE_STATUSES
from vrambudget.core.compare.observed import observed_headroom, same_workload

from . import nvml, observe
from .child import ChildSettings
from .engine.group import EngineGroup
from .limits import cpu_memory_limits
from .overlap import ProbeGroup
from .roundtrip import comparison_entry, device_ref, fetch_estimate, workload_software
from .snapshot_routes import settle_snapshot
from .snapshots import snapshot_path
from .spec import CustomWorkload, ProbeRequest, ProbeResult
from .state import AgentState, _callback, _resource

log = logging.getLogger("vrambudget.agent.worker")

# ---------------------------------------------------------------------------------- worker --


async def _worker(st: AgentState, key: str, queue: asyncio.Queue[str]) -> None:
    """One probe at a time per device. A failure anywhere in running or recording one probe
    (the runner, the store: a full disk, a read-only file) ends that probe as ``failed`` with
    the reason and is logged; the worker itself keeps serving the queue."""
    while True:
        probe_id = await queue.get()
        try:
            await _run_one(st, probe_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("probe %s on %s: the agent failed to run or record it", probe_id, key)
            await _fail_probe(st, probe_id, f"agent error: {type(exc).__name__}: {exc}"[:4000])
        finally:
            queue.task_done()


async def _fail_probe(st: AgentState, probe_id: str, error: str) -> None:
    """End a probe the worker could not finish as ``failed`` (with its callback when one can be
    built). If even that cannot be written, it is logged and the probe is remembered as failed
    in memory (the resource shows it) until the store accepts writes again or the agent
    restarts (which marks it ``interrupted``)."""
    now = time.time()
    try:
        row = await asyncio.to_thread(st.store.get_probe, probe_id)
        if row is None:
            return
        callback = None
        try:
            request = msgspec.json.decode(row.request, type=ProbeRequest)
            callback = _callback(
                st.settings, probe_id, request.callback, "failed", now, row, None, error
            )
        except Exception:  # an undecodable row still ends as failed, without a callback
            log.exception("probe %s: no callback could be built", probe_id)
        done = await asyncio.to_thread(
            st.store.finish_with_callback, probe_id, "failed", now, None, callback, error
        )
        st.unrecorded.pop(probe_id, None)
        if done:
            observe.finished(st.metrics, probe_id, row.device_key, "failed", error=error)
        if done and callback is not None:
            st.deliverer.wake()
    except Exception:
        log.exception("probe %s: could not record it as failed (%s)", probe_id, error)
        st.unrecorded[probe_id] = (now, error)


async def _run_one(st: AgentState, probe_id: str) -> None:
    store = st.store
    started = await asyncio.to_thread(
        store.transition, probe_id, "running", time.time(), expected={"queued"}
    )
    if not started:  # cancelled while queued
        return
    row = await asyncio.to_thread(store.get_probe, probe_id)
    if row is None:  # deleted meanwhile: nothing to run
        return
    device, began = row.device_key, time.monotonic()
    observe.running(probe_id, device)
    request = msgspec.json.decode(row.request, type=ProbeRequest)
    cpu = not row.device_key.startswith("cuda:")
    # The probe's child, and one per overlapping workload (``overlap``), started together.
    process = ProbeGroup(
        request,
        ChildSettings.of(st.settings, snapshot_path=_snapshot_path(st, probe_id, request)),
        _sampler_factory(st, row.device_key),
        lambda jobs: cpu_memory_limits(st.settings, jobs) if cpu else [None] * len(jobs),
        lambda group: _remember_engine(st, probe_id, group),
    )
    st.running[probe_id] = process  # before the estimate: a DELETE meanwhile cancels it
    try:
        if request.service_url is not None and not isinstance(request.workload, CustomWorkload):
            inv = await asyncio.to_thread(nvml.inventory) if st.cuda else None
            estimate_json, estimate_error = await asyncio.to_thread(
                fetch_estimate,
                request,
                device_ref(inv, request.device) if inv else None,
                None,
                workload_software(request.workload, inv),
                allow_list=st.settings.service_allow_list,
                resolver=st.resolver,
            )
            await asyncio.to_thread(store.set_estimate, probe_id, estimate_json, estimate_error)
        # Started from this (the event loop's) thread, which lives as long as the agent: a
        # child's PR_SET_PDEATHSIG fires when the *thread* that forked it ends, and a pool
        # thread may end while the probe runs. A spawn start is a fork-exec and a pipe write.
        process.start()
        outcome = await asyncio.to_thread(process.wait)
    except BaseException:
        if process.pid is not None:  # never leave a child behind a failed worker step
            await asyncio.shield(asyncio.to_thread(process.kill))
        raise
    finally:
        st.running.pop(probe_id, None)
    now = time.time()
    result_json = outcome.result_json.decode() if outcome.result_json else None
    if request.memory_snapshot:  # the file is kept only if the result describes it
        result_json = await asyncio.to_thread(settle_snapshot, st.settings, probe_id, result_json)
    if outcome.status == "succeeded" and result_json is not None:
        result_json = await asyncio.to_thread(
            _with_headroom, st, row.device_key, request, result_json
        )
    row = await asyncio.to_thread(store.get_probe, probe_id)  # with its estimate
    callback = _callback(
        st.settings,
        probe_id,
        request.callback,
        outcome.status,
        now,
        row,
        result_json,
        outcome.error,
    )
    comparison = comparison_error = None
    if request.service_url is not None:
        if (
            outcome.status in COMPARABLE_STATUSES
            and result_json is not None
            and not isinstance(request.workload, CustomWorkload)
        ):
            comparison = comparison_entry(
                msgspec.structs.replace(
                    _resource(row),
                    status=outcome.status,
                    updated_at=now,
                    result=msgspec.json.decode(result_json, type=ProbeResult),
                    error=outcome.error,
                )
            )
        else:
            comparison_error = (
                f"status {outcome.status}: nothing to compare"
                if not isinstance(request.workload, CustomWorkload)
                else "custom entry points have no estimate"
            )
    done = await asyncio.to_thread(
        store.finish_with_callback,
        probe_id,
        outcome.status,
        now,
        result_json,
        callback,
        outcome.error,
        comparison=comparison,
        comparison_error=comparison_error,
    )
    if done:
        observe.finished(
            st.metrics,
            probe_id,
            device,
            outcome.status,
            request=request,
            duration_s=time.monotonic() - began,
            result_json=result_json,
            error=outcome.error,
        )
    if callback is not None or comparison is not None:
        st.deliverer.wake()


def _snapshot_path(st: AgentState, probe_id: str, request: ProbeRequest) -> str | None:
    """Where the child keeps the probe's memory snapshot (``memory_snapshot``), or None."""
    return snapshot_path(st.settings.data_dir, probe_id) if request.memory_snapshot else None


_HEADROOM_HISTORY = 200
"""Earlier succeeded probes of a device searched for the same workload."""


def _with_headroom(st: AgentState, device_key: str, request: ProbeRequest, result_json: str) -> str:
    """The result with the headroom its iterations and the device's earlier probes of the same
    workload advise."""
    result = msgspec.json.decode(result_json, type=ProbeResult)
    earlier = []
    for row in st.store.succeeded_on_device(device_key, _HEADROOM_HISTORY):
        if row.result is None:
            continue
        try:
            other = msgspec.json.decode(row.request, type=ProbeRequest)
            if same_workload(other, request):
                earlier.append(msgspec.json.decode(row.result, type=ProbeResult))
        except msgspec.ValidationError:  # a row from an older release's wire types
            continue
    headroom = observed_headroom(result, earlier)
    if headroom is None:
        return result_json
    return msgspec.json.encode(msgspec.structs.replace(result, headroom=headroom)).decode()


def _remember_engine(st: AgentState, probe_id: str, group: EngineGroup) -> None:
    """Store the engine's group in the probe's row (from the runner's thread): an agent that
    restarts after a crash stops what is left of it (``Store.recover``)."""
    try:
        st.store.set_engine_group(probe_id, msgspec.json.encode(group).decode())
    except Exception:  # the probe goes on; this agent still stops the group itself
        log.exception("probe %s: could not store its engine's group %d", probe_id, group.pgid)


def _sampler_factory(st: AgentState, key: str) -> Any:
    """NVML sampling of a CUDA probe's load phase, from this process (see runner.py): of the
    workload's processes, on the probe's device or every device an engine was given."""
    if not key.startswith("cuda:"):
        return None
    from .sampler import DevicesSampler, NVMLSampler

    own = int(key.split(":", 1)[1])
    handle, _ = nvml.resolve_device(own)

    def make(pids: frozenset[int], devices: tuple[int, ...]) -> Any:
        if not devices or devices == (own,):
            return NVMLSampler(handle, pids=pids)
        return DevicesSampler([NVMLSampler(nvml.resolve_device(i)[0], pids=pids) for i in devices])

    return make
