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

from . import nvml
from .child import ChildSettings
from .limits import cpu_memory_limit
from .roundtrip import comparison_entry, device_ref, fetch_estimate, local_software
from .runner import ProbeProcess
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
    request = msgspec.json.decode(row.request, type=ProbeRequest)
    process = ProbeProcess(
        row.request.encode(),
        ChildSettings.of(st.settings),
        request.time_limit_s,
        _sampler_factory(st, row.device_key),
        memory_limit_bytes=(
            cpu_memory_limit(st.settings, request)
            if not row.device_key.startswith("cuda:")
            else None
        ),
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
                local_software(inv),
                allow_list=st.settings.service_allow_list,
                resolver=st.resolver,
            )
            await asyncio.to_thread(store.set_estimate, probe_id, estimate_json, estimate_error)
        await asyncio.to_thread(process.start)
        outcome = await asyncio.to_thread(process.wait)
    except BaseException:
        if process.pid is not None:  # never leave a child behind a failed worker step
            await asyncio.shield(asyncio.to_thread(process.kill))
        raise
    finally:
        st.running.pop(probe_id, None)
    now = time.time()
    result_json = outcome.result_json.decode() if outcome.result_json else None
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
    await asyncio.to_thread(
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
    if callback is not None or comparison is not None:
        st.deliverer.wake()


def _sampler_factory(st: AgentState, key: str) -> Any:
    """NVML sampling of a CUDA probe's load phase, from this process (see runner.py)."""
    if not key.startswith("cuda:"):
        return None
    from .sampler import NVMLSampler

    handle, _ = nvml.resolve_device(int(key.split(":", 1)[1]))
    return lambda pid: NVMLSampler(handle, pid=pid)
