"""The probe agent's HTTP API (Litestar): inventory, probes as operation resources, health,
metrics. Handlers are thin (``handlers``); the work happens in spawned children (``runner``,
driven per device by ``worker``), state lives in SQLite (``store``; the app's own in ``state``),
callbacks leave from a persistent outbox (``webhooks``).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

import msgspec
from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.plugins.prometheus import PrometheusConfig, PrometheusController

from vrambudget.core.comparison import Comparison
from vrambudget.http.problems import exception_handlers as problem_handlers

from . import nvml
from .handlers import QueueFull, cancel, device, get_probe, healthz, list_probes, submit
from .settings import AgentSettings
from .spec import ProbeRequest
from .state import AgentState, _callback
from .store import Store
from .webhooks import Deliverer

__all__ = ["create_agent_app"]

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
