"""The agent's side of private memory snapshots (``snapshots`` writes them in the child):
serving one to a token holder, deleting it with its probe, checking what the child left after
a run, and the periodic expiry."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import time
from typing import Any

import msgspec
from litestar import Request, get
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import File

from .settings import AgentSettings
from .snapshots import expire_snapshots, remove_snapshot, snapshot_file, snapshot_path
from .spec import ProbeRequest, ProbeResult
from .state import AgentState, _state
from .store import TERMINAL_STATUSES

__all__ = ["drop_snapshot", "expire_periodically", "get_snapshot", "settle_snapshot"]

log = logging.getLogger("vrambudget.agent.snapshots")

_SWEEP_S = 3600.0
"""How often expired snapshots are looked for (and at start)."""


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat(timespec="seconds")


def _missing(row: Any, now: float) -> str:
    """Why a probe has no snapshot to serve, in words."""
    request = msgspec.json.decode(row.request, type=ProbeRequest)
    if not request.memory_snapshot:
        return f"probe {row.id!r} did not ask for a memory snapshot (memory_snapshot: true)"
    if row.status not in TERMINAL_STATUSES:
        return f"probe {row.id!r} has no memory snapshot yet (status {row.status})"
    result = msgspec.json.decode(row.result, type=ProbeResult) if row.result else None
    if result is not None and result.snapshot_error:
        return f"probe {row.id!r} has no memory snapshot: {result.snapshot_error}"
    if result is not None and result.snapshot is not None and result.snapshot.expires_at <= now:
        return (
            f"the memory snapshot of probe {row.id!r} expired at "
            f"{_when(result.snapshot.expires_at)} and was deleted"
        )
    return f"probe {row.id!r} has no memory snapshot (status {row.status})"


@get(
    "/v1/probes/{probe_id:str}/snapshot",
    summary="A probe's private memory snapshot (torch.cuda.memory._snapshot pickle)",
    media_type="application/octet-stream",
)
async def get_snapshot(request: Request[Any, Any, Any], probe_id: FromPath[str]) -> File:
    st = _state(request)
    row = await asyncio.to_thread(st.store.get_probe, probe_id)
    if row is None:
        raise NotFoundException(detail=f"no probe {probe_id!r}")
    now = time.time()
    path = await asyncio.to_thread(
        snapshot_file, st.settings.data_dir, probe_id, st.settings.snapshot_retention_s, now
    )
    if path is None:
        raise NotFoundException(detail=_missing(row, now))
    return File(
        path=path,
        filename=f"{probe_id}.pickle",
        media_type="application/octet-stream",
        content_disposition_type="attachment",
    )


def _rewrite_result(st: AgentState, probe_id: str, error: str) -> None:
    """Take a deleted snapshot's metadata off the stored result (``snapshot_error`` says
    why)."""
    row = st.store.get_probe(probe_id)
    if row is None or row.result is None or row.status not in TERMINAL_STATUSES:
        return
    result = msgspec.json.decode(row.result, type=ProbeResult)
    if result.snapshot is None:
        return
    result = msgspec.structs.replace(result, snapshot=None, snapshot_error=error)
    st.store.transition(
        probe_id,
        row.status,
        time.time(),
        result_json=msgspec.json.encode(result).decode(),
        expected={row.status},
    )


async def drop_snapshot(st: AgentState, probe_id: str) -> None:
    """``DELETE /v1/probes/{id}``: the snapshot goes, whatever the probe's status."""
    removed = await asyncio.to_thread(remove_snapshot, st.settings.data_dir, probe_id)
    await asyncio.to_thread(_rewrite_result, st, probe_id, "deleted by request")
    if removed:
        log.info("probe %s: memory snapshot deleted by request", probe_id)


def settle_snapshot(settings: AgentSettings, probe_id: str, result_json: str | None) -> str | None:
    """After a run that asked for a snapshot: a file is kept only when the stored result
    describes it (a killed or failed child's leftovers go); a result without one says why.
    Returns the result JSON to store."""
    path = snapshot_path(settings.data_dir, probe_id)
    if result_json is None:
        remove_snapshot(settings.data_dir, probe_id)
        return None
    result = msgspec.json.decode(result_json, type=ProbeResult)
    error = result.snapshot_error
    if result.snapshot is not None:
        try:
            size = os.stat(path).st_size
        except OSError:
            size = None
        if size is not None and size <= settings.snapshot_max_bytes:
            return result_json
        error = (
            "the memory snapshot file is missing"
            if size is None
            else f"the memory snapshot was {size} bytes, over the agent's cap of "
            f"{settings.snapshot_max_bytes} (VRAMBUDGET_AGENT_SNAPSHOT_MAX_BYTES): deleted"
        )
    remove_snapshot(settings.data_dir, probe_id)
    if error is None:
        error = "this probe recorded no memory snapshot (no PyTorch allocator in its child)"
    result = msgspec.structs.replace(result, snapshot=None, snapshot_error=error)
    return msgspec.json.encode(result).decode()


async def expire_periodically(settings: AgentSettings) -> None:
    """Delete expired snapshots now and every hour (or every retention period, if shorter)."""
    interval = min(_SWEEP_S, settings.snapshot_retention_s)
    while True:
        with contextlib.suppress(OSError):
            removed = await asyncio.to_thread(
                expire_snapshots, settings.data_dir, settings.snapshot_retention_s
            )
            for name in removed:
                log.info("memory snapshot %s expired: deleted", name)
        await asyncio.sleep(interval)
