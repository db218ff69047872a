"""scripts/_venv.sh and scripts/serve with stand-in installers: what runs on a fresh tree, on a
restart (nothing at all), after pyproject.toml or the lock changes, and in the background.

The stand-ins are shell scripts that log each call (``python3 ARGS`` for $PYTHON, ``python ARGS``
for .venv's, ``uv ARGS``) to a file and make what the real ones would (the venv, uv in it), so
the script's real decisions run with no network and no install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV_VERSION = re.search(
    r"^VRAMBUDGET_UV_VERSION=(\S+)$", (ROOT / "scripts/_venv.sh").read_text(), re.M
)

# `$PYTHON -m venv --without-pip .venv` makes a .venv/bin/python that logs its calls; `$PYTHON -m
# pip --python .venv/bin/python install uv==V` puts a .venv/bin/uv beside it (with FAKE_OLD_PIP
# set it fails, as a pip older than 22.3 does, and the venv's own pip must do it); `$PYTHON -m pip
# config list` shows find-links as pip prints them; `-m compileall` sleeps $COMPILE_S first.
FAKE_PYTHON3 = r"""#!/usr/bin/env bash
echo "python3 $*" >> "$FAKE_LOG"
case "$*" in
  "-m venv --without-pip .venv")
    mkdir -p .venv/bin
    cp "$FAKE_DIR/venv-python" .venv/bin/python
    ;;
  "-m pip --python .venv/bin/python install "*uv==*)
    [ -z "${FAKE_OLD_PIP:-}" ] || exit 2
    cp "$FAKE_DIR/uv" .venv/bin/uv
    ;;
  "-m pip config list")
    echo ":env:.find-links='/wheels/b /wheels/a'"
    echo "global.cert='/etc/ssl/certs/ca-certificates.crt'"
    echo "global.find-links='/wheels/a'"
    ;;
  *) exit 9 ;;
esac
"""
FAKE_VENV_PYTHON = r"""#!/usr/bin/env bash
echo "python $*" >> "$FAKE_LOG"
case "$*" in
  "-m pip install "*uv==*)
    cp "$FAKE_DIR/uv" .venv/bin/uv
    ;;
  "-m compileall "*)
    sleep "${COMPILE_S:-0}"
    ;;
esac
"""
FAKE_UV = r"""#!/usr/bin/env bash
echo "uv $*" >> "$FAKE_LOG"
[ "$1" = --version ] && echo "uv @UV@"
exit 0
"""
FAKE_VRAMBUDGET = r"""#!/usr/bin/env bash
echo "vrambudget $*" >> "$FAKE_LOG"
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A project tree with the real scripts, pyproject.toml and lock, and stand-in installers."""
    assert UV_VERSION is not None
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("scripts/_venv.sh", "scripts/serve", "pyproject.toml", "requirements-lock.txt"):
        shutil.copy2(ROOT / name, repo / name)
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    for name, text in {
        "python3": FAKE_PYTHON3,
        "venv-python": FAKE_VENV_PYTHON,
        "uv": FAKE_UV.replace("@UV@", UV_VERSION.group(1)),
        "vrambudget": FAKE_VRAMBUDGET,
    }.items():
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    return repo


def _env(tree: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMBUDGET_")}
    env.update(
        PYTHON=str(tree.parent / "fakes/python3"),
        FAKE_DIR=str(tree.parent / "fakes"),
        FAKE_LOG=str(tree.parent / "log"),
        **extra,
    )
    return env


def _source(tree: Path, *args: str, **extra: str) -> list[str]:
    """Source scripts/_venv.sh ARGS from another directory (as scripts/serve does); the log lines
    it added, and the directory it left the caller in."""
    log = tree.parent / "log"
    before = log.read_text().splitlines() if log.exists() else []
    out = subprocess.run(
        ["bash", "-c", 'source "$1/scripts/_venv.sh" "${@:2}"; pwd', "_", str(tree), *args],
        cwd=tree.parent,
        env=_env(tree, **extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == str(tree), "the caller is left in the repository root"
    after = log.read_text().splitlines() if log.exists() else []
    return after[len(before) :]


def _install_calls(extras: str) -> list[str]:
    """pip's find-links read and handed to uv (each once, sorted), then the one uv install."""
    return [
        "python3 -m pip config list",
        "uv pip install --quiet --python .venv/bin/python --find-links /wheels/a --find-links "
        f"/wheels/b --constraint requirements-lock.txt --editable .[{extras}] pip",
    ]


