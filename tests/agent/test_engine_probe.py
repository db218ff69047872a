"""Engine probes in the child, against the fake engine (tests/support/fake_engine.py) on
127.0.0.1: the command built from the recipe (and nothing else), the launcher settings, the
refusals at submission, a full start-load-stop for each engine style, a failing engine, a
hanging one, and a terminated child that takes its engine with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support import ROOT
from tests.support.fake_engine import expected_startup, startup_lines
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.engine.command import CommandError, engine_command, recipe_env
from vrambudget.agent.engine.group import EngineGroup
from vrambudget.agent.engine.launchers import parse_engines
from vrambudget.agent.engine.logs import parse_startup
from vrambudget.agent.engine.recipe import EngineRefused, plan
from vrambudget.agent.engine.run import EngineTerminated, _terminated_raises, measure_engine
from vrambudget.agent.limits import WorkloadRefused, validate_workload
from vrambudget.agent.settings import AgentSettings, AgentSettingsError
from vrambudget.core.probe_report import ProbeRequest
from vrambudget.core.serving.releases import engine_release

FAKE = str(ROOT / "tests" / "support" / "fake_engine.py")
LAUNCHER = (sys.executable, FAKE)
ENGINES = {"vllm": LAUNCHER, "sglang": LAUNCHER, "llama_cpp": LAUNCHER}
GGUF = "qwen2.5-0.5b-Q4_K_M.gguf"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        # gone; a process that exits between the open and the read raises ESRCH
        return False
    return state != "Z"  # a zombie waiting for its reaper is gone


def alive(pid: int, grace_s: float = 2.0) -> bool:
    """Still running ``grace_s`` after the question (a SIGKILL takes a moment to land)."""
    deadline = time.monotonic() + grace_s
    while _running(pid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)
    return False


def request(engine: str = "vllm", load: dict[str, Any] | None = None, **extra: Any) -> ProbeRequest:
    w: dict[str, Any] = {
        "kind": "llm_serving",
        "engine": engine,
        "model": {"source": "preset", "id": "qwen2.5-0.5b"},
    }
    if engine in ("llama_cpp", "ollama"):
        w["gguf"] = {"n_ctx": 512}
    else:
        w["max_model_len"] = 512
    body = {
        "workload": w,
        "recipe_gpu": "l4-24gb",
        "engine": load
        or {"concurrency": 4, "requests": 12, "warmup_requests": 1, "output_tokens": 16},
        **extra,
    }
    return msgspec.convert(body, ProbeRequest)


@pytest.fixture
def gguf_dir(tmp_path: Path) -> Path:
    d = tmp_path / "gguf"
    d.mkdir()
    (d / GGUF).write_bytes(b"GGUF")
    return d


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(path))
    return path


# ------------------------------------------------------------------------------ command --


def test_vllm_recipe_becomes_the_launcher_and_the_recipe_with_an_address() -> None:
    argv = engine_command(
        "vllm",
        "vllm serve qwen2.5-0.5b --tensor-parallel-size 1 --max-model-len 512",
        ("/opt/vllm/bin/vllm",),
        "Qwen/Qwen2.5-0.5B",
        8123,
    )
    assert argv == [
        "/opt/vllm/bin/vllm", "serve", "Qwen/Qwen2.5-0.5B", "--tensor-parallel-size", "1",
        "--max-model-len", "512", "--host", "127.0.0.1", "--port", "8123",
    ]  # fmt: skip


def test_a_recipe_sets_only_the_environment_the_budget_assumed() -> None:
    """``flashinfer_sampler`` puts ``VLLM_USE_FLASHINFER_SAMPLER`` before the program: the
    engine runs with it in its environment, and the argv is the rest of the recipe."""
    launch = "VLLM_USE_FLASHINFER_SAMPLER=1 vllm serve qwen2.5-0.5b --max-model-len 512"
    assert recipe_env(launch) == {"VLLM_USE_FLASHINFER_SAMPLER": "1"}
    assert engine_command("vllm", launch, ("/opt/vllm/bin/vllm",), "Qwen/Qwen2.5-0.5B", 1)[:3] == [
        "/opt/vllm/bin/vllm",
        "serve",
        "Qwen/Qwen2.5-0.5B",
    ]
    assert recipe_env("vllm serve m --max-model-len 512") == {}


def test_sglang_and_llama_cpp_recipes(tmp_path: Path) -> None:
    sgl = engine_command(
        "sglang",
        "python -m sglang.launch_server --model-path qwen2.5-0.5b --tp 1 --context-length 512",
        ("/opt/sgl/bin/python", "-m", "sglang.launch_server"),
        "/models/Qwen/Qwen2.5-0.5B",
        9000,
    )
    assert sgl == [
        "/opt/sgl/bin/python", "-m", "sglang.launch_server", "--model-path",
        "/models/Qwen/Qwen2.5-0.5B", "--tp", "1", "--context-length", "512", "--host",
        "127.0.0.1", "--port", "9000", "--enable-metrics",
    ]  # fmt: skip
    llama = engine_command(
        "llama_cpp",
        f"llama-server -m {GGUF} -c 512 -np -1 -ngl 25 -fa on --fit off",
        ("/usr/local/bin/llama-server",),
        "ignored",
        9001,
        str(tmp_path),
    )
    assert llama == [
        "/usr/local/bin/llama-server", "-m", str((tmp_path / GGUF).resolve()), "-c", "512",
        "-np", "-1", "-ngl", "25", "-fa", "on", "--fit", "off", "--host", "127.0.0.1",
        "--port", "9001",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "launch", "why"),
    [
        ("vllm", "vllm serve m --max-model-len 512; rm -rf /", "not allowed"),
        ("vllm", "vllm serve m '--trust-remote-code x'", "not allowed"),
        ("vllm", "vllm serve m --port 80", "address"),
        ("vllm", "python -m vllm serve m", "does not start with"),
        ("vllm", "vllm serve --trust-remote-code", "not a 'vllm serve MODEL'"),
        ("vllm", "vllm serve m --Weird", "not a flag"),
        ("sglang", "python -m sglang.launch_server --tp 1", "names no single model"),
        ("llama_cpp", "llama-server -m ../../etc/passwd", "outside the GGUF directory"),
        ("vllm", "LD_PRELOAD=/x.so vllm serve m", "may not set"),
        ("vllm", "VLLM_USE_FLASHINFER_SAMPLER=yes vllm serve m", "may not set"),
    ],
)
def test_a_recipe_that_carries_more_is_refused(
    engine: str, launch: str, why: str, tmp_path: Path
) -> None:
    with pytest.raises(CommandError, match=why):
        engine_command(engine, launch, ("/bin/x",), "repo/model", 1, str(tmp_path))


def _hub_request(label: str) -> ProbeRequest:
    return msgspec.convert(
        {
            "workload": {
                "kind": "llm_serving",
                "model": {"source": "hub", "id": "a/b", "name": label},
                "max_model_len": 512,
            },
            "recipe_gpu": "l4-24gb",
        },
        ProbeRequest,
    )


def test_a_model_label_cannot_smuggle_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request has no command field; the one spec word that reaches the recipe is the
    model, and it is replaced by what the host loads: a `hub` model's checkpoint directory on
    this host (its free-text label appears nowhere in the command), else refused before any
    command is made; a preset id that is not in the catalog does not decode."""
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(EngineRefused) as err:
        plan(_hub_request("x --trust-remote-code"), ENGINES, None)
    assert (
        err.value.field == "$.workload.model" and "no checkpoint on this host" in err.value.message
    )
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=1024,
    )
    directory = tmp_path / "models" / "a" / "b"
    transformers.LlamaForCausalLM(cfg).save_pretrained(directory)
    recipe = plan(
        _hub_request("x --trust-remote-code"), ENGINES, None, model_dirs=(str(tmp_path / "models"),)
    )
    assert recipe.model == str(directory)
    argv = engine_command("vllm", recipe.launch, LAUNCHER, recipe.model, 8000)
    assert str(directory) in argv
    assert not any("trust-remote-code" in word for word in argv)
    # The estimate is of the host's own checkpoint: its vocabulary, not a preset's.
    assert recipe.vocab_size == 256
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(
            {
                "workload": {
                    "kind": "llm_serving",
                    "model": {"source": "preset", "id": "qwen2.5-0.5b --enforce-eager"},
                },
            },
            ProbeRequest,
        )
    assert "engine_command" not in ProbeRequest.__struct_fields__
    assert "command" not in ProbeRequest.__struct_fields__


