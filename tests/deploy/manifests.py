"""Reading deploy/: the Kubernetes manifests (each kustomization's files, or kubectl's
rendering), the compose file, the Dockerfile, and the environment variables the code reads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from vrambudget.agent.settings import AgentSettings
from vrambudget.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATIONS = (KUBERNETES, KUBERNETES / "service", KUBERNETES / "agent")
SECRET_EXAMPLE = KUBERNETES / "agent" / "secret.example.yaml"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"

UID = 10001
"""The user the Dockerfile creates and every container runs as."""

# Variables the deployment sets that the project's code does not read itself, and who reads them.
FOREIGN_ENV = {
    "HF_HOME": "huggingface_hub and transformers: the root of their caches",
    "HOME": "the probes' frameworks: ~/.cache, CUDA's ~/.nv, Triton's ~/.triton",
}

Doc = dict[str, Any]


def documents(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization_files(directory: Path) -> list[Path]:
    """The manifest files a kustomization lists, following nested kustomizations."""
    spec = documents(directory / "kustomization.yaml")[0]
    out: list[Path] = []
    for entry in spec.get("resources", []):
        target = directory / entry
        out += kustomization_files(target) if target.is_dir() else [target]
    return out


def source_documents() -> list[Doc]:
    """Every document of deploy/kubernetes as written (the whole tree's kustomization)."""
    return [d for f in kustomization_files(KUBERNETES) for d in documents(f)]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not on PATH: the kustomize rendering is not checked here")
    return path


def rendered(directory: Path) -> list[Doc]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} documents"
    return found[0]


def containers(pod_spec: Doc) -> Iterator[Doc]:
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec["containers"]


def env_values(container: Doc) -> dict[str, str]:
    """name -> value, or ``secret:NAME/KEY`` for a secretKeyRef."""
    out: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            out[item["name"]] = str(item["value"])
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            out[item["name"]] = f"secret:{ref['name']}/{ref['key']}"
    return out


class RecordingEnv(dict[str, str]):
    """An environment that remembers every name looked up in it."""

    def __init__(self, values: Mapping[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def service_settings(
    env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, set[str]]:
    """The service's settings from ``env`` and the variable names the code looked up."""
    recording = RecordingEnv(env)
    with monkeypatch.context() as m:
        m.setattr(os, "environ", recording)
        settings = Settings.from_env()
    return settings, recording.read


def agent_settings(env: Mapping[str, str]) -> tuple[AgentSettings, set[str]]:
    recording = RecordingEnv(env)
    settings = AgentSettings.from_env(recording)
    return settings, recording.read


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """stage name -> its instructions (keyword, arguments), line continuations joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args.strip(), re.IGNORECASE)
            assert match, f"every stage is named: FROM {args}"
            current = [("FROM", match.group(1))]
            stages[match.group(2)] = current
        else:
            current.append((keyword, args.strip()))
    return stages


def dockerfile_env(stage: str) -> dict[str, str]:
    """ENV of a stage and the stages it is built FROM."""
    stages = dockerfile_stages()
    out: dict[str, str] = {}
    chain = []
    name: str | None = stage
    while name in stages:
        chain.append(name)
        name = stages[name][0][1]
    for name in reversed(chain):
        for keyword, args in stages[name]:
            if keyword == "ENV":
                out.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return out
