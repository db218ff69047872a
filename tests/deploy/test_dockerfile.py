"""The Dockerfile's structure (no Docker engine here to build it): two targets, each a venv
built in its own stage and copied into a runtime stage that runs as the numeric user the
manifests name, with the extras and settings the code defines."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.deploy.manifests import (
    DOCKERFILE,
    FOREIGN_ENV,
    ROOT,
    UID,
    agent_settings,
    dockerfile_env,
    dockerfile_stages,
    service_settings,
)

# Variables for Python, pip and the NVIDIA Container Toolkit, not for the project's code.
IMAGE_ENV = {
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "PATH",
    "PIP_NO_CACHE_DIR",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "NVIDIA_DRIVER_CAPABILITIES",
}


def _args(stage: str, keyword: str) -> list[str]:
    return [args for k, args in dockerfile_stages()[stage] if k == keyword]


def test_the_runtime_user_is_numeric_and_created() -> None:
    (run,) = _args("runtime", "RUN")
    assert f"groupadd --gid {UID} vrambudget" in run
    assert f"useradd --uid {UID} --gid {UID}" in run
    for target in ("service", "agent"):
        assert _args(target, "USER") == [f"{UID}:{UID}"]


@pytest.mark.parametrize(("target", "extras"), [("service", "service,trace"), ("agent", "agent")])
def test_each_target_copies_only_its_built_environment(target: str, extras: str) -> None:
    stages = dockerfile_stages()
    assert stages[target][0] == ("FROM", "runtime")
    assert _args(target, "COPY") == [f"--from=build-{target} /opt/venv /opt/venv"]
    assert stages[f"build-{target}"][0] == ("FROM", "source")
    (install,) = _args(f"build-{target}", "RUN")
    assert f'"/src[{extras}]"' in install
    # the locked versions (requirements-lock.txt, copied into the source stage)
    assert "--constraint /src/requirements-lock.txt" in install
    assert any("requirements-lock.txt" in copy for copy in _args("source", "COPY"))
    assert ("download.pytorch.org/whl/cpu" in install) == (target == "service")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(extras.split(",")) <= set(declared["optional-dependencies"])
    # The runtime base and the build base are the same image: the venv's interpreter link holds.
    assert stages["runtime"][0] == stages["source"][0]


def test_image_settings_are_read_by_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    service_env = {k: v for k, v in dockerfile_env("service").items() if k not in IMAGE_ENV}
    settings, read = service_settings(service_env, monkeypatch)
    assert set(service_env) - set(FOREIGN_ENV) <= read
    assert _args("service", "EXPOSE") == [str(settings.port)]
    agent_env = {k: v for k, v in dockerfile_env("agent").items() if k not in IMAGE_ENV}
    agent, read = agent_settings(agent_env)
    assert set(agent_env) <= read
    assert _args("agent", "EXPOSE") == [str(agent.port)]
    # The data directory exists in the image, owned by the agent's user.
    assert f"install -d -o {UID} -g {UID} -m 0700 {agent.data_dir}" in _args("agent", "RUN")[0]


def test_the_commands_are_the_project_entry_points() -> None:
    assert _args("service", "CMD") == ['["vrambudget", "serve"]']
    assert _args("agent", "CMD") == ['["python", "-m", "vrambudget.agent"]']
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["vrambudget"] == "vrambudget.cli.main:main"


def test_the_image_leaves_out_what_it_does_not_need() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for path in ("tests", "research", "bench", "deploy", ".venv", ".git"):
        assert path in ignored
    copied = [args for stage in dockerfile_stages().values() for k, args in stage if k == "COPY"]
    sources = {a.split()[0] for a in copied if not a.startswith("--from=")}
    assert sources == {"pyproject.toml", "vrambudget"}
    assert re.search(
        r"COPY pyproject.toml README.md requirements-lock.txt \./", DOCKERFILE.read_text()
    )