# ----------------------------------------------------------------------------- settings --


def test_launchers_from_the_environment(tmp_path: Path) -> None:
    raw = json.dumps({"vllm": [sys.executable, FAKE], "llama_cpp": [sys.executable]})
    s = AgentSettings.from_env(
        {"VRAMBUDGET_AGENT_ENGINES": raw, "VRAMBUDGET_AGENT_GGUF_DIR": str(tmp_path)}
    )
    assert s.engines == {"vllm": (sys.executable, FAKE), "llama_cpp": (sys.executable,)}
    assert s.gguf_dir == tmp_path
    assert parse_engines(None) == {} == parse_engines("  ")


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("{", "not JSON"),
        ('["/bin/x"]', "JSON object"),
        ('{"ollama": ["/bin/ollama"]}', "ollama is not supported"),
        ('{"tgi": ["/bin/x"]}', "unknown engine 'tgi'"),
        ('{"vllm": []}', "non-empty list"),
        ('{"vllm": ["vllm"]}', "not an absolute path"),
        ('{"vllm": ["/nonexistent/vllm"]}', "not an executable file"),
    ],
)
def test_a_malformed_launcher_setting_names_the_variable(raw: str, why: str) -> None:
    with pytest.raises(AgentSettingsError, match=f"^VRAMBUDGET_AGENT_ENGINES: .*{why}"):
        AgentSettings.from_env({"VRAMBUDGET_AGENT_ENGINES": raw})
    with pytest.raises(AgentSettingsError, match=r"^VRAMBUDGET_AGENT_GGUF_DIR: "):
        AgentSettings.from_env({"VRAMBUDGET_AGENT_GGUF_DIR": "/nonexistent/gguf"})


