"""The engine's supervisor: a tiny process that leads the engine's process group and stops the
whole group -- the engine and every process it started -- when it is told to, or when the probe
child that started it dies in any way (SIGKILL included).

    python supervise.py PARENT_PID GRACE_S -- ENGINE ARGV...

Run as a script (standard library only, nothing of the package imported: it starts in
milliseconds and needs no ``sys.path``), with ``start_new_session`` so that it is the leader of a
new session and process group, which the engine inherits. It

- sets ``PR_SET_PDEATHSIG = SIGTERM`` on itself, then re-checks ``getppid()`` against
  ``PARENT_PID`` (a parent that died before the ``prctl`` never sends the signal);
- makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): the engine's orphaned workers are
  reparented to it, not to init, so it reaps them (their peak RSS reaches the probe's
  ``RUSAGE_CHILDREN``) and finds them even if they left the group;
- starts the engine and waits for: its stdin at EOF (the probe child's end of the pipe closed:
  it stopped the engine, or it died), SIGTERM (the probe child's stop, or its death through
  PDEATHSIG), or the engine's own exit;
- then, with SIGTERM ignored (the clean-up is not interruptible), sends SIGTERM to the group and
  to every descendant, waits up to ``GRACE_S`` for them to go, and ends with SIGKILL to the
  descendants and to the group, itself included.

When the engine exits on its own, the supervisor ends with the engine's status (its exit code,
or the same signal), after stopping what the engine left behind.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, state) of ``pid`` from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2]), fields[0].decode()


def _tree(me: int) -> set[int]:
    """Every live process in this group or descended from this process (not itself)."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is None or st[2] == "Z":
            continue
        parents[int(name)] = st[0]
        if st[1] == me:
            found.add(int(name))
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if pid not in found and (ppid == me or ppid in found):
                found.add(pid)
                grew = True
    found.discard(me)
    return found


_ENDED: dict[int, int] = {}
"""pid -> exit code (negative: the signal) of the children this process reaped."""


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            _ENDED[pid] = os.waitstatus_to_exitcode(status)


def _signal_all(me: int, sig: int) -> None:
    for pid in _tree(me):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(me: int, grace_s: float) -> None:
    """SIGTERM the group and the descendants, wait up to ``grace_s``, SIGKILL what is left and
    then the group, this process included (it does not return unless the group is empty)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(me, signal.SIGTERM)
    _signal_all(me, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if not _tree(me):
            return
        time.sleep(POLL_S)
    _signal_all(me, signal.SIGKILL)
    os.killpg(me, signal.SIGKILL)


def main(argv: list[str]) -> int:
    parent, grace_s, sep, *engine = argv
    if sep != "--" or not engine:
        print("usage: supervise.py PARENT_PID GRACE_S -- ARGV...", file=sys.stderr)
        return 2
    me = os.getpid()
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != int(parent):  # the probe child died before the prctl
        stopping = True
    pid = None
    if not stopping:
        try:
            pid = subprocess.Popen(engine, stdin=subprocess.DEVNULL).pid
        except OSError as exc:
            print(f"the engine could not be started: {exc}", file=sys.stderr, flush=True)
            return 127
    while not stopping and pid is not None:
        _reap()  # the engine, and orphaned workers that already ended
        if pid in _ENDED:
            break
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], POLL_S)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break  # EOF: the probe child let go, or died
    code = _ENDED.get(pid) if pid is not None else None  # set: the engine ended on its own
    stop(me, float(grace_s))
    if code is not None and code < 0:  # the engine died of a signal: so does the supervisor
        signal.signal(-code, signal.SIG_DFL)
        os.kill(me, -code)
    return code if code is not None else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
