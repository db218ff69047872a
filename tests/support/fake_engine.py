"""A fake serving engine for the engine-probe tests: a small OpenAI-compatible server on
127.0.0.1 that starts like vLLM, SGLang or llama-server (the style is read from its arguments:
``serve MODEL`` is vLLM, ``--model-path`` SGLang, ``-m`` llama-server), prints the real engines'
startup lines (formats copied from research/data/engine_logs.json, numbers computed from its
arguments), and serves ``/health``, ``/v1/models``, streamed ``/v1/completions`` (one SSE chunk
per token, a usage chunk, ``[DONE]``) and ``/metrics`` with a preemption counter.

    python tests/support/fake_engine.py serve MODEL --max-model-len 4096 --port N ...

The figures it logs (``expected_startup``): KV tokens = 8 x the context (``--max-model-len``,
``--context-length``, ``-c``) or ``FAKE_ENGINE_KV_TOKENS``; concurrency = tokens / context
(vLLM), ``--max-running-requests`` (SGLang), ``-np`` (llama.cpp; -1 = 4).

Environment: ``FAKE_ENGINE_START_S`` (delay before ready, default 0.3),
``FAKE_ENGINE_TOKEN_S`` (per generated token, default 0.002), ``FAKE_ENGINE_FAIL=kv`` (print
vLLM's no-KV-cache error and exit 1), ``FAKE_ENGINE_HANG=1`` (never ready),
``FAKE_ENGINE_IGNORE_TERM=1`` (it and its child ignore SIGTERM, as a draining server does),
``FAKE_ENGINE_RECORD=path`` (a JSON record: its pid, its parent's and its own child's pid,
``CUDA_VISIBLE_DEVICES``, argv, the environment's names, requests served, the largest number in
flight, prompt lengths seen, preemptions).
A request arriving while the tokens in flight exceed the KV tokens counts as a preemption.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GiB, MiB = 1 << 30, 1 << 20
WEIGHTS_BYTES = 988_065_536  # qwen2.5-0.5b in bf16, about what a real engine logs
KV_BYTES_PER_TOKEN = 12_288


def _arg(argv: list[str], *names: str, default: str | None = None) -> str | None:
    for name in names:
        if name in argv and argv.index(name) + 1 < len(argv):
            return argv[argv.index(name) + 1]
    return default


def style_of(argv: list[str]) -> str:
    if argv and argv[0] == "serve":
        return "vllm"
    if "--model-path" in argv:
        return "sglang"
    return "llama_cpp"


def expected_startup(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What this fake logs for ``argv`` (the figures a parser must read back)."""
    style = style_of(argv)
    ctx = int(_arg(argv, "--max-model-len", "--context-length", "-c", default="4096") or 4096)
    tokens = int(env.get("FAKE_ENGINE_KV_TOKENS") or ctx * 8)
    if style == "vllm":
        conc: float = round(tokens / ctx, 2)
    elif style == "sglang":
        conc = float(_arg(argv, "--max-running-requests", default="48") or 48)
    else:
        np = int(_arg(argv, "-np", default="1") or 1)
        conc = float(4 if np == -1 else np)
    return {
        "style": style,
        "context": ctx,
        "kv_cache_tokens": tokens,
        "max_concurrency": conc,
        "weights_bytes": WEIGHTS_BYTES,
        "kv_cache_bytes": tokens * KV_BYTES_PER_TOKEN,
    }


def startup_lines(argv: list[str], env: dict[str, str], pid: int) -> list[str]:
    e = expected_startup(argv, env)
    w_gib, kv_gib = e["weights_bytes"] / GiB, e["kv_cache_bytes"] / GiB
    tokens, ctx = e["kv_cache_tokens"], e["context"]
    if e["style"] == "vllm":
        p = f"(EngineCore_DP0 pid={pid}) INFO 10-14 19:25:0"
        return [
            f"(APIServer pid={pid}) INFO 10-14 19:22:10 [api_server.py:1839] vLLM API server "
            "version 0.11.0",
            f"{p}1 [gpu_model_runner.py:2653] Model loading took {w_gib:.4f} GiB and "
            "1.108878 seconds",
            f"{p}2 [gpu_worker.py:298] Available KV cache memory: {kv_gib:.2f} GiB",
            f"{p}3 [kv_cache_utils.py:1087] GPU KV cache size: {tokens:,} tokens",
            f"{p}3 [kv_cache_utils.py:1091] Maximum concurrency for {ctx:,} tokens per request: "
            f"{e['max_concurrency']:.2f}x",
            f"{p}4 [gpu_model_runner.py:3480] Graph capturing finished in 7 secs, took 0.38 GiB",
        ]
    if e["style"] == "sglang":
        t = "[2026-08-01 23:39:39 TP0]"
        half = kv_gib / 2
        return [
            f"{t} Load weight end. elapsed=1.33 s, type=Qwen2ForCausalLM, avail mem=20.00 GB, "
            f"mem usage={w_gib:.2f} GB.",
            f"{t} KV Cache is allocated. #tokens: {tokens}, K size: {half:.2f} GB, V size: "
            f"{half:.2f} GB",
            f"{t} Memory pool end. avail mem=8.00 GB",
            f"{t} Capture cuda graph end. Time elapsed: 1.00 s. mem usage=0.50 GB. avail "
            "mem=7.50 GB.",
            f"{t} max_total_num_tokens={tokens}, chunked_prefill_size=4096, "
            f"max_prefill_tokens=16384, max_running_requests={int(e['max_concurrency'])}, "
            f"context_len={ctx}, available_gpu_mem=7.50 GB",
        ]
    return [
        "0.00.000.183 I build: 4518 (aea8ddd51) with cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0 for "
        "x86_64-linux-gnu",
        "load_tensors: offloaded 25/25 layers to GPU",
        f"load_tensors:        CUDA0 model buffer size = {e['weights_bytes'] / MiB:8.2f} MiB",
        "load_tensors:   CPU_Mapped model buffer size =   137.94 MiB",
        f"llama_context: n_seq_max     = {int(e['max_concurrency'])}",
        f"llama_context: n_ctx         = {tokens}",
        f"llama_kv_cache:      CUDA0 KV buffer size = {e['kv_cache_bytes'] / MiB:8.2f} MiB",
    ]


