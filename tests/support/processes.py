"""Real processes on 127.0.0.1 for the end-to-end tests: a probe agent and the calculation
service started with ``python -m`` (uvicorn), and a webhook receiver that records every request.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.support import ROOT

TOKEN = "test-token-0123456789"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Receiver:
    """A webhook receiver on 127.0.0.1 that records every request."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_healthy(url: str, what: str, seconds: float = 30) -> None:
    """Wait until ``url``/healthz answers 200 (a freshly started process)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"{what} did not start")


class Agent:
    def __init__(self, data_dir: Path, receiver_port: int, **env: str) -> None:
        self.port = free_port()
        self.env = {
            **os.environ,
            "VRAMBUDGET_AGENT_PORT": str(self.port),
            "VRAMBUDGET_AGENT_DATA_DIR": str(data_dir),
            "VRAMBUDGET_AGENT_TOKENS": TOKEN,
            "VRAMBUDGET_AGENT_WEBHOOK_SECRET": SECRET,
            "VRAMBUDGET_AGENT_CALLBACK_ALLOW": f"http://127.0.0.1:{receiver_port}",
            "VRAMBUDGET_AGENT_ENTRY_POINTS": "sleeper=tests.support.agent_entries:sleeper",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "vrambudget.agent"], env=self.env)
        wait_healthy(self.url, "agent")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def submit(self, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/probes", json=body, headers=AUTH, timeout=10)

    def wait(self, probe_id: str, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = httpx.get(f"{self.url}/v1/probes/{probe_id}", headers=AUTH, timeout=10)
            assert r.status_code == 200, r.text
            doc: dict[str, Any] = r.json()
            if doc["status"] not in ("queued", "running"):
                return doc
            time.sleep(0.2)
        raise AssertionError(f"probe {probe_id} did not finish")


class Service:
    def __init__(self, port: int, **env: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, "VRAMBUDGET_PORT": str(port), "PYTHONPATH": str(ROOT), **env}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vrambudget.cli.main", "serve"], env=self.env
        )
        wait_healthy(self.url, "service")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
