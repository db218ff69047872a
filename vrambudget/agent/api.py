"""The probe agent's HTTP API (Litestar): inventory, probes as operation resources, health,
metrics. Handlers are thin; the work happens in spawned children (``runner``), state lives in
SQLite (``store``), callbacks leave from a persistent outbox (``webhooks``).
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, delete, get, post
from litestar.connection import ASGIConnection
from litestar.exceptions import (
    HTTPException,
    NotAuthorizedException,
    NotFoundException,
    ValidationException,
)
from litestar.handlers.base import BaseRouteHandler
from litestar.params import FromPath, FromQuery
from litestar.plugins.prometheus import PrometheusConfig, PrometheusController

from vrambudget.core.compare import COMPARABLE_STATUSES
from vrambudget.core.comparison import Comparison
from vrambudget.core.result import Budget
from vrambudget.http.body import decode_body
from vrambudget.http.problems import exception_handlers as problem_handlers

from . import nvml
from .nvml import HostInfo, NVMLInventory
from .roundtrip import comparison_entry, device_ref, fetch_estimate, local_software
from .runner import ProbeProcess
from .settings import AgentSettings
from .spec import Callback, CustomWorkload, ProbeRequest, ProbeResource, ProbeResult
from .store import TERMINAL_STATUSES, Store
from .webhooks import Deliverer, callback_allowed

__all__ = ["create_agent_app"]

_HANDLERS = problem_handlers()


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


class QueueFull(HTTPException):
    status_code = 429


@dataclass
class AgentState:
    settings: AgentSettings
    store: Store
    deliverer: Deliverer
    queues: dict[str, asyncio.Queue[str]] = field(default_factory=dict)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    running: dict[str, ProbeProcess] = field(default_factory=dict)
    cuda: bool = False


def _resource(row: Any) -> ProbeResource:
    return ProbeResource(
        id=row.id,
        status=row.status,
        created_at=row.created_at,
        updated_at=row.updated_at,
        request=msgspec.json.decode(row.request, type=ProbeRequest),
        result=msgspec.json.decode(row.result, type=ProbeResult) if row.result else None,
        error=row.error,
        estimate=msgspec.json.decode(row.estimate, type=Budget) if row.estimate else None,
        estimate_error=row.estimate_error,
        comparison=msgspec.json.decode(row.comparison, type=Comparison) if row.comparison else None,
        comparison_error=row.comparison_error,
    )


def _state(request: Request[Any, Any, Any]) -> AgentState:
    state: AgentState = request.app.state.agent
    return state


def _unprocessable(field_path: str, message: str) -> ValidationException:
    return ValidationException(
        detail="invalid request", extra=[{"message": f"{message} - at `{field_path}`"}]
    )


# -------------------------------------------------------------------------------- handlers --


@get("/healthz", summary="Liveness (no authentication)", opt={"public": True})
async def healthz() -> Health:
    return Health()


@get("/v1/device", summary="The host's GPUs (NVML) and CPU/RAM")
async def device(request: Request[Any, Any, Any]) -> DeviceReport:
    inv = await asyncio.to_thread(nvml.inventory)
    host = await asyncio.to_thread(nvml.host_info)
    return DeviceReport(nvml=inv, host=host, probe_device="cuda" if _state(request).cuda else "cpu")


@post("/v1/probes", summary="Submit a probe", status_code=202)
async def submit(request: Request[Any, Any, Any]) -> Response[ProbeResource]:
    st = _state(request)
    body = await request.body()
    if len(body) > st.settings.max_body_bytes:
        raise HTTPException(
            status_code=413, detail=f"request body over {st.settings.max_body_bytes} bytes"
        )
    probe = decode_body(body, ProbeRequest)
    if isinstance(probe.workload, CustomWorkload) and (
        probe.workload.entry_point not in st.settings.entry_points
    ):
        names = ", ".join(sorted(st.settings.entry_points)) or "none are configured"
        raise _unprocessable(
            "$.workload.entry_point",
            f"unknown entry point {probe.workload.entry_point!r}; allowed: {names}",
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
    if probe.time_limit_s > st.settings.max_time_limit_s:
        raise _unprocessable(
            "$.time_limit_s", f"must be <= {st.settings.max_time_limit_s:g} (the agent's limit)"
        )
    key = await asyncio.to_thread(_device_key, st, probe)
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
    await asyncio.to_thread(
        st.store.create_probe, probe_id, msgspec.json.encode(probe).decode(), key, now
    )
    queue.put_nowait(probe_id)
    row = await asyncio.to_thread(st.store.get_probe, probe_id)
    return Response(_resource(row), status_code=202, headers={"Location": f"/v1/probes/{probe_id}"})


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
    row = await asyncio.to_thread(_state(request).store.get_probe, probe_id)
    if row is None:
        raise NotFoundException(detail=f"no probe {probe_id!r}")
    return _resource(row)


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
    return ProbePage(items=tuple(_resource(r) for r in rows), next=nxt)


@delete("/v1/probes/{probe_id:str}", summary="Cancel a probe", status_code=202)
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
        if done and callback is not None:
            st.deliverer.wake()
    elif row.status == "running" and probe_id in st.running:
        st.running[probe_id].cancel()
        for _ in range(200):  # the worker records the outcome once the child is gone
            await asyncio.sleep(0.05)
            row = await asyncio.to_thread(st.store.get_probe, probe_id)
            if row is not None and row.status in TERMINAL_STATUSES:
                break
    row = await asyncio.to_thread(st.store.get_probe, probe_id)
    return _resource(row)


# ---------------------------------------------------------------------------------- worker --


async def _worker(st: AgentState, key: str, queue: asyncio.Queue[str]) -> None:
    """One probe at a time per device."""
    while True:
        probe_id = await queue.get()
        try:
            await _run_one(st, probe_id)
        finally:
            queue.task_done()


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
        dict(st.settings.entry_points),
        request.time_limit_s,
        _sampler_factory(st, row.device_key),
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
            )
            await asyncio.to_thread(store.set_estimate, probe_id, estimate_json, estimate_error)
        await asyncio.to_thread(process.start)
        outcome = await asyncio.to_thread(process.wait)
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


def _callback(
    settings: AgentSettings,
    probe_id: str,
    cb: Callback | None,
    status: str,
    now: float,
    row: Any,
    result_json: str | None,
    error: str | None,
) -> tuple[str, str, str] | None:
    if cb is None or not callback_allowed(cb.url, settings.callback_allow_list):
        return None
    resource = msgspec.structs.replace(
        _resource(row),
        status=status,
        updated_at=now,
        result=msgspec.json.decode(result_json, type=ProbeResult) if result_json else None,
        error=error,
    )
    payload = msgspec.json.encode(
        {"type": f"probe.{status}", "timestamp": now, "data": resource}
    ).decode()
    # One message per probe: its id is the idempotency key receivers deduplicate on.
    return cb.url, payload, f"msg_{probe_id}"


# ------------------------------------------------------------------------------------ auth --


def _bearer_guard(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    if handler.opt.get("public"):
        return
    tokens: tuple[bytes, ...] = connection.app.state.agent.settings.tokens
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    given = token.strip().encode()
    ok = False
    for t in tokens:  # every token compared, in constant time each
        ok |= hmac.compare_digest(given, t)
    if scheme.lower() != "bearer" or not given or not ok:
        raise NotAuthorizedException(
            detail="a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"}
        )


# ----------------------------------------------------------------------------------- app ----


def create_agent_app(settings: AgentSettings | None = None) -> Litestar:
    settings = settings or AgentSettings.from_env()

    async def startup(app: Litestar) -> None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        store = Store(settings.data_dir / "agent.sqlite3")

        def interrupted(row: Any) -> tuple[str, str, str] | None:
            request_ = msgspec.json.decode(row.request, type=ProbeRequest)
            return _callback(
                settings,
                row.id,
                request_.callback,
                "interrupted",
                row.updated_at,
                row,
                None,
                row.error,
            )

        store.recover(time.time(), callback_for=interrupted)

        def compared(ob: Any, body: str | None, error: str | None) -> None:
            """The service answered the comparison (or it was given up): store it and send
            the probe's callback, carrying it, in one transaction."""
            comparison_json = None
            if body is not None:
                try:  # store only what decodes as a comparison
                    comparison_json = msgspec.json.encode(
                        msgspec.json.decode(body, type=Comparison)
                    ).decode()
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    error = f"the service's answer is not a comparison: {exc}"

            def callback_for(probe: Any) -> tuple[str, str, str] | None:
                request_ = msgspec.json.decode(probe.request, type=ProbeRequest)
                return _callback(
                    settings,
                    probe.id,
                    request_.callback,
                    probe.status,
                    time.time(),
                    probe,
                    probe.result,
                    probe.error,
                )

            store.complete_comparison(ob.id, time.time(), comparison_json, error, callback_for)

        deliverer = Deliverer(
            store,
            settings.webhook_secret,
            settings.callback_allow_list,
            service_allow_list=settings.service_allow_list,
            on_comparison=compared,
        )
        deliverer.start()
        inv = await asyncio.to_thread(nvml.inventory)
        app.state.agent = AgentState(
            settings=settings,
            store=store,
            deliverer=deliverer,
            cuda=inv.available and bool(inv.gpus),
        )

    async def shutdown(app: Litestar) -> None:
        st: AgentState | None = getattr(app.state, "agent", None)
        if st is None:
            return
        for p in list(st.running.values()):
            p.cancel()
        for task in st.workers:
            task.cancel()
        st.deliverer.stop()
        st.store.close()

    class Metrics(PrometheusController):
        path = "/metrics"

    prometheus = PrometheusConfig(app_name="vrambudget_agent", group_path=True)
    return Litestar(
        route_handlers=[healthz, device, submit, get_probe, list_probes, cancel, Metrics],
        on_startup=[startup],
        on_shutdown=[shutdown],
        guards=[_bearer_guard],
        exception_handlers={QueueFull: _HANDLERS[HTTPException], **_HANDLERS},
        middleware=[prometheus.middleware],
        request_max_body_size=settings.max_body_bytes,
        debug=False,
    )
