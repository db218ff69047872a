"""Issue 13 against a real ``vrambudget serve`` (uvicorn) on 127.0.0.1: /healthz answers in
< 50 ms while a heavy request computes; the heavy request ends at the deadline with a 422
naming the limit, never a hang; SIGTERM with a heavy request in flight exits within seconds."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx

from tests.service.test_compute import HEAVY_FIT
from tests.support.processes import Service, free_port


def _heavy(url: str, out: dict[str, Any]) -> None:
    start = time.perf_counter()
    try:
        r = httpx.post(f"{url}/v1/fits", json=HEAVY_FIT, timeout=60)
        out["status"], out["body"] = r.status_code, r.json()
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    out["seconds"] = time.perf_counter() - start


def test_healthz_stays_fast_while_a_heavy_request_runs_and_sigterm_exits() -> None:
    svc = Service(free_port(), VRAMBUDGET_COMPUTE_WORKERS="1", VRAMBUDGET_COMPUTE_TIME_LIMIT_S="3")
    svc.start()
    try:
        with httpx.Client(base_url=svc.url, timeout=5) as c:
            out: dict[str, Any] = {}
            heavy = threading.Thread(target=_heavy, args=(svc.url, out))
            heavy.start()
            time.sleep(0.8)  # the worker has started and is computing
            latencies = []
            for _ in range(20):
                t = time.perf_counter()
                assert c.get("/healthz").status_code == 200
                latencies.append(time.perf_counter() - t)
                time.sleep(0.05)
            assert heavy.is_alive(), out  # still computing while /healthz answered
            heavy.join(30)
            latencies.sort()
            assert latencies[-1] < 0.05, latencies
            assert out.get("status") == 422, out
            assert out["body"]["type"].endswith("/compute-time-limit")
            assert "VRAMBUDGET_COMPUTE_TIME_LIMIT_S" in out["body"]["detail"]
            assert out["seconds"] < 8, out["seconds"]  # the 3 s limit, not the ~7 s of work

            # SIGTERM while another heavy request computes: drained and gone within seconds
            out2: dict[str, Any] = {}
            heavy = threading.Thread(target=_heavy, args=(svc.url, out2))
            heavy.start()
            time.sleep(0.5)
        assert svc.process is not None
        t = time.perf_counter()
        svc.process.terminate()
        code = svc.process.wait(15)
        took = time.perf_counter() - t
        assert took < 10, took
        # uvicorn shuts down cleanly, then re-raises the signal it caught (exit status -15)
        assert code in (0, -signal.SIGTERM), code
        heavy.join(15)
        assert not heavy.is_alive()
    finally:
        svc.stop()
