"""Private memory snapshots (``memory_snapshot: true``): where they live, how they are written,
capped and expired, and the CPU path's snapshot built from the trace recorder's events.

A snapshot is the pickle ``torch.cuda.memory._snapshot()`` returns (``segments`` and
``device_traces``), which https://pytorch.org/memory_viz and ``torch.cuda._memory_viz`` open.
It stays in ``<data_dir>/snapshots/<probe id>.pickle`` (directory 0700, file 0600), is served
only to token holders (``GET /v1/probes/{id}/snapshot``), never travels in a callback (the
result carries :class:`SnapshotInfo`, metadata only), and is deleted by ``DELETE``, at its
expiry (file time + the retention period), and, when over the size cap, before it is written.

Imported by the agent and by the probe child: no torch, no web framework.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from vrambudget.core.probe_report import SnapshotInfo
from vrambudget.trace.events import ALLOC, FREE

from .child import ChildSettings

__all__ = [
    "SNAPSHOT_FORMAT",
    "expire_snapshots",
    "keep_snapshot",
    "recorder_snapshot",
    "recorder_snapshot_fields",
    "remove_snapshot",
    "snapshot_dir",
    "snapshot_file",
    "snapshot_path",
    "write_snapshot",
]

SNAPSHOT_FORMAT = "torch.cuda.memory._snapshot pickle"
_ID = re.compile(r"^[0-9a-f]{32}$")
_SUFFIX = ".pickle"


def snapshot_dir(data_dir: Path) -> Path:
    return data_dir / "snapshots"


def _ensure_dir(data_dir: Path) -> Path:
    d = snapshot_dir(data_dir)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)  # mkdir's mode is masked by the umask, and an old directory may differ
    return d


def _path(data_dir: Path, probe_id: str) -> Path | None:
    """The snapshot file of a probe id the agent issues (uuid4 hex); None for anything else,
    so no request path reaches outside the directory."""
    if not _ID.match(probe_id):
        return None
    return snapshot_dir(data_dir) / f"{probe_id}{_SUFFIX}"


def snapshot_path(data_dir: Path, probe_id: str) -> str:
    """Where a probe's snapshot goes (``ChildSettings.snapshot_path``); creates the directory
    (0700)."""
    _ensure_dir(data_dir)
    path = _path(data_dir, probe_id)
    if path is None:
        raise ValueError(f"not a probe id: {probe_id!r}")
    return str(path)


def write_snapshot(
    snapshot: Mapping[str, Any], child: ChildSettings, trigger: Literal["measured", "oom"]
) -> tuple[SnapshotInfo | None, str | None]:
    """Pickle ``snapshot`` to ``child.snapshot_path``, created 0600 (written to a temporary
    name, then renamed: a reader never sees half a file). Over the cap it is not written at
    all. Returns (its metadata, None) or (None, why it is not kept)."""
    if child.snapshot_path is None:
        return None, "no snapshot path was given to the probe"
    data = pickle.dumps(dict(snapshot), protocol=pickle.HIGHEST_PROTOCOL)
    entries = sum(len(t) for t in snapshot.get("device_traces", ()))
    if len(data) > child.snapshot_max_bytes:
        return None, (
            f"the memory snapshot ({trigger}, {entries} entries) was {len(data)} bytes, over "
            f"the agent's cap of {child.snapshot_max_bytes} "
            "(VRAMBUDGET_AGENT_SNAPSHOT_MAX_BYTES): not kept"
        )
    path = child.snapshot_path
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    mtime = os.stat(path).st_mtime
    return (
        SnapshotInfo(
            bytes=len(data),
            entries=entries,
            trigger=trigger,
            format=SNAPSHOT_FORMAT,
            expires_at=mtime + child.snapshot_retention_s,
        ),
        None,
    )


def snapshot_file(data_dir: Path, probe_id: str, retention_s: float, now: float) -> Path | None:
    """The probe's snapshot file if it exists and has not expired (an expired one is deleted
    here, even before the periodic sweep gets to it)."""
    path = _path(data_dir, probe_id)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_mtime + retention_s <= now:
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return path


def remove_snapshot(data_dir: Path, probe_id: str) -> bool:
    """Delete a probe's snapshot (and a half-written one); whether a file was there."""
    path = _path(data_dir, probe_id)
    if path is None:
        return False
    removed = False
    for p in (path, path.with_name(path.name + ".tmp")):
        try:
            p.unlink()
            removed = True
        except FileNotFoundError:
            pass
    return removed


def expire_snapshots(data_dir: Path, retention_s: float, now: float | None = None) -> list[str]:
    """Delete the snapshots (and leftover temporary files) older than ``retention_s``; the
    names deleted."""
    now = time.time() if now is None else now
    d = snapshot_dir(data_dir)
    removed: list[str] = []
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            continue
        try:
            expired = entry.stat(follow_symlinks=False).st_mtime + retention_s <= now
            if expired:
                os.unlink(entry.path)
                removed.append(entry.name)
        except FileNotFoundError:
            continue
    return removed


# ---------------------------------------------------------------- the CPU path's snapshot --


