"""The identity of an engine's process group, as the agent keeps it, and how the agent stops
what is left of a group from outside (``reap``): after a probe's child ended without stopping
its engine, and at startup for the probes an earlier agent process left running.

The engine runs under its supervisor (``supervise``), the leader of its own process group; the
probe's child tells the parent the group (``("engine_started", EngineGroup)``) right after it
started it, and the agent stores it in the probe's row. A pgid alone is not an identity (PIDs
are reused), so the group also records its leader's start time (``/proc/<pid>/stat`` field 22,
clock ticks since boot), the boot's id, and a random token that the supervisor and every
engine process carry in their environment (``VRAMBUDGET_ENGINE_GROUP``). ``reap`` signals

- the whole group (``killpg``) when its leader is alive with the recorded start time, and
- every process whose environment carries the token (group members whose leader is gone, and
  any that left the group),

and nothing else: after a reboot, or for a group that is gone, it signals nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import msgspec

__all__ = ["ENV", "EngineGroup", "boot_id", "members", "reap", "reap_stored", "start_time"]

ENV = "VRAMBUDGET_ENGINE_GROUP"
"""The environment variable carrying the group's token into every engine process."""


class EngineGroup(msgspec.Struct, frozen=True, kw_only=True):
    pgid: int
    """The supervisor's pid: the group's (and session's) id."""
    start_time: int | None
    """The leader's start time, clock ticks after boot (None: unreadable)."""
    boot_id: str | None
    token: str
    """Random hex in every engine process's environment (``VRAMBUDGET_ENGINE_GROUP``)."""
    devices: tuple[int, ...] = ()
    """NVML indices of the GPUs the engine was given (empty: none, a CPU host)."""


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` fields after the command (state first), or None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _carries(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _leader_alive(group: EngineGroup) -> bool:
    fields = _stat(group.pgid)
    return (
        fields is not None
        and fields[0] != b"Z"
        and group.start_time is not None
        and len(fields) > 19
        and int(fields[19]) == group.start_time
    )


def members(group: EngineGroup) -> list[int]:
    """The live processes of ``group``: in its process group while its leader is the recorded
    one, or carrying its token. Empty after a reboot."""
    if group.boot_id is not None and group.boot_id != boot_id():
        return []
    leader = _leader_alive(group)
    marker = f"{ENV}={group.token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        fields = _stat(pid)
        if fields is None or fields[0] == b"Z":
            continue
        if (leader and int(fields[2]) == group.pgid) or _carries(pid, marker):
            found.append(pid)
    return sorted(found)


def reap(group: EngineGroup) -> list[int]:
    """SIGKILL what is left of ``group`` (see the module's docstring); the pids signalled."""
    if group.boot_id is not None and group.boot_id != boot_id():
        return []
    found = members(group)
    if _leader_alive(group):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group.pgid, signal.SIGKILL)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return found


def reap_stored(group_json: str) -> list[int]:
    """:func:`reap` of a group stored as JSON (a probe row's); nothing for text that does not
    decode as one."""
    try:
        group = msgspec.json.decode(group_json, type=EngineGroup)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return []
    return reap(group)
