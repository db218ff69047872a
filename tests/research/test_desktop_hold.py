"""The desktop sessions' holds (research/desktop_hold.py): the committed fit is the readings'
own, every reading can be checked by a reader, and none is a log the serving check tests."""

from __future__ import annotations

import json
import statistics

from research.desktop_hold import OUT, SESSIONS, fit, readings
from research.engine_logs import LOGS

MiB = 1 << 20


def test_committed_fit_is_a_fresh_fit() -> None:
    assert json.loads(OUT.read_text()) == fit()


def test_every_reading_has_its_quote_and_page() -> None:
    rows = readings()
    hosts = {h for hs in SESSIONS.values() for h in hs}
    for r in rows:
        assert r["host"] in hosts, r
        assert str(r["url"]).startswith("https://"), r
        quote = str(r["quote"]).replace(",", "")  # 2,556 MiB
        assert str(r["used_mib"]) in quote or r.get("derived"), r
        assert 0 < int(r["used_mib"]) < int(r["total_mib"]), r  # type: ignore[call-overload]


def test_no_reading_is_a_checked_engine_log() -> None:
    """The start-up logs research/engine_logs.py checks test the hold: none of them sets it."""
    checked = {e["url"].split("/blob/")[0] for e in json.loads(LOGS.read_text())["logs"]}
    for r in readings():
        assert str(r["url"]).split("/blob/")[0] not in checked, r


def test_the_median_and_band_by_hand() -> None:
    """The median of each session's readings, and the band at 90%: with n readings the
    split-conformal ranks floor((n + 1) 0.05) and ceil((n + 1) 0.95), clamped to 1 .. n."""
    fitted = fit()["sessions"]
    for session, hosts in SESSIONS.items():
        used = sorted(int(r["used_mib"]) for r in readings() if r["host"] in hosts)  # type: ignore[call-overload]
        f = fitted[session]  # type: ignore[index]
        n = len(used)
        assert f["measurements"] == n
        assert f["typical_bytes"] == round(statistics.median(used) * MiB)
        lo, hi = max((n + 1) * 5 // 100, 1), min(-(-(n + 1) * 95 // 100), n)
        assert (f["low_bytes"], f["high_bytes"]) == (used[lo - 1] * MiB, used[hi - 1] * MiB)
        assert f["coverage"] == round((hi - lo) / (n + 1), 4)  # 7 readings: 0.75


def test_coverage_of_a_band_of_few_readings() -> None:
    from research.desktop_hold import covered

    assert covered(7) == 0.75 and covered(5) == round(4 / 6, 4)
    assert covered(19) == 0.9  # ranks 1 and 19 of 19: 18 / 20
