"""The probe agent's HTTP API (Litestar): inventory, probes as operation resources, health,
metrics. Handlers are thin (``handlers``); the work happens in spawned children (``runner``,
driven per device by ``worker``), state lives in SQLite (``store``; the app's own in ``state``),
callbacks leave from a persistent outbox (``webhooks``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, Router, get
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Server
from litestar.plugins.prometheus import PrometheusConfig, PrometheusController
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from vrambudget.core.comparison import Comparison
from vrambudget.http.cors import CorsPolicy, with_cors
from vrambudget.http.docs_ui import SwaggerUI
from vrambudget.http.logs import RequestContext, logging_config
from vrambudget.http.problems import exception_handlers as problem_handlers

from . import nvml, observe
from .engine.group import reap_stored
from .handlers import (
    QueueFull,
    StorageUnavailable,
    cancel,
    device,
    get_probe,
    healthz,
    list_probes,
    readyz,
    submit,
)
from .openapi import agent_openapi_document
from .settings import AgentSettings
from .snapshot_routes import expire_periodically, get_snapshot
from .spec import ProbeRequest
from .startup import startup_line
from .state import AgentState, _callback
from .storage import storage_checker
from .store import Store
from .webhooks import Deliverer, Resolver

__all__ = ["SHUTDOWN_GRACE_S", "create_agent_app"]

SHUTDOWN_GRACE_S = 15.0
"""How long a graceful stop waits for the running probes' children to stop their engines."""
log = logging.getLogger("vrambudget.agent.api")

_HANDLERS = problem_handlers()


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


def create_agent_app(
    settings: AgentSettings | None = None,
    *,
    storage_check: Callable[[], str | None] | None = None,
    resolver: Resolver | None = None,
) -> Litestar:
    """The agent app. ``storage_check`` (why the data directory cannot take writes, or None;
    default: :func:`~vrambudget.agent.storage.storage_checker`) and ``resolver`` (host name ->
    addresses, for the SSRF check of callbacks and the service round trip; default: the system
    resolver) are seams for tests."""
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

        def reap_engine(group_json: str) -> None:
            """An engine an earlier agent process left running: stop what is left of it."""
            killed = reap_stored(group_json)
            if killed:
                log.warning("stopped %d leftover engine process(es): %s", len(killed), killed)

        recovered = store.recover(time.time(), callback_for=interrupted, reap_engine=reap_engine)

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
            concurrency=settings.delivery_concurrency,
            resolver=resolver,
        )
        deliverer.start()
        inv = await asyncio.to_thread(nvml.inventory)
        log.info("%s", startup_line(settings, inv))
        app.state.agent = AgentState(
            settings=settings,
            store=store,
            deliverer=deliverer,
            cuda=inv.available and bool(inv.gpus),
            storage_check=storage_check
            or storage_checker(settings.data_dir, settings.min_free_bytes),
            resolver=resolver,
        )
        for probe_id in recovered:
            observe.finished(
                app.state.agent.metrics,
                probe_id,
                "",
                "interrupted",
                error="the agent stopped while the probe was queued or running",
            )
        # Expired memory snapshots go now and every hour.
        app.state.agent.workers.append(asyncio.create_task(expire_periodically(settings)))

    async def shutdown(app: Litestar) -> None:
        """Cancel the running probes and wait (at most ``SHUTDOWN_GRACE_S``) until each child
        has stopped its engine and ended, killing what is left after that; then stop. The
        probes stay ``running`` in the store and become ``interrupted`` at the next start."""
        st: AgentState | None = getattr(app.state, "agent", None)
        if st is None:
            return
        running = list(st.running.values())
        for p in running:
            p.cancel()
        for task in st.workers:
            task.cancel()
        if st.workers:
            await asyncio.wait(st.workers, timeout=SHUTDOWN_GRACE_S)
        for p in running:  # past the grace: SIGKILL the children, reap their engines
            await asyncio.to_thread(p.kill)
        st.deliverer.stop()
        st.store.close()

    class Metrics(PrometheusController):
        path = "/metrics"

        @get()
        async def get(self, request: Request[Any, Any, Any]) -> Response[bytes]:
            """Litestar's request metrics (the process-wide registry), then this app's probe
            metrics (its own registry: ``observe``)."""
            st: AgentState = request.app.state.agent
            body = generate_latest(REGISTRY) + generate_latest(st.metrics.registry)
            return Response(body, media_type=CONTENT_TYPE_LATEST)

    prometheus = PrometheusConfig(app_name="vrambudget_agent", group_path=True)
    app = Litestar(
        route_handlers=[
            healthz,
            readyz,
            device,
            submit,
            get_probe,
            list_probes,
            cancel,
            get_snapshot,
            Metrics,
        ],
        openapi_config=OpenAPIConfig(
            title="vrambudget probe agent",
            version="0.1.0",
            description="Measures a workload on this host's GPU (or CPU) and compares it with the "
            "calculation service's estimate. All quantities are integer bytes.",
            servers=[Server(url="/")],
            # the documentation (the page, its assets, the document) is public: it is the
            # published openapi/agent.json; every operation it describes needs the token
            openapi_router=Router(
                path="/schema", route_handlers=[], opt={"public": True}, include_in_schema=False
            ),
            render_plugins=[SwaggerUI()],
        ),
        on_startup=[agent_openapi_document, startup],  # the served document is the published one
        on_shutdown=[shutdown],
        guards=[_bearer_guard],
        exception_handlers={
            QueueFull: _HANDLERS[HTTPException],
            StorageUnavailable: _HANDLERS[HTTPException],
            **_HANDLERS,
        },
        middleware=[RequestContext(), prometheus.middleware],
        logging_config=logging_config(),
        request_max_body_size=settings.max_body_bytes,
        debug=False,
    )
    return with_cors(app, _cors(settings))


def _cors(settings: AgentSettings) -> CorsPolicy | None:
    """CORS stays off unless ``VRAMBUDGET_AGENT_CORS_ORIGINS`` names origins: the agent is no
    public API (its callers are the host owner's tools, with a bearer token), so no page may
    call it unless its owner says which (docs/HTTP.md)."""
    if not settings.cors_origins:
        return None
    return CorsPolicy(
        origins=settings.cors_origins,
        methods=("GET", "POST", "DELETE"),
        request_headers=("accept", "authorization", "content-type", "x-request-id"),
        expose_headers=("Location", "Retry-After", "X-Request-ID", "X-Unsafe-Integers"),
        setting="VRAMBUDGET_AGENT_CORS_ORIGINS",
    )