# ------------------------------------------------------------------------- submission --


def _refused(settings: AgentSettings, req: ProbeRequest, *, cpu: bool = True) -> WorkloadRefused:
    with pytest.raises(WorkloadRefused) as err:
        validate_workload(settings, req, cpu=cpu)
    return err.value


def test_submission_refusals_name_the_field(gguf_dir: Path) -> None:
    some = AgentSettings(engines={"sglang": LAUNCHER}, gguf_dir=gguf_dir)
    e = _refused(some, request("vllm"))
    assert e.field == "$.workload.engine" and "configured: sglang" in e.message
    e = _refused(AgentSettings(engines=ENGINES), request("ollama"))
    assert e.field == "$.workload.engine" and "ollama is not supported" in e.message
    full = AgentSettings(engines=ENGINES, gguf_dir=gguf_dir)
    e = _refused(full, request("vllm", recipe_gpu=None))
    assert e.field == "$.recipe_gpu" and "no NVML" in e.message
    e = _refused(full, request("vllm", recipe_gpu="no-such-gpu"))
    assert e.field == "$.recipe_gpu"
    long = request("vllm", {"prompt_tokens": 500, "output_tokens": 16})
    e = _refused(full, long)
    assert e.field == "$.engine.prompt_tokens" and "(516)" in e.message
    e = _refused(AgentSettings(engines=ENGINES), request("llama_cpp"))
    assert e.field == "$.workload.engine" and "VRAMBUDGET_AGENT_GGUF_DIR" in e.message
    (gguf_dir / GGUF).unlink()
    e = _refused(full, request("llama_cpp"))
    assert e.field == "$.workload.model" and GGUF in e.message
    validate_workload(full, request("vllm"), cpu=True)  # the good one passes


