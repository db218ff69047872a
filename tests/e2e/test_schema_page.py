"""``/schema`` rendered by a real browser with no network but 127.0.0.1: Debian's headless
Chromium loads the page from a real service (and agent) process and Swagger UI draws every
operation of the published document. Every other host is unreachable: names resolve to
nothing and every connection goes to a dead proxy (Chromium itself bypasses the proxy for
loopback only), so a CDN reference would leave the page blank."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.browser import QUIET_FLAGS
from tests.support.processes import Agent, Service, free_port

CHROMIUM = Path("/usr/bin/chromium")
OFFLINE = (
    *QUIET_FLAGS,
    "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


def _dom(url: str, profile: Path) -> str:
    if not os.access(CHROMIUM, os.X_OK):
        message = "/usr/bin/chromium not installed (scripts/_browser.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    r = subprocess.run(
        [
            str(CHROMIUM),
            *OFFLINE,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _drawn_paths(dom: str) -> set[str]:
    return set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom))


def _published_paths(name: str) -> set[str]:
    document = json.loads((ROOT / "openapi" / f"{name}.json").read_text())
    return set(document["paths"])


def test_the_service_page_draws_every_operation_offline(tmp_path: Path) -> None:
    service = Service(free_port())
    service.start()
    try:
        dom = _dom(f"{service.url}/schema", tmp_path / "profile")
    finally:
        service.stop()
    assert "vrambudget calculation service" in dom
    assert _drawn_paths(dom) == _published_paths("service")
    assert dom.count('class="opblock-summary-method"') >= len(_published_paths("service"))


def test_the_agent_page_draws_every_operation_offline(tmp_path: Path) -> None:
    agent = Agent(tmp_path / "data", receiver_port=free_port())
    agent.start()
    try:
        dom = _dom(f"{agent.url}/schema", tmp_path / "profile")
    finally:
        agent.stop()
    assert "vrambudget probe agent" in dom
    assert _drawn_paths(dom) == _published_paths("agent")
