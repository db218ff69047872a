"""``method: "trace"`` on POST /v1/budgets through a real trace pool: spawned worker processes
running the entry points of tests/support/trace_entries.py (and the real engine once), time limits,
the pending cap, worker crashes, the answer cache, single flight, 501 without the trace tier,
shutdown, settings and the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from importlib.util import find_spec
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from tests.support.trace_entries import CALLS_ENV, calls
from vrambudget.core.inventory import InvDims, ModelInventory
from vrambudget.http.cache import AnswerCache
from vrambudget.service import tracing
from vrambudget.service.app import Settings, SettingsError, create_app

LIMIT_S = 2.0

PROBLEMS = "https://vrambudget.dev/problems/"

TINY_MODEL = {
    "source": "dimensions",
    "hidden_size": 64,
    "num_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 256,
}


def body(name: str, **extra: object) -> dict[str, object]:
    workload = {
        "kind": "inference",
        "model": {"source": "preset", "id": "qwen2.5-0.5b"},
        "name": name,
        "prompt_tokens": 64,
        "generated_tokens": 8,
    }
    return {"method": "trace", "workloads": [workload], **extra}


@pytest.fixture(scope="module")
def calls_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "calls.txt"
    old = os.environ.get(CALLS_ENV)
    os.environ[CALLS_ENV] = str(path)  # inherited by the workers, spawned on the first trace
    yield path
    if old is None:
        os.environ.pop(CALLS_ENV, None)
    else:
        os.environ[CALLS_ENV] = old


@pytest.fixture(scope="module")
def client(calls_file):
    settings = Settings(
        trace_entry="tests.support.trace_entries:scripted",
        trace_workers=2,
        trace_time_limit_s=LIMIT_S,
        trace_max_pending=3,
        trace_cache_entries=64,
    )
    with TestClient(create_app(settings), timeout=60) as c:
        yield c


def post_many(client, bodies):
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: client.post("/v1/budgets", json=b), bodies))


def test_trace_answer_is_cached_by_canonical_request(client, calls_file):
    first = client.post("/v1/budgets", json=body("cache"))
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["method"] == "trace"
    assert "fixture: torch summed 3" in answer["warnings"]  # torch ran in the worker
    assert client.post("/v1/budgets", json=body("cache")).content == first.content
    # The same workload spelt differently: key order, whitespace, defaults written out.
    spelt = json.loads(json.dumps(body("cache")))
    spelt = {
        "trace": {"expandable_segments": False, "iterations": 2},
        "headroom": {"fraction": None, "min_bytes": 0},
        **dict(reversed(list(spelt.items()))),
    }
    raw = json.dumps(spelt, indent=3).encode()
    again = client.post("/v1/budgets", content=raw, headers={"content-type": "application/json"})
    assert again.content == first.content
    assert calls(calls_file, "cache") == ["cache"]  # one engine call for all three
    # Other trace options are another workload.
    other = client.post("/v1/budgets", json=body("cache", trace={"iterations": 3}))
    assert other.status_code == 200 and calls(calls_file, "cache") == ["cache"] * 2
    # Hits are answered without a worker (their speed is measured by bench/trace_speed.py).
    for _ in range(5):
        assert client.post("/v1/budgets", json=body("cache")).content == first.content
    assert calls(calls_file, "cache") == ["cache"] * 2


def test_identical_requests_in_flight_share_one_trace(client, calls_file):
    t = time.perf_counter()
    responses = post_many(client, [body("sleep:1:sf")] * 3)
    assert time.perf_counter() - t < 1 + LIMIT_S
    assert [r.status_code for r in responses] == [200] * 3
    assert len({r.content for r in responses}) == 1
    assert calls(calls_file, "sleep:1:sf") == ["sleep:1:sf"]


def test_time_limit_kills_the_trace_and_the_pool_recovers(client):
    t = time.perf_counter()
    r = client.post("/v1/budgets", json=body("sleep:30"))
    elapsed = time.perf_counter() - t
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["type"] == PROBLEMS + "trace-time-limit"
    assert "2 s limit" in problem["detail"]
    assert "VRAMBUDGET_TRACE_TIME_LIMIT_S" in problem["detail"]
    assert '"method": "analytic"' in problem["detail"]
    assert LIMIT_S <= elapsed < LIMIT_S + 1.5, elapsed
    after = client.post("/v1/budgets", json=body("after-timeout"))
    assert after.status_code == 200, after.text


def test_full_pool_answers_503_with_retry_after_and_never_blocks_the_loop(client):
    with ThreadPoolExecutor(1) as side:
        pending = side.submit(post_many, client, [body(f"sleep:1.5:busy-{i}") for i in range(3)])
        time.sleep(0.3)  # the three are running or waiting (cap: 3)
        t = time.perf_counter()
        assert client.get("/healthz").status_code == 200  # the loop is free meanwhile
        assert time.perf_counter() - t < 0.5  # (a blocked loop: > 1 s)
        refused = client.post("/v1/budgets", json=body("busy-3"))
        assert time.perf_counter() - t < 1.0
        # An analytic request whose model the framework must build (its inventory, in a trace
        # worker) is refused too, in words about the model's resolution.
        resolving = client.post("/v1/budgets", json=_analytic(MAMBA))
        # An identical request joins its trace in flight instead of being refused.
        joined = client.post("/v1/budgets", json=body("sleep:1.5:busy-0"))
        responses = pending.result()
    assert refused.status_code == 503, refused.text
    assert refused.json()["type"] == PROBLEMS + "trace-busy"
    assert 1 <= int(refused.headers["retry-after"]) <= LIMIT_S
    assert "VRAMBUDGET_TRACE_MAX_PENDING" in refused.json()["detail"]
    assert [r.status_code for r in responses] == [200] * 3
    assert joined.status_code == 200 and joined.content == responses[0].content
    assert resolving.status_code == 503, resolving.text
    problem = resolving.json()
    assert problem["type"] == PROBLEMS + "trace-busy"
    assert problem["title"] == "Model resolution busy"
    assert "model's inventory is built by the framework" in problem["detail"]
    assert "VRAMBUDGET_TRACE_MAX_PENDING" in problem["detail"]
    assert "analytic" not in problem["detail"]  # it was an analytic request
    assert 1 <= int(resolving.headers["retry-after"]) <= LIMIT_S


MAMBA = {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 256}


def _analytic(config: dict[str, object]) -> dict[str, object]:
    model = {"source": "hf_config", "config": config}
    return {"workloads": [{"kind": "inference", "model": model, "prompt_tokens": 16}]}


def _inventory() -> ModelInventory:
    dims = InvDims(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=4,
        head_dim=16,
        intermediate_size=128,
        vocab_size=256,
        max_positions=2048,
    )
    return ModelInventory(
        library="fixture",
        architecture="MambaForCausalLM",
        model_type="mamba",
        kind="decoder",
        tensors=(),
        stack=None,
        tied=(),
        dims=dims,
        cache=None,
    )


def test_inventories_share_one_flight_are_cached_and_leave_the_trace_stats_alone(monkeypatch):
    """A model's inventory job: concurrent requests for one config share it, a later one is
    a cache hit, and its duration is no trace's (no histogram sample, no Retry-After
    average); at the cap, it is refused as a model resolution."""
    from prometheus_client import REGISTRY

    pool = tracing.TracePool(
        entry="tests.support.trace_entries:scripted",
        workers=1,
        time_limit_s=30,
        max_pending=1,
        cache=AnswerCache(4),
    )
    encoded = msgspec.json.encode(_inventory())
    scheduled: list[Any] = []
    futures: list[Future[Any]] = []

    def schedule(fn: Any, args: tuple[Any, ...]) -> tuple[None, Future[Any]]:
        scheduled.append(fn)
        futures.append(Future())
        return None, futures[-1]

    monkeypatch.setattr(pool, "_schedule", schedule)

    def observed() -> float:
        labels = {"outcome": "ok"}
        return REGISTRY.get_sample_value("vrambudget_trace_duration_seconds_count", labels) or 0

    before = observed()

    async def run() -> None:
        first = asyncio.ensure_future(pool.inventory(MAMBA))
        second = asyncio.ensure_future(pool.inventory(dict(reversed(MAMBA.items()))))
        while not futures:
            await asyncio.sleep(0.01)
        # At the cap (1 job): another config is refused as a model resolution.
        with pytest.raises(tracing.TraceBusy) as busy:
            await pool.inventory({**MAMBA, "hidden_size": 128})
        assert busy.value.resolving and busy.value.retry_after_s == 5
        futures[0].set_result(("ok", encoded, 42.0))  # 42 s: would move the average
        assert await first == await second == _inventory()
        assert await pool.inventory(MAMBA) == _inventory()  # cached

    asyncio.run(run())
    assert scheduled == [tracing.run_inventory]
    assert observed() == before
    assert pool._retry_after_s() == 5  # no trace finished: the default, not the 42 s job


def test_worker_crash_is_503_and_the_next_trace_works(client):
    r = client.post("/v1/budgets", json=body("crash"))
    assert r.status_code == 503, r.text
    problem = r.json()
    assert problem["type"] == PROBLEMS + "trace-worker-died"
    assert "exit code 137" in problem["detail"]
    assert client.post("/v1/budgets", json=body("after-crash")).status_code == 200
    assert client.post("/v1/budgets", json=body("crash")).status_code == 503  # not cached
    assert client.post("/v1/budgets", json=body("after-crash-2")).status_code == 200


def test_workload_the_engine_rejects_is_the_analytic_422(client):
    r = client.post("/v1/budgets", json=body("invalid"))
    assert r.status_code == 422
    problem = r.json()
    assert problem["type"] == PROBLEMS + "invalid-workload"
    assert problem["errors"] == [
        {"field": "$.workloads[0].model", "message": "the fixture does not trace this model"}
    ]


def test_engine_bug_is_a_500_problem_and_the_pool_survives(client):
    r = client.post("/v1/budgets", json=body("boom"))
    assert r.status_code == 500
    assert "fixture engine bug" not in r.text  # no details leak
    assert client.post("/v1/budgets", json=body("after-boom")).status_code == 200


def test_analytic_requests_do_not_touch_the_pool(client):
    analytic = client.post("/v1/budgets", json=body("analytic", method="analytic"))
    assert analytic.status_code == 200 and analytic.json()["method"] == "analytic"


def test_trace_metrics(client):
    # twice: the first traces (ok), the second is answered from the cache (cached), whatever
    # other tests of the module ran before on this worker
    client.post("/v1/budgets", json=body("cache"))
    client.post("/v1/budgets", json=body("cache"))
    text = client.get("/metrics").text
    for outcome in tracing.OUTCOMES:
        assert f'vrambudget_trace_requests_total{{outcome="{outcome}"}}' in text
    value = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("vrambudget_trace_")
    }
    assert value['vrambudget_trace_requests_total{outcome="cached"}'] >= 1
    assert value['vrambudget_trace_duration_seconds_count{outcome="ok"}'] >= 1


def test_unimportable_entry_point_is_501_and_analytic_still_works():
    app = create_app(Settings(trace_entry="tests.no_such_module:trace"))
    with TestClient(app) as c:
        r = c.post("/v1/budgets", json=body("x"))
        assert r.status_code == 501
        problem = r.json()
        assert problem["type"] == PROBLEMS + "trace-unavailable"
        assert problem["detail"].startswith(
            "trace tier not installed: pip install 'vrambudget[trace]'"
        )
        assert c.post("/v1/budgets", json=body("x", method="analytic")).status_code == 200
        assert not app.state.trace_pool.started  # no worker was spawned


def test_missing_torch_is_501(monkeypatch):
    real = tracing.find_spec
    monkeypatch.setattr(tracing, "find_spec", lambda name: None if name == "torch" else real(name))
    with TestClient(create_app()) as c:
        r = c.post("/v1/budgets", json=body("x"))
    assert r.status_code == 501 and "'torch' not found" in r.json()["detail"]


def test_worker_side_load_failure_is_reported_not_raised():
    payload = msgspec.json.encode(msgspec.convert(body("x"), tracing.BudgetRequest))
    kind, reason = tracing.run_trace("tests.support.trace_entries:no_such_function", payload)
    assert kind == "unavailable" and "no function 'no_such_function'" in reason
    assert tracing.run_trace("tests.support.trace_entries:tiny", payload)[0] == "ok"


def test_shutdown_stops_the_workers(calls_file):
    app = create_app(Settings(trace_entry="tests.support.trace_entries:scripted"))
    with TestClient(app) as c:
        assert c.post("/v1/budgets", json=body("shutdown")).status_code == 200
        assert app.state.trace_pool.started
    pid = int(
        next(
            line for line in calls_file.read_text().splitlines() if line.endswith(" shutdown")
        ).split()[0]
    )
    assert pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not app.state.trace_pool.started
    with TestClient(app) as c:  # a lifespan can run again: traces work after a restart
        assert c.post("/v1/budgets", json=body("restarted")).status_code == 200


ENGINE = find_spec("torch") is not None and find_spec("vrambudget.trace.engine") is not None


@pytest.mark.skipif(not ENGINE, reason="the trace engine or torch is not installed")
def test_real_engine_end_to_end_and_cli():
    request = {
        "method": "trace",
        "workloads": [
            {"kind": "training", "model": TINY_MODEL, "micro_batch_size": 2, "sequence_length": 32}
        ],
    }
    with TestClient(create_app(Settings(trace_time_limit_s=60)), timeout=90) as c:
        r = c.post("/v1/budgets", json=request)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["method"] == "trace" and answer["trace"]["num_events"] > 0
        assert answer["total_bytes"] == answer["devices"][0]["total_bytes"]
        bad = {
            **request,
            "workloads": [{**request["workloads"][0], "parallelism": {"pipeline": 2}}],
        }
        r = c.post("/v1/budgets", json=bad)
        assert r.status_code == 422, r.text
        assert r.json()["type"] == PROBLEMS + "invalid-workload"
        assert r.json()["errors"][0]["field"] == "$.workloads[0].parallelism.pipeline"
    # The CLI runs the engine in-process: the same budget as the service.
    from vrambudget.cli.main import main

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({**request, "method": "analytic"}, f)
    out = io.StringIO()  # not capsys: Litestar's log handler would keep its stream (closed later)
    try:
        with contextlib.redirect_stdout(out):
            assert main(["estimate", "--file", f.name, "--method", "trace", "--json"]) == 0
    finally:
        os.unlink(f.name)
    assert json.loads(out.getvalue()) == answer


def test_cli_trace_table_and_missing_tier(monkeypatch, capsys):
    from vrambudget.cli.main import main

    monkeypatch.setenv("VRAMBUDGET_TRACE_ENTRY", "tests.support.trace_entries:tiny")
    assert (
        main(
            [
                "estimate",
                "--model",
                "qwen2.5-0.5b",
                "--prompt",
                "64",
                "--generate",
                "8",
                "--method",
                "trace",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "weights" in out and "fixture: torch summed 3" in out
    monkeypatch.setenv("VRAMBUDGET_TRACE_ENTRY", "tests.no_such_module:trace")
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--method", "trace"]) == 2
    assert "pip install 'vrambudget[trace]'" in capsys.readouterr().err
    assert main(["estimate", "--model", "qwen2.5-0.5b"]) == 0  # analytic is unaffected


@pytest.mark.parametrize(
    ("env", "value", "text"),
    [
        (
            "VRAMBUDGET_TRACE_WORKERS",
            "0",
            "VRAMBUDGET_TRACE_WORKERS (setting trace_workers) must be in 1 .. 256, got 0",
        ),
        (
            "VRAMBUDGET_TRACE_WORKERS",
            "two",
            "VRAMBUDGET_TRACE_WORKERS must be an integer, got 'two'",
        ),
        ("VRAMBUDGET_TRACE_TIME_LIMIT_S", "-1", "VRAMBUDGET_TRACE_TIME_LIMIT_S"),
        ("VRAMBUDGET_TRACE_TIME_LIMIT_S", "nan", "VRAMBUDGET_TRACE_TIME_LIMIT_S"),
        ("VRAMBUDGET_TRACE_TIME_LIMIT_S", "1m", "must be a number, got '1m'"),
        ("VRAMBUDGET_TRACE_MAX_PENDING", "0", "VRAMBUDGET_TRACE_MAX_PENDING"),
        ("VRAMBUDGET_TRACE_CACHE_ENTRIES", "-5", "VRAMBUDGET_TRACE_CACHE_ENTRIES"),
        ("VRAMBUDGET_TRACE_ENTRY", "vrambudget.trace.engine.trace_budget", "'module:function'"),
    ],
)
def test_bad_trace_settings_refuse_to_start(monkeypatch, capsys, env, value, text):
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as info:
        Settings.from_env()
    assert text in str(info.value)
    from vrambudget.cli.main import main

    assert main(["serve"]) == 2
    assert text in capsys.readouterr().err


def test_trace_settings_from_env(monkeypatch):
    for env, value in [
        ("VRAMBUDGET_TRACE_WORKERS", "3"),
        ("VRAMBUDGET_TRACE_TIME_LIMIT_S", "7.5"),
        ("VRAMBUDGET_TRACE_MAX_PENDING", "9"),
        ("VRAMBUDGET_TRACE_CACHE_ENTRIES", "0"),
        ("VRAMBUDGET_TRACE_ENTRY", "tests.support.trace_entries:tiny"),
    ]:
        monkeypatch.setenv(env, value)
    s = Settings.from_env()
    assert (
        s.trace_workers,
        s.trace_time_limit_s,
        s.trace_max_pending,
        s.trace_cache_entries,
        s.trace_entry,
    ) == (3, 7.5, 9, 0, "tests.support.trace_entries:tiny")


def test_idle_worker_killed_breaks_no_later_trace(client, calls_file):
    """pebble declares the whole pool broken when a worker dies with no task running (an OOM
    killer picking an idle worker); the next trace gets a new pool."""
    assert client.post("/v1/budgets", json=body("before-idle-kill")).status_code == 200
    pid = int(
        next(
            line
            for line in reversed(calls_file.read_text().splitlines())
            if line.endswith(" before-idle-kill")
        ).split()[0]
    )
    pool = client.app.state.trace_pool.pool
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)  # pebble's manager notices within its 0.1 s poll
    r = client.post("/v1/budgets", json=body("after-idle-kill"))
    assert r.status_code == 200, r.text
    assert client.app.state.trace_pool.pool is not pool  # a new pool took over