# ---------------------------------------------------------------------------- the probe --


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama_cpp"])
def test_an_engine_probe_starts_loads_reports_and_stops(
    engine: str, gguf_dir: Path, record: Path
) -> None:
    notes: list[tuple[str, Any]] = []
    child = ChildSettings(engines=ENGINES, gguf_dir=str(gguf_dir))
    status, result, error = measure_engine(request(engine), child, notes.append)
    assert (status, error) == ("succeeded", None)
    assert result is not None and result.torch is None and result.device == "cpu"
    e = result.engine
    assert e is not None and e.started and e.exit_code is None and e.startup_s is not None
    assert e.command[:2] == LAUNCHER and "127.0.0.1" in e.command
    rec = json.loads(record.read_text())
    assert e.command[2:] == tuple(rec["argv"])  # what ran is what is reported
    # the startup figures, as the fake printed them for these arguments
    want = expected_startup(rec["argv"], dict(os.environ))
    assert e.startup.kv_cache_tokens == want["kv_cache_tokens"] == 8 * 512
    assert e.startup.max_concurrency == want["max_concurrency"]
    assert e.startup == parse_startup(engine, startup_lines(rec["argv"], {}, rec["pid"]))
    assert e.expected is not None and e.expected.kv_cache_tokens > 0
    assert e.expected.kv_cache_tokens_error == pytest.approx(
        (4096 - e.expected.kv_cache_tokens) / 4096
    )
    # the load: exact lengths, the requested concurrency, every request answered
    assert rec["prompt_lengths"] == [512 - 16] == [e.prompt_tokens]
    assert rec["requests"] == 12 + 1 and e.requests == 12 and e.errors == 0
    assert rec["max_in_flight"] == 4
    assert e.ttft.count == e.end_to_end.count == 12 and e.inter_token.count == 12 * 15
    for lat in (e.ttft, e.inter_token, e.end_to_end):
        assert lat.p50_s is not None and lat.p95_s is not None and lat.p99_s is not None
        assert 0 < lat.p50_s <= lat.p95_s <= lat.p99_s
    assert e.ttft.p50_s < e.end_to_end.p50_s
    assert e.output_tokens_per_s == pytest.approx(16 * e.requests_per_s)
    assert e.preemptions == (None if engine == "llama_cpp" else 0)
    assert result.iterations.count == 12 and result.iterations.errors == 0
    started, *rest = notes
    assert started[0] == "engine_started" and isinstance(started[1], EngineGroup)
    group = started[1]
    # the engine runs under its supervisor, the leader of the group the agent is told of
    assert rec["parent_pid"] == group.pgid and group.devices == ()
    assert rest == [("load_start", group.pgid), ("load_end", None)]
    assert not alive(rec["pid"]) and not alive(rec["child_pid"]) and not alive(group.pgid)
    # the installed version, from the log (the fake prints vLLM 0.11.0 and llama.cpp b4518;
    # SGLang prints none), against the release the recipe follows (the newest modelled)
    version = {"vllm": "0.11.0", "sglang": None, "llama_cpp": "b4518"}[engine]
    assert e.version == version and e.modelled_version == engine_release(engine, None).modelled
    assert (e.version_warning is not None) == (version is not None)
    if version is not None:
        assert e.version_warning is not None and f"engine_version {version!r}" in e.version_warning


