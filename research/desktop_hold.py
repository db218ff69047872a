"""What a desktop session holds on the GPU that drives it: the fit in
``vrambudget/core/data/desktop_hold.json`` of the readings in ``research/data/desktop_hold.json``.

Each reading is one person's ``nvidia-smi`` (or an engine's start-up line of free and total
memory) on a GPU that also drives a desktop, with nothing of theirs holding memory: the quote
and the page it comes from are kept with it. Per session kind (``windows``: the WDDM driver,
native, WSL2 and Docker Desktop; ``linux``: Xorg or a Wayland compositor) the fit keeps the
median (the hold an answer assumes) and the split-conformal band of the readings at 90%
(``research.calibrate_bands.conformal``: their extremes while they are fewer than 19, which
then cover a new desktop with the probability :func:`covered` says: 75% for seven).

No engine start-up log that this project checks (``research/engine_logs.py``) is among the
readings: those logs test the hold, they do not set it.

Run from the repository root:
    python -m research.desktop_hold          # write the file
    python -m research.desktop_hold --check  # fail if the file differs from a fresh fit
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from fractions import Fraction
from pathlib import Path

from research.calibrate_bands import COVERAGE, conformal
from research.committed import write_or_check

READINGS = Path(__file__).parent / "data" / "desktop_hold.json"
OUT = Path(__file__).parents[1] / "vrambudget" / "core" / "data" / "desktop_hold.json"
MiB = 1 << 20
SESSIONS = {
    "windows": ("windows", "wsl2", "docker_desktop"),
    "linux": ("linux_xorg", "linux_wayland", "linux_desktop"),
}
WHAT = {
    "windows": "a Windows desktop (the WDDM driver: native, WSL2 or Docker Desktop)",
    "linux": "a Linux desktop (Xorg or a Wayland compositor)",
}


def readings() -> list[dict[str, object]]:
    return list(json.loads(READINGS.read_text())["readings"])


def covered(n: int, coverage: float = COVERAGE) -> float:
    """What the band of ``n`` readings guarantees a new one (readings exchangeable): with the
    split-conformal ranks lo and hi (``research.calibrate_bands.conformal``, clamped to 1 .. n),
    (hi - lo) / (n + 1); ``coverage`` itself once n reaches 19. Seven readings at their
    extremes: 6 / 8 = 0.75."""
    a = Fraction(1) - Fraction(str(coverage))
    lo = max(math.floor((n + 1) * a / 2), 1)
    hi = min(math.ceil((n + 1) * (1 - a / 2)), n)
    return round(float(Fraction(hi - lo, n + 1)), 4)


def fit(rows: list[dict[str, object]] | None = None) -> dict[str, object]:
    rows = readings() if rows is None else rows
    sessions = {}
    for session, hosts in SESSIONS.items():
        mine = [r for r in rows if r["host"] in hosts]
        if not mine:
            continue
        used = [int(r["used_mib"]) * MiB for r in mine]  # type: ignore[call-overload]
        low, high = conformal([float(u) for u in used], COVERAGE)
        sessions[session] = {
            "measurements": len(mine),
            "sources": len({r["url"] for r in mine}),
            "typical_bytes": round(statistics.median(used)),
            "low_bytes": round(low),
            "high_bytes": round(high),
            "coverage": covered(len(used)),
            "what": WHAT[session],
        }
    return {
        "schema": "vrambudget.desktop_hold/1",
        "source": "research/data/desktop_hold.json; research/desktop_hold.py",
        "sessions": sessions,
    }


def main(argv: list[str]) -> int:
    text = json.dumps(fit(), indent=1) + "\n"
    return write_or_check(OUT, text, "--check" in argv, "python -m research.desktop_hold")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