COMPILE = "python -m compileall -q -j 0 .venv/lib"


def test_a_fresh_tree_gets_uv_from_pip_then_everything_from_uv_within_the_lock(
    tree: Path,
) -> None:
    assert UV_VERSION is not None
    uv = f"install --quiet --disable-pip-version-check uv=={UV_VERSION.group(1)}"
    assert _source(tree, "service,trace") == [
        "python3 -m venv --without-pip .venv",
        f"python3 -m pip --python .venv/bin/python {uv}",
        *_install_calls("service,trace"),
        COMPILE,
    ]


def test_with_a_pip_older_than_22_3_the_venv_gets_its_own_pip_for_uv(tree: Path) -> None:
    assert UV_VERSION is not None
    uv = f"install --quiet --disable-pip-version-check uv=={UV_VERSION.group(1)}"
    assert _source(tree, "dev", FAKE_OLD_PIP="1") == [
        "python3 -m venv --without-pip .venv",
        f"python3 -m pip --python .venv/bin/python {uv}",
        "python -m ensurepip --upgrade",
        f"python -m pip {uv}",
        *_install_calls("dev"),
        COMPILE,
    ]


def test_a_restart_runs_nothing(tree: Path) -> None:
    _source(tree, "dev")
    assert _source(tree, "dev") == []
    assert _source(tree, "dev") == []


def test_a_changed_pyproject_or_lock_installs_again_into_the_same_venv(tree: Path) -> None:
    _source(tree, "dev")
    again = ["uv --version", *_install_calls("dev"), COMPILE]
    lock = tree / "requirements-lock.txt"
    lock.write_text(lock.read_text() + "example-package==1.0\n")
    assert _source(tree, "dev") == again
    assert _source(tree, "dev") == []
    pyproject = tree / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# a comment changes the checksum too\n")
    assert _source(tree, "dev") == again
    assert _source(tree, "dev", VRAMBUDGET_REINSTALL="1") == again


def test_each_set_of_extras_has_its_own_stamp(tree: Path) -> None:
    _source(tree, "dev")
    # a set installed once stays installed beside the others
    assert _source(tree, "service") == ["uv --version", *_install_calls("service"), COMPILE]
    assert _source(tree, "dev") == []
    assert _source(tree, "service") == []


def test_background_compiling_returns_at_once_and_stamps_when_done(tree: Path) -> None:
    log = tree.parent / "log"
    _source(tree, "service,trace", "background", COMPILE_S="3")
    stamp = tree / ".venv/.vrambudget-compiled-service+trace"
    pid_file = tree / ".venv/.vrambudget-compiling"
    assert not stamp.exists(), "returned before the compiler ended"
    assert pid_file.exists()
    deadline = time.monotonic() + 30
    while COMPILE not in log.read_text().splitlines() and time.monotonic() < deadline:
        time.sleep(0.05)  # the background compiler has started (and logged)
    # a restart meanwhile starts no second compiler
    assert _source(tree, "service,trace", "background") == []
    while not stamp.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stamp.read_text() == (tree / ".venv/.vrambudget-installed-service+trace").read_text()
    assert not pid_file.exists()
    assert log.read_text().splitlines().count(COMPILE) == 1
    assert _source(tree, "service,trace", "background") == []


def test_serve_on_a_set_up_tree_starts_the_service_and_nothing_else(tree: Path) -> None:
    _source(tree, "service,trace")
    shutil.copy2(tree.parent / "fakes/vrambudget", tree / ".venv/bin/vrambudget")
    log = tree.parent / "log"
    log.write_text("")
    subprocess.run(
        [str(tree / "scripts/serve"), "--port", "8123"],
        cwd=tree.parent,
        env=_env(tree),
        timeout=60,
        check=True,
    )
    assert log.read_text().splitlines() == ["vrambudget serve --port 8123"]