def test_preemptions_are_the_counter_s_increase(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ENGINE_KV_TOKENS", "1024")  # two requests of 512 fill it
    status, result, _ = measure_engine(request("vllm"), ChildSettings(engines=ENGINES), print)
    assert status == "succeeded" and result is not None and result.engine is not None
    rec = json.loads(record.read_text())
    assert result.engine.preemptions == rec["preemptions"] > 0


def test_an_engine_that_fails_to_start_is_failed_with_its_log(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ENGINE_FAIL", "kv")
    notes: list[Any] = []
    status, result, error = measure_engine(request(), ChildSettings(engines=ENGINES), notes.append)
    assert status == "failed" and error == "the engine exited with code 1 before it was ready"
    assert result is not None and result.engine is not None and result.message == error
    e = result.engine
    assert (e.started, e.exit_code, e.requests, e.startup_s) == (False, 1, 0, None)
    assert any("No available memory for the cache blocks" in line for line in e.log_tail)
    assert e.ttft.count == 0 and e.ttft.p50_s is None
    assert [n[0] for n in notes] == ["engine_started"]  # no load phase
    assert not alive(json.loads(record.read_text())["pid"])


def test_a_hanging_engine_is_stopped_at_its_ready_timeout(
    record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ENGINE_HANG", "1")
    req = request("llama_cpp", {"ready_timeout_s": 1.0})  # llama-server: 503 meanwhile
    gguf = record.parent / "g"
    gguf.mkdir()
    (gguf / GGUF).write_bytes(b"")
    t = time.monotonic()
    status, result, error = measure_engine(
        req, ChildSettings(engines=ENGINES, gguf_dir=str(gguf)), print
    )
    assert time.monotonic() - t < 8
    assert status == "failed" and error is not None and "within 1 s" in error
    assert result is not None and result.engine is not None
    assert result.engine.started is False and result.engine.exit_code is None  # we stopped it
    rec = json.loads(record.read_text())
    assert not alive(rec["pid"]) and not alive(rec["child_pid"])


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import msgspec
    if os.environ.get("SWALLOW_FIRST_SIGTERM"):
        # What Python does when the signal lands while a finalizer runs (a garbage-collected
        # asyncio transport's __del__): the handler's exception is printed and ignored.
        install = signal.signal
        def swallowing(signum, handler):
            if signum != signal.SIGTERM or not callable(handler):
                return install(signum, handler)
            def wrapped(n, frame):
                try:
                    handler(n, frame)
                except SystemExit:
                    print("swallowed", flush=True)
            return install(signum, wrapped)
        signal.signal = swallowing
    from vrambudget.agent.child import ChildSettings
    from vrambudget.agent.engine.run import measure_engine
    from vrambudget.core.probe_report import ProbeRequest
    req = msgspec.json.decode(sys.argv[1].encode(), type=ProbeRequest)
    child = ChildSettings(engines={"vllm": (sys.executable, sys.argv[2])})
    status, result, error = measure_engine(req, child, lambda m: print("notify", m, flush=True))
    print("status", status, "torch" in sys.modules, flush=True)
    """
)


def _child(req: ProbeRequest, record: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, msgspec.json.encode(req).decode(), FAKE],
        env={**os.environ, "PYTHONPATH": str(ROOT), "FAKE_ENGINE_RECORD": str(record), **env},
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_engine_path_imports_no_torch(record: Path) -> None:
    p = _child(request(), record)
    out, _ = p.communicate(timeout=60)
    assert "status succeeded False" in out


@pytest.mark.parametrize("swallowed", [False, True], ids=["raised", "raise-swallowed"])
def test_a_terminated_child_stops_its_engine_mid_load(record: Path, swallowed: bool) -> None:
    """SIGTERM mid-load stops the load and the engine; also when the handler's exception is
    lost (it landed in a finalizer), through the recorded signal the load polls."""
    req = request("vllm", {"concurrency": 2, "requests": 10_000, "output_tokens": 64})
    extra = {"SWALLOW_FIRST_SIGTERM": "1"} if swallowed else {}
    p = _child(req, record, FAKE_ENGINE_TOKEN_S="0.01", **extra)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if record.exists() and json.loads(record.read_text())["requests"] >= 3:
            break
        time.sleep(0.05)
    rec = json.loads(record.read_text())
    assert _running(rec["pid"])
    p.send_signal(signal.SIGTERM)  # what a cancel or the time limit does to the child
    try:
        out, _ = p.communicate(timeout=10)
    finally:
        if p.poll() is None:  # fails the test, but leaves no child (and engine) behind
            p.kill()
            p.wait(10)
    assert p.returncode == 128 + signal.SIGTERM
    assert ("swallowed" in out) is swallowed and "status" not in out
    time.sleep(0.2)
    assert not alive(rec["pid"]) and not alive(rec["child_pid"])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the premise
def test_a_sigterm_lost_in_a_finalizer_is_still_recorded() -> None:
    """The premise of ``Termination``: a signal handler's exception raised while ``__del__``
    runs is ignored by Python; the recorded signal still raises at the next ``check``."""

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # the handler runs between these bytecodes, inside __del__
                pass

    before = signal.getsignal(signal.SIGTERM)
    with _terminated_raises() as term:
        obj = Finalized()
        del obj  # the EngineTerminated raised inside __del__ is printed and ignored
        assert term.requested()
        with pytest.raises(EngineTerminated) as info:
            term.check()
    assert info.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def test_a_sigterm_inside_a_task_group_ends_the_load_as_a_termination() -> None:
    """A SIGTERM that lands while anyio's ``connect_tcp`` runs its task group comes out of the
    load wrapped in a BaseExceptionGroup (seen once in a fresh clone's run of the test above:
    the child exited 1 with the group's traceback); ``run_load`` raises it as the
    EngineTerminated it is, and lets any other group through."""
    import anyio

    from vrambudget.agent.engine.load import LoadResult
    from vrambudget.agent.engine.run import EngineTerminated, Termination, run_load

    term = Termination()

    async def terminated_in_a_group() -> LoadResult:
        async def signalled() -> None:
            term.signum = signal.SIGTERM
            term.check()

        async with anyio.create_task_group() as tg:
            tg.start_soon(signalled)
        return LoadResult()

    with pytest.raises(EngineTerminated) as raised:
        run_load(terminated_in_a_group(), term)
    assert raised.value.code == 128 + signal.SIGTERM

    async def failed_in_a_group() -> LoadResult:
        async def fails() -> None:
            raise ValueError("not a termination")

        async with anyio.create_task_group() as tg:
            tg.start_soon(fails)
        return LoadResult()

    with pytest.raises(BaseExceptionGroup):
        run_load(failed_in_a_group(), Termination())
