"""The service and the agent on a read-only root filesystem with exactly their manifests'
volumes: budgets, fits and a trace answer, a probe runs; without the /tmp volume the trace tier
cannot load (torch needs a temporary directory). Real processes in a private mount namespace
(``unshare -m``: needs root; skipped elsewhere, saying why)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.manifests import (
    ROOT,
    SECRET_EXAMPLE,
    documents,
    env_values,
    one,
    source_documents,
)
from tests.support.processes import free_port, wait_healthy
from tests.support.workloads import INFER

pytestmark = pytest.mark.e2e

BUDGET = {
    "workloads": [
        {
            "kind": "inference",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "batch_size": 8,
            "prompt_tokens": 4096,
            "generated_tokens": 512,
        }
    ],
    "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
}
FIT = {"workloads": BUDGET["workloads"]}
TRACE = {
    "method": "trace",
    "workloads": [
        {
            "kind": "inference",
            "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            "batch_size": 1,
            "prompt_tokens": 64,
            "generated_tokens": 4,
        }
    ],
}


def _can_unshare() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (a private mount namespace, a read-only remount)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    trial = "mount --make-rprivate / && mount -t tmpfs tmpfs /mnt && mount -o remount,ro /mnt"
    if subprocess.run(["unshare", "-m", "sh", "-c", trial], capture_output=True).returncode != 0:
        return "mounting in a private mount namespace is not permitted here (no CAP_SYS_ADMIN)"
    return None


def _mount_script(mounts: dict[str, str], command: list[str]) -> str:
    """Shell for `unshare -m`: the root read-only, a tmpfs per volume (its sizeLimit); a mount
    point the host lacks is made inside a read-only tmpfs over its nearest existing parent, so the
    host's filesystem is never written."""
    lines = ["set -e", "mount --make-rprivate /"]
    for path in mounts:
        if not Path(path).exists():
            parent = Path(path).parent
            while not parent.exists():
                parent = parent.parent
            lines += [
                f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(parent))}",
                f"mkdir -p {shlex.quote(path)}",
                f"mount -o remount,ro {shlex.quote(str(parent))}",
            ]
    root = shlex.quote(str(ROOT))
    # A checkout under a volume's path (a clone in /tmp) would vanish under that volume's tmpfs:
    # it is held at /mnt (in this mount namespace only) and bound back, read-only, on top.
    hidden = any(Path(p) == ROOT or Path(p) in ROOT.parents for p in mounts)
    if hidden:
        lines.append(f"mount --bind {root} /mnt")
    lines.append("mount -o remount,bind,ro /")
    for path, size in mounts.items():
        lines.append(f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(path)}")
    if hidden:
        lines += [
            f"mkdir -p {root}",
            f"mount --bind /mnt {root}",
            f"mount -o remount,bind,ro {root}",
        ]
    lines.append(f"test ! -w {shlex.quote(str(ROOT))} || touch {shlex.quote(str(ROOT))}/.ro-check")
    lines.append("exec " + shlex.join(command))
    return "\n".join(lines)


def _sizes(pod: dict[str, Any]) -> dict[str, str]:
    """volume -> tmpfs size: an emptyDir's sizeLimit, else 256m (a hostPath becomes a tmpfs)."""
    out = {}
    for v in pod["volumes"]:
        limit = v.get("emptyDir", {}).get("sizeLimit", "256Mi")
        out[v["name"]] = limit.replace("Mi", "m")
    return out


@contextmanager
def _started(kind: str, without: str | None = None) -> Iterator[str]:
    """The Deployment's service or the DaemonSet's agent, with its container's environment and
    its volumes (less ``without``) as the only writable paths; yields its URL."""
    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    pod = one(source_documents(), kind)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    sizes = _sizes(pod)
    mounts = {m["mountPath"]: sizes[m["name"]] for m in container["volumeMounts"]}
    mounts.pop(without or "", None)
    port = free_port()
    secret = documents(SECRET_EXAMPLE)[0]["stringData"]
    env = {
        k: (secret[v.split("/")[1]] if v.startswith("secret:vrambudget-agent/") else v)
        for k, v in env_values(container).items()
        if not v.startswith("secret:vrambudget-hub/")  # optional; absent here
    }
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": "/nonexistent", **env}
    if kind == "Deployment":
        env |= {"VRAMBUDGET_HOST": "127.0.0.1", "VRAMBUDGET_PORT": str(port)}
        command = [str(Path(sys.executable).with_name("vrambudget")), "serve"]
    else:
        env |= {"VRAMBUDGET_AGENT_HOST": "127.0.0.1", "VRAMBUDGET_AGENT_PORT": str(port)}
        command = [sys.executable, "-m", "vrambudget.agent"]
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            ["unshare", "-m", "sh", "-c", _mount_script(mounts, command)],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            try:
                wait_healthy(url, f"the {kind}'s process on a read-only root")
            except AssertionError:
                proc.kill()
                proc.wait()
                log.seek(0)
                pytest.fail(f"it did not start: {log.read()[-2000:]}")
            assert httpx.get(url + "/readyz", timeout=5).status_code == 200
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert not (ROOT / ".ro-check").exists(), "the root filesystem was writable"


def test_the_service_answers_with_only_its_volumes_writable() -> None:
    with _started("Deployment") as url:
        assert httpx.post(url + "/v1/budgets", json=BUDGET, timeout=30).status_code == 200
        assert httpx.post(url + "/v1/fits", json=FIT, timeout=30).status_code == 200
        traced = httpx.post(url + "/v1/budgets", json=TRACE, timeout=120)
        assert traced.status_code == 200, traced.text
        assert httpx.get(url + "/metrics", timeout=10).status_code == 200


def test_without_a_writable_tmp_the_trace_tier_cannot_load() -> None:
    """The reason /tmp is a volume: torch's import looks for a usable temporary directory."""
    with _started("Deployment", without="/tmp") as url:
        assert httpx.post(url + "/v1/budgets", json=BUDGET, timeout=30).status_code == 200
        traced = httpx.post(url + "/v1/budgets", json=TRACE, timeout=120)
        assert traced.status_code == 501
        assert "No usable temporary directory" in traced.json()["detail"]


def test_the_agent_probes_with_only_its_volumes_writable() -> None:
    """The DaemonSet's agent (its data hostPath as a tmpfs here): a CPU probe -- a spawned child
    that imports torch and runs the workload -- succeeds and is recorded in SQLite."""
    with _started("DaemonSet") as url:
        token = documents(SECRET_EXAMPLE)[0]["stringData"]["tokens"]
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.post(url + "/v1/probes", json={"workload": INFER}, headers=auth, timeout=10)
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            doc = httpx.get(url + r.headers["location"], headers=auth, timeout=10).json()
            if doc["status"] not in ("queued", "running"):
                break
            time.sleep(0.5)
        assert doc["status"] == "succeeded", doc
