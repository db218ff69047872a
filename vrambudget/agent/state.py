"""The agent's state (on ``app.state.agent``: settings, store, outbox, per-device queues and
workers, the running children) and a probe row's two outward forms: the resource the API
returns and the callback message the outbox sends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request

from vrambudget.core.comparison import Comparison
from vrambudget.core.result import Budget

from .observe import ProbeMetrics
from .overlap import ProbeGroup
from .settings import AgentSettings
from .spec import Callback, ProbeRequest, ProbeResource, ProbeResult
from .store import Store
from .webhooks import Deliverer, Resolver, callback_allowed

__all__ = ["AgentState"]


@dataclass
class AgentState:
    settings: AgentSettings
    store: Store
    deliverer: Deliverer
    queues: dict[str, asyncio.Queue[str]] = field(default_factory=dict)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    running: dict[str, ProbeGroup] = field(default_factory=dict)
    cuda: bool = False
    storage_check: Callable[[], str | None] = lambda: None
    """Why the data directory cannot take writes now (full, read-only), or None (``storage``)."""
    submit_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held from the queue-capacity check to the enqueue: submission is atomic."""
    unrecorded: dict[str, tuple[float, str]] = field(default_factory=dict)
    resolver: Resolver | None = None
    """Host name -> addresses for the SSRF checks (None: the system resolver)."""
    """Probes that failed and could not even be stored as failed: (when, why)."""
    metrics: ProbeMetrics = field(init=False)
    """The app's probe metrics (``observe``), in a registry of its own."""

    def __post_init__(self) -> None:
        self.metrics = ProbeMetrics(self.queues)


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