def _frames(source: str | None) -> list[dict[str, Any]]:
    """The recorder's ``package/file.py:line function`` as one memory_viz frame."""
    if not source or source == "?":
        return []
    where, _, name = source.partition(" ")
    filename, _, line = where.rpartition(":")
    try:
        lineno = int(line)
    except ValueError:
        filename, lineno = where, 0
    return [{"filename": filename, "line": lineno, "name": name or "?"}]


def recorder_snapshot(
    events: Sequence[tuple[int, int, int, int]],
    addresses: Mapping[int, int],
    *,
    sources: Mapping[int, str] | None = None,
    tags: Mapping[int, str] | None = None,
    start: int = 0,
    max_entries: int | None = None,
    oom: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """A ``torch.cuda.memory._snapshot()``-shaped dict from the trace recorder's events on
    real CPU tensors (``Recorder(addresses=True)``): the history from ``events[start:]`` as
    ``alloc`` / ``free_requested`` / ``free_completed`` entries (stream 0, the allocation's
    source line as its frame, its component as ``category``), the newest ``max_entries`` of
    them (the CUDA recorder's ring buffer keeps the newest too), and the storages live at the
    end as segments of one active block each (a CPU allocation is its own ``malloc``).
    ``oom``: (requested bytes, bytes still free under the limit) adds an ``oom`` entry.
    Zero-byte storages are left out (they own no memory and share null addresses)."""
    sources = sources or {}
    tags = tags or {}
    sizes: dict[int, int] = {}
    live: dict[int, int] = {}
    trace: list[dict[str, Any]] = []
    for i, (kind, handle, nbytes, _phase) in enumerate(events):
        if kind == ALLOC:
            sizes[handle] = nbytes
            if nbytes == 0 or handle not in addresses:
                continue
            live[handle] = nbytes
            if i >= start:
                trace.append(
                    {
                        "action": "alloc",
                        "addr": addresses[handle],
                        "size": nbytes,
                        "stream": 0,
                        "frames": _frames(sources.get(handle)),
                        "category": tags.get(handle, "unknown"),
                    }
                )
        elif kind == FREE:
            size = live.pop(handle, 0)
            if size == 0 or i < start:
                continue
            for action in ("free_requested", "free_completed"):
                trace.append(
                    {
                        "action": action,
                        "addr": addresses[handle],
                        "size": size,
                        "stream": 0,
                        "frames": _frames(sources.get(handle)),
                    }
                )
    if oom is not None:
        trace.append(
            {"action": "oom", "size": oom[0], "device_free": oom[1], "stream": 0, "frames": []}
        )
    if max_entries is not None and len(trace) > max_entries:
        trace = trace[len(trace) - max_entries :]
    segments = []
    for handle, size in sorted(live.items(), key=lambda hs: addresses[hs[0]]):
        frames = _frames(sources.get(handle))
        segments.append(
            {
                "device": 0,
                "address": addresses[handle],
                "total_size": size,
                "allocated_size": size,
                "active_size": size,
                "requested_size": size,
                "stream": 0,
                "segment_type": "large" if size > (1 << 20) else "small",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": frames,
                "blocks": [
                    {
                        "address": addresses[handle],
                        "size": size,
                        "requested_size": size,
                        "state": "active_allocated",
                        "frames": frames,
                    }
                ],
            }
        )
    return {"segments": segments, "device_traces": [trace]}


def keep_snapshot(
    snapshot: Mapping[str, Any], child: ChildSettings, trigger: Literal["measured", "oom"]
) -> dict[str, Any]:
    """In the child: write the snapshot and return the result's ``snapshot`` /
    ``snapshot_error`` fields (empty when none was asked for). A snapshot that cannot be
    written (full disk) is an error on the result, never a failed probe."""
    if child.snapshot_path is None:
        return {}
    try:
        info, error = write_snapshot(snapshot, child, trigger)
    except (OSError, pickle.PicklingError) as exc:
        info, error = None, f"the memory snapshot could not be written: {exc}"
    return {"snapshot": info, "snapshot_error": error}


def recorder_snapshot_fields(
    recorder: Any, child: ChildSettings, start: int, trigger: Literal["measured", "oom"]
) -> dict[str, Any]:
    """The CPU path: the trace recorder's events since ``start`` (the warm-up) as a snapshot,
    kept like a CUDA one. On an out-of-memory of the tracker's limit, an ``oom`` entry with the
    allocation that crossed it."""
    if child.snapshot_path is None or getattr(recorder, "addresses", None) is None:
        return {}
    events = recorder.trace.events
    oom = None
    limit = recorder.limit_bytes
    if trigger == "oom" and limit is not None:
        last = next((e for e in reversed(events) if e[0] == ALLOC), None)
        if last is not None:  # the tracker raised right after recording it, at the peak
            oom = (last[2], max(0, limit - (recorder.peak_bytes - last[2])))
    snapshot = recorder_snapshot(
        events,
        recorder.addresses,
        sources=recorder.trace.sources,
        tags=recorder.trace.tags,
        start=start,
        max_entries=child.snapshot_max_entries,
        oom=oom,
    )
    return keep_snapshot(snapshot, child, trigger)
