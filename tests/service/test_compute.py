"""Issue 13, items 1-2 for the service: no request holds the event loop (analytic budgets,
fits and comparisons run in the compute pool, with a deadline and a bound on the answer), the
issue's heavy requests are refused by the schema in milliseconds, and the answer cache is
bounded by bytes and keyed by the canonical request."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from litestar.testing import TestClient

from tests.support import ROOT
from vrambudget.service.app import Settings, SettingsError, create_app
from vrambudget.service.compute import ComputeBusy, ComputePool


def _dims(layers: int) -> dict[str, Any]:
    return {
        "source": "dimensions",
        "hidden_size": 4096,
        "num_layers": layers,
        "num_attention_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
    }


H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}
HEAVY_FIT = {
    # in the schema's bounds, the slowest request found (~7 s of CPU here): a serving fit of a
    # 1,024-layer model on 64 devices at 16 device counts up to 1,024 -- the tests give it a
    # deadline of 1 .. 3 s
    "workloads": [{"kind": "llm_serving", "model": _dims(1024)}],
    "devices": [H100] * 64,
    "device_counts": [1, 2, 3, 4, 5, 6, 7, 8, 16, 64, 128, 256, 384, 512, 768, 1024],
    "max_device_count": 256,
}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(Settings(compute_workers=1))) as c:
        yield c


@pytest.mark.parametrize(
    ("body", "path", "field"),
    [
        # the issue's 229-byte body: 411 MB after 44 s
        (
            {
                "workloads": [
                    {
                        "kind": "training",
                        "model": _dims(1_000_000),
                        "parallelism": {"pipeline": 65536},
                    }
                ]
            },
            "/v1/budgets",
            "num_layers",
        ),
        (
            {
                "workloads": [
                    {"kind": "training", "model": _dims(1024), "parallelism": {"pipeline": 65536}}
                ]
            },
            "/v1/budgets",
            "pipeline",
        ),
        # 32 s
        (
            {"workloads": [{"kind": "llm_serving", "model": _dims(1_000_000)}], "device": H100},
            "/v1/budgets",
            "num_layers",
        ),
        # the 7-minute fit: device counts x devices x max_device_count
        ({**HEAVY_FIT, "max_device_count": 4096}, "/v1/fits", "max_device_count"),
        ({**HEAVY_FIT, "device_counts": [4096]}, "/v1/fits", "device_counts"),
        ({**HEAVY_FIT, "devices": [H100] * 65}, "/v1/fits", "devices"),
    ],
)
def test_the_issues_heavy_requests_are_refused_fast_naming_field_and_limit(
    client: TestClient, body: dict[str, Any], path: str, field: str
) -> None:
    start = time.perf_counter()
    r = client.post(path, json=body)
    assert time.perf_counter() - start < 2.0
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert field in r.text
    assert any(limit in r.text for limit in ("1024", "256", "64")), r.text


def test_a_request_past_the_deadline_is_stopped_with_422_naming_the_limit() -> None:
    app = create_app(Settings(compute_workers=1, compute_time_limit_s=1.0))
    with TestClient(app) as c:
        start = time.perf_counter()
        r = c.post("/v1/fits", json=HEAVY_FIT)
        took = time.perf_counter() - start
        assert r.status_code == 422, r.text
        assert r.json()["type"].endswith("/compute-time-limit")
        assert "VRAMBUDGET_COMPUTE_TIME_LIMIT_S" in r.text and "1 s" in r.text
        assert took < 6.0  # worker start + 1 s, never the ~7 s of work
        # the killed worker is replaced: the next request is answered
        ok = c.post("/v1/budgets", json={"workloads": [{"kind": "training", "model": _dims(8)}]})
        assert ok.status_code == 200, ok.text


def test_an_answer_larger_than_the_bound_is_refused_not_sent() -> None:
    body = {
        "workloads": [{"kind": "training", "model": _dims(1024), "parallelism": {"pipeline": 256}}]
    }
    with TestClient(create_app(Settings(compute_workers=1, max_answer_bytes=1 << 16))) as c:
        r = c.post("/v1/budgets", json=body)
        assert r.status_code == 422, r.text[:300]
        assert r.json()["type"].endswith("/answer-too-large")
        assert "VRAMBUDGET_MAX_ANSWER_BYTES" in r.text and "65536" in r.text
    with TestClient(create_app(Settings(compute_workers=1))) as c:  # default: answered
        r = c.post("/v1/budgets", json=body)
        assert r.status_code == 200 and len(r.content) < 4 << 20


def test_the_pool_refuses_beyond_max_pending_at_once() -> None:
    pool = ComputePool(workers=1, time_limit_s=5.0, max_pending=1, max_answer_bytes=1 << 20)
    payload = json.dumps(HEAVY_FIT).encode()

    async def go() -> None:
        first = asyncio.ensure_future(pool.run("fit", payload))
        await asyncio.sleep(0.05)
        with pytest.raises(ComputeBusy) as err:
            await pool.run("fit", payload)
        assert err.value.retry_after_s >= 1
        first.cancel()  # a client that went away frees its worker
        await asyncio.gather(first, return_exceptions=True)
        assert pool.pending == 0
        await pool.close()

    asyncio.run(go())


def test_the_event_loop_stays_free_while_a_heavy_request_computes() -> None:
    """In-process: /healthz is answered while the heavy fit computes in the pool."""
    import httpx

    app = create_app(Settings(compute_workers=1, compute_time_limit_s=3.0))

    async def go() -> tuple[list[float], int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            await c.post(
                "/v1/budgets", json={"workloads": [{"kind": "training", "model": _dims(8)}]}
            )
            heavy = asyncio.ensure_future(c.post("/v1/fits", json=HEAVY_FIT))
            await asyncio.sleep(0.3)
            latencies = []
            for _ in range(10):
                t = time.perf_counter()
                assert (await c.get("/healthz")).status_code == 200
                latencies.append(time.perf_counter() - t)
                await asyncio.sleep(0.05)
            assert not heavy.done()
            return latencies, (await heavy).status_code

    async def lifespan() -> tuple[list[float], int]:
        async with app.lifespan():  # type: ignore[attr-defined]
            return await go()

    try:
        latencies, status = asyncio.run(lifespan())
    except AttributeError:  # no app.lifespan(): run without it (state is set at creation)
        latencies, status = asyncio.run(go())
    # A loop blocked by the fit would hold every /healthz until the fit ended: the fit is still
    # running after 0.3 s + 10 x 0.05 s, so a blocked loop shows at least ~0.8 s on one call. The
    # bound leaves room for a shared, noisy machine (one 0.22 s outlier seen with 7 other
    # processes busy) without letting a blocked loop pass; the median shows the usual cost.
    assert max(latencies) < 0.5, latencies
    assert sorted(latencies)[len(latencies) // 2] < 0.05, latencies
    assert status == 422


def test_whitespace_padded_variants_share_one_cache_entry(client: TestClient) -> None:
    answers = client.app.state.answers
    body = {"workloads": [{"kind": "training", "model": _dims(12)}]}
    raw = json.dumps(body)
    before = len(answers)
    first = client.post("/v1/budgets", content=raw)
    for pad in (1, 1000, 100_000):
        r = client.post("/v1/budgets", content=" " * pad + raw + "\n" * pad)
        assert r.status_code == 200 and r.content == first.content
    r = client.post("/v1/budgets", content=json.dumps(dict(reversed(list(body.items())))))
    assert r.content == first.content
    assert len(answers) == before + 1
    assert answers.nbytes < 64 << 10  # one answer, not 100 kB bodies as keys


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("VRAMBUDGET_ANSWER_CACHE_ENTRIES", "lots"),
        ("VRAMBUDGET_ANSWER_CACHE_ENTRIES", "-1"),
        ("VRAMBUDGET_ANSWER_CACHE_BYTES", "64MiB"),
        ("VRAMBUDGET_COMPUTE_WORKERS", "0"),
        ("VRAMBUDGET_COMPUTE_TIME_LIMIT_S", "0"),
        ("VRAMBUDGET_MAX_ANSWER_BYTES", "12"),
    ],
)
def test_a_bad_setting_is_a_settings_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError, match=env):
        Settings.from_env()


def test_importing_the_app_never_reads_the_cache_setting() -> None:
    env = {**os.environ, "VRAMBUDGET_ANSWER_CACHE_ENTRIES": "lots", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", "import vrambudget.service.app"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    serve = subprocess.run(
        [sys.executable, "-m", "vrambudget.cli.main", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert serve.returncode == 2
    assert "VRAMBUDGET_ANSWER_CACHE_ENTRIES" in serve.stderr and "Traceback" not in serve.stderr