VLLM_KV_ERROR = [
    "(EngineCore_DP0 pid={pid}) ERROR 10-31 15:07:50 [core.py:708] EngineCore failed to start.",
    "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.",
]


class State:
    def __init__(self, argv: list[str], record: str | None, kv_tokens: int) -> None:
        self.argv = argv
        self.record = record
        self.kv_tokens = kv_tokens
        self.ready = False
        self.lock = threading.Lock()
        self.in_flight = 0
        self.in_flight_tokens = 0
        self.max_in_flight = 0
        self.requests = 0
        self.preemptions = 0
        self.prompt_lengths: set[int] = set()
        self.child_pid: int | None = None

    def write(self) -> None:
        if self.record is None:
            return
        doc = {
            "pid": os.getpid(),
            "parent_pid": os.getppid(),
            "child_pid": self.child_pid,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "argv": self.argv,
            "env": sorted(os.environ),
            "requests": self.requests,
            "max_in_flight": self.max_in_flight,
            "prompt_lengths": sorted(self.prompt_lengths),
            "preemptions": self.preemptions,
        }
        tmp = f"{self.record}.tmp{threading.get_ident()}"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.record)


def handler(state: State, model: str, max_len: int, style: str, token_s: float) -> type:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, code: int, doc: Any) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                if state.ready:
                    self._json(200, {"status": "ok"})
                else:
                    self._json(503, {"error": {"code": 503, "message": "Loading model"}})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/metrics":
                name = {"vllm": "vllm:num_preemptions_total", "sglang": "sglang:num_retracted_reqs"}
                text = "# fake engine\n"
                if style in name:
                    text += f"# TYPE {name[style]} counter\n"
                    text += f'{name[style]}{{model_name="{model}"}} {float(state.preemptions)}\n'
                body = text.encode()
                self.send_response(200)
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
            if self.path != "/v1/completions" or not state.ready:
                self._json(404 if state.ready else 503, {"error": "not here"})
                return
            prompt, n = body.get("prompt"), int(body.get("max_tokens", 16))
            if style == "vllm" and body.get("model") != model:
                self._json(404, {"error": {"message": f"The model `{body.get('model')}` does "
                                                      "not exist."}})  # fmt: skip
                return
            if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
                self._json(400, {"error": {"message": "prompt must be token ids"}})
                return
            if len(prompt) + n > max_len:
                self._json(400, {"error": {"message": "longer than the maximum context"}})
                return
            with state.lock:
                if state.in_flight_tokens + len(prompt) + n > state.kv_tokens:
                    state.preemptions += 1
                state.in_flight += 1
                state.in_flight_tokens += len(prompt) + n
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
                state.prompt_lengths.add(len(prompt))
            try:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for i in range(n):
                    time.sleep(token_s)
                    chunk = {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "text": f" t{i}",
                                "finish_reason": "length" if i == n - 1 else None,
                            }
                        ],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {
                        "prompt_tokens": len(prompt),
                        "completion_tokens": n,
                        "total_tokens": len(prompt) + n,
                    }
                    chunk = {"id": "cmpl-fake", "choices": [], "usage": usage}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            finally:  # before [DONE]: the client's next request comes after it
                with state.lock:
                    state.in_flight -= 1
                    state.in_flight_tokens -= len(prompt) + n
                    state.requests += 1
                    state.write()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    style = style_of(argv)
    e = expected_startup(argv, env)
    port = int(_arg(argv, "--port", default="0") or 0)
    model = str(argv[1] if style == "vllm" else _arg(argv, "--model-path", "-m", default="model"))
    pid = os.getpid()
    if env.get("FAKE_ENGINE_IGNORE_TERM"):  # a draining server: SIGTERM does not stop it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (its child inherits that)
    state = State(argv, env.get("FAKE_ENGINE_RECORD"), e["kv_cache_tokens"])
    # An engine has processes of its own (vLLM's EngineCore): they must go with it.
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    state.child_pid = helper.pid
    state.write()
    print(f"fake {style} engine starting: {' '.join(argv)}", flush=True)
    if env.get("FAKE_ENGINE_FAIL") == "kv":
        for line in VLLM_KV_ERROR:
            print(line.format(pid=pid), file=sys.stderr, flush=True)
        helper.kill()
        return 1
    server = ThreadingHTTPServer(
        ("127.0.0.1", port),
        handler(state, model, e["context"], style, float(env.get("FAKE_ENGINE_TOKEN_S", "0.002"))),
    )
    server.daemon_threads = True
    if style == "llama_cpp":  # llama-server listens at once and answers 503 while loading
        threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(float(env.get("FAKE_ENGINE_START_S", "0.3")))
    for line in startup_lines(argv, env, pid):
        print(line, flush=True)
    if env.get("FAKE_ENGINE_HANG"):
        while True:
            time.sleep(1)
    state.ready = True
    print("fake engine ready", flush=True)
    if style == "llama_cpp":
        while True:
            time.sleep(1)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
