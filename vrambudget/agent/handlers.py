"""The agent API's route handlers: health, the device report, and probes as operation
resources (submit, get, list, cancel). Thin: a submitted probe goes on its device's queue
(``worker``); the store holds the rest."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
import uuid
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.params import FromPath, FromQuery

from vrambudget.http.body import decode_body

from . import nvml, observe
from .compat_check import live_check
from .limits import WorkloadRefused, validate_overlap, validate_workload
from .nvml import HostInfo, NVMLInventory
from .overlap import member_request
from .snapshot_routes import drop_snapshot
from .spec import CustomWorkload, ProbeRequest, ProbeResource
from .state import AgentState, _callback, _resource, _state
from .store import TERMINAL_STATUSES
from .webhooks import AddressRefused, callback_allowed, pin
from .worker import _worker

log = logging.getLogger("vrambudget.agent.api")

_VALIDATE_TIMEOUT_S = 5.0
"""The analytic check of a workload takes microseconds; one that takes longer is refused."""

__all__ = [
    "DeviceReport",
    "Health",
    "ProbePage",
    "QueueFull",
    "Readiness",
    "StorageUnavailable",
    "cancel",
    "device",
    "get_probe",
    "healthz",
    "list_probes",
    "readyz",
    "submit",
]


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: str = "ok"


class DeviceReport(msgspec.Struct, frozen=True, kw_only=True):
    nvml: NVMLInventory
    host: HostInfo
    probe_device: str
    """Where probes run on this host: ``cuda`` or ``cpu`` (no usable NVIDIA driver)."""


class ProbePage(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[ProbeResource, ...]
    next: str | None
    """Pass as ``after`` for the next page; null on the last page."""


class Readiness(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    """``ok``, or ``unavailable`` with the reason."""
    reason: str | None = None


class QueueFull(HTTPException):
    status_code = 429


class StorageUnavailable(HTTPException):
    """The agent could not record a probe it accepted (full disk, read-only directory)."""

    status_code = 503


def _unprocessable(field_path: str, message: str) -> ValidationException:
    return ValidationException(
        detail="invalid request", extra=[{"message": f"{message} - at `{field_path}`"}]
    )


# -------------------------------------------------------------------------------- handlers --


@get("/healthz", summary="Liveness (no authentication)", opt={"public": True})
async def healthz() -> Health:
    return Health()


@get(
    "/readyz",
    summary="Readiness: can the agent record probes (no authentication)",
    opt={"public": True},
)
async def readyz(request: Request[Any, Any, Any]) -> Response[Readiness]:
    reason = await asyncio.to_thread(_state(request).storage_check)
    if reason is None:
        return Response(Readiness(status="ok"), status_code=200)
    return Response(Readiness(status="unavailable", reason=reason), status_code=503)


@get("/v1/device", summary="The host's GPUs (NVML) and CPU/RAM")
async def device(request: Request[Any, Any, Any]) -> DeviceReport:
    inv = await asyncio.to_thread(nvml.inventory)
    host = await asyncio.to_thread(nvml.host_info)
    return DeviceReport(nvml=inv, host=host, probe_device="cuda" if _state(request).cuda else "cpu")


@post("/v1/probes", summary="Submit a probe", status_code=202)
async def submit(request: Request[Any, Any, Any]) -> Response[ProbeResource]:
    st = _state(request)
    try:
        body = await asyncio.wait_for(request.body(), st.settings.body_timeout_s)
    except TimeoutError:
        raise HTTPException(
            status_code=408,
            detail=f"request body not received within {st.settings.body_timeout_s:g} s",
        ) from None
    if len(body) > st.settings.max_body_bytes:
        raise HTTPException(
            status_code=413, detail=f"request body over {st.settings.max_body_bytes} bytes"
        )
    probe = decode_body(body, ProbeRequest)
    jobs = [("$.workload", probe.workload)] + [
        (f"$.overlap[{i}]", w) for i, w in enumerate(probe.overlap)
    ]
    for path, job in jobs:
        if isinstance(job, CustomWorkload) and job.entry_point not in st.settings.entry_points:
            names = ", ".join(sorted(st.settings.entry_points)) or "none are configured"
            raise _unprocessable(
                f"{path}.entry_point",
                f"unknown entry point {job.entry_point!r}; allowed: {names}",
            )
    if probe.callback is not None and not callback_allowed(
        probe.callback.url, st.settings.callback_allow_list
    ):
        allowed = ", ".join(st.settings.callback_allow_list) or "callbacks are off"
        raise _unprocessable(
            "$.callback.url", f"not on the agent's callback allow-list ({allowed})"
        )
    if probe.service_url is not None and not callback_allowed(
        probe.service_url, st.settings.service_allow_list
    ):
        allowed = ", ".join(st.settings.service_allow_list) or "the round trip is off"
        raise _unprocessable("$.service_url", f"not on the agent's service allow-list ({allowed})")
    for field_path, url, allow in (
        ("$.callback.url", probe.callback.url if probe.callback else None, "callback_allow_list"),
        ("$.service_url", probe.service_url, "service_allow_list"),
    ):
        if url is None:
            continue
        try:  # checked again at every send: DNS may change meanwhile
            await asyncio.to_thread(pin, url, getattr(st.settings, allow), st.resolver)
        except AddressRefused as exc:
            if not exc.unresolved:
                raise _unprocessable(field_path, f"refused: {exc}") from None
    if probe.time_limit_s > st.settings.max_time_limit_s:
        raise _unprocessable(
            "$.time_limit_s", f"must be <= {st.settings.max_time_limit_s:g} (the agent's limit)"
        )
    jobs_to_check = [("$.workload", probe)] + [
        (f"$.overlap[{i}]", member_request(probe, i)) for i in range(len(probe.overlap))
    ]
    for path, job_request in jobs_to_check:
        try:
            await asyncio.wait_for(
                asyncio.to_thread(validate_workload, st.settings, job_request, cpu=not st.cuda),
                _VALIDATE_TIMEOUT_S,
            )
        except WorkloadRefused as exc:
            raise _unprocessable(exc.field.replace("$.workload", path, 1), exc.message) from None
        except TimeoutError:
            raise _unprocessable(
                path, f"too large to validate within {_VALIDATE_TIMEOUT_S:g} s"
            ) from None
    try:  # jobs that run together share the host's memory cap
        await asyncio.wait_for(
            asyncio.to_thread(
                validate_overlap, st.settings, [r for _, r in jobs_to_check], cpu=not st.cuda
            ),
            _VALIDATE_TIMEOUT_S,
        )
    except WorkloadRefused as exc:
        raise _unprocessable(exc.field, exc.message) from None
    except TimeoutError:
        raise _unprocessable(
            "$.overlap", f"too large to validate within {_VALIDATE_TIMEOUT_S:g} s"
        ) from None
    if st.cuda:
        await asyncio.to_thread(_check_compatibility, probe)
    key = await asyncio.to_thread(_device_key, st, probe)
    reason = await asyncio.to_thread(st.storage_check)
    if reason is not None:
        raise _storage_unavailable(st, reason)
    # Atomic from the capacity check to the enqueue: no other submission may take the last
    # slot while this one awaits the store, so put_nowait cannot fail and a stored row is
    # always on its queue.
    async with st.submit_lock:
        queue = st.queues.get(key)
        if queue is None:
            queue = st.queues[key] = asyncio.Queue(st.settings.max_queue)
            st.workers.append(asyncio.create_task(_worker(st, key, queue)))
        if queue.full():
            raise QueueFull(
                detail=f"{queue.qsize()} probes wait for device {key}; retry later",
                headers={"Retry-After": str(st.settings.retry_after_s)},
            )
        probe_id = uuid.uuid4().hex
        now = time.time()
        stored = asyncio.ensure_future(
            asyncio.to_thread(
                st.store.create_probe, probe_id, msgspec.json.encode(probe).decode(), key, now
            )
        )
        try:
            await asyncio.shield(stored)
        except asyncio.CancelledError:
            # The client went away mid-write: a row that got stored still goes on its queue.
            with contextlib.suppress(BaseException):
                await stored
            if stored.done() and not stored.cancelled() and stored.exception() is None:
                queue.put_nowait(probe_id)
                observe.queued(probe_id, key, probe)
            raise
        except sqlite3.Error as exc:
            log.exception("probe %s could not be stored", probe_id)
            raise _storage_unavailable(st, f"the probe could not be stored: {exc}") from None
        queue.put_nowait(probe_id)
    observe.queued(probe_id, key, probe)
    row = await asyncio.to_thread(st.store.get_probe, probe_id)
    return Response(_resource(row), status_code=202, headers={"Location": f"/v1/probes/{probe_id}"})


def _storage_unavailable(st: AgentState, reason: str) -> StorageUnavailable:
    log.warning("refusing a probe: %s", reason)
    return StorageUnavailable(
        detail=f"the agent cannot record probes now: {reason}",
        headers={"Retry-After": str(st.settings.retry_after_s)},
    )


def _check_compatibility(probe: ProbeRequest) -> None:
    """The service's compatibility rules against the live GPU and driver (NVML only: no CUDA
    context); a failing rule refuses the probe, an NVML failure skips the check (logged)."""
    check = live_check(probe, nvml.inventory())
    if check.note is not None:
        log.info("%s", check.note)
    refused = check.refusal()
    if refused is not None:
        raise _unprocessable(*refused)


def _device_key(st: AgentState, probe: ProbeRequest) -> str:
    if not st.cuda:
        return "cpu"
    try:
        _, index = nvml.resolve_device(probe.device)
    except (KeyError, ValueError, LookupError) as exc:
        raise _unprocessable("$.device", str(exc)) from None
    return f"cuda:{index}"


@get("/v1/probes/{probe_id:str}", summary="A probe and its result")
async def get_probe(request: Request[Any, Any, Any], probe_id: FromPath[str]) -> ProbeResource:
    st = _state(request)
    row = await asyncio.to_thread(st.store.get_probe, probe_id)
    if row is None:
        raise NotFoundException(detail=f"no probe {probe_id!r}")
    return _with_unrecorded(st, _resource(row))


def _with_unrecorded(st: AgentState, resource: ProbeResource) -> ProbeResource:
    """A probe that failed when even its failure could not be stored shows as failed."""
    failed = st.unrecorded.get(resource.id)
    if failed is None or resource.status in TERMINAL_STATUSES:
        return resource
    return msgspec.structs.replace(resource, status="failed", updated_at=failed[0], error=failed[1])


@get("/v1/probes", summary="Probes, newest first, paged")
async def list_probes(
    request: Request[Any, Any, Any], limit: FromQuery[int] = 50, after: FromQuery[str | None] = None
) -> ProbePage:
    if not 1 <= limit <= 500:
        raise _unprocessable("$.limit", "must be in 1 .. 500")
    try:
        rows, nxt = await asyncio.to_thread(_state(request).store.list_probes, limit, after)
    except ValueError as exc:  # a cursor this agent did not issue
        raise _unprocessable("$.after", str(exc)) from None
    st = _state(request)
    return ProbePage(items=tuple(_with_unrecorded(st, _resource(r)) for r in rows), next=nxt)


@delete(
    "/v1/probes/{probe_id:str}",
    summary="Cancel a probe and delete its memory snapshot",
    status_code=202,
)
async def cancel(request: Request[Any, Any, Any], probe_id: FromPath[str]) -> ProbeResource:
    st = _state(request)
    row = await asyncio.to_thread(st.store.get_probe, probe_id)
    if row is None:
        raise NotFoundException(detail=f"no probe {probe_id!r}")
    if row.status == "queued":
        now = time.time()
        request_ = msgspec.json.decode(row.request, type=ProbeRequest)
        callback = _callback(
            st.settings,
            probe_id,
            request_.callback,
            "cancelled",
            now,
            row,
            None,
            "cancelled by request",
        )
        done = await asyncio.to_thread(
            st.store.finish_with_callback,
            probe_id,
            "cancelled",
            now,
            None,
            callback,
            "cancelled by request",
            expected={"queued"},
        )
        if done:
            observe.finished(st.metrics, probe_id, row.device_key, "cancelled")
        if done and callback is not None:
            st.deliverer.wake()
    elif row.status == "running" and probe_id in st.running:
        st.running[probe_id].cancel()
        for _ in range(200):  # the worker records the outcome once the child is gone
            await asyncio.sleep(0.05)
            row = await asyncio.to_thread(st.store.get_probe, probe_id)
            if row is not None and row.status in TERMINAL_STATUSES:
                break
    await drop_snapshot(st, probe_id)  # whatever the status: a private file goes with a DELETE
    row = await asyncio.to_thread(st.store.get_probe, probe_id)
    return _resource(row)
