"""requirements-lock.txt against pyproject.toml: every requirement of every extra is pinned, at a
version its specifier admits; torch is pinned once, exactly, in pyproject.toml (pip installs it,
scripts/_venv.sh reads that pin) and neither it nor a CUDA package is in the lock.

A dependency added to pyproject.toml fails here until ``scripts/lock`` is run.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)$")


def _lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements-lock.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = LOCK_LINE.match(line)
        assert m, f"not a `name==version` line: {line!r}"
        name = canonicalize_name(m["name"])
        assert name not in pins, f"{name} pinned twice"
        pins[name] = Version(m["version"])
    return pins


def _requirements() -> list[tuple[str, Requirement]]:
    """(where, requirement) for the base dependencies and every extra's, less the project's own
    extras (``vrambudget[service,trace]``)."""
    project = PYPROJECT["project"]
    out = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        out += [(extra, Requirement(r)) for r in reqs]
    return [(where, r) for where, r in out if canonicalize_name(r.name) != project["name"]]


@pytest.mark.parametrize(
    ("where", "requirement"),
    [pytest.param(w, r, id=f"{w}:{r.name}") for w, r in _requirements() if r.name != "torch"],
)
def test_every_requirement_is_pinned_within_its_specifier(
    where: str, requirement: Requirement
) -> None:
    pins = _lock()
    name = canonicalize_name(requirement.name)
    assert name in pins, f"{requirement} ({where}) is not in requirements-lock.txt: scripts/lock"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
        f"requirements-lock.txt pins {name}=={pins[name]}, outside {requirement} ({where}): "
        "run scripts/lock"
    )


def test_torch_is_pinned_exactly_once_in_pyproject_and_not_in_the_lock() -> None:
    torch = [r for _, r in _requirements() if r.name == "torch"]
    assert [str(r.specifier) for r in torch] == ["==2.13.0"]
    # scripts/_venv.sh and scripts/lock take the pin with this pattern
    assert re.findall(r'"(torch==[^"]+)"', (ROOT / "pyproject.toml").read_text()) == [
        "torch==2.13.0"
    ]
    # torch's CUDA libraries (nvidia-cublas-cu12, nvidia-nccl-cu12, ...) and its compiler; the
    # agent's NVML binding is nvidia-ml-py
    cuda = [n for n in _lock() if n in ("torch", "triton") or n.startswith("nvidia-")]
    assert cuda == ["nvidia-ml-py"], (
        "the lock was made with PyPI's CUDA torch: run scripts/lock where pip's find-links hold "
        "the CPU build"
    )


def test_the_lock_says_how_it_is_made() -> None:
    head = (ROOT / "requirements-lock.txt").read_text().splitlines()[:4]
    assert any("scripts/lock" in line for line in head)
