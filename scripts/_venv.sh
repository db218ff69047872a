# Shared by scripts/serve, scripts/test and scripts/lint: `source scripts/_venv.sh EXTRAS [MODE]`
# creates .venv and installs the project with EXTRAS (comma-separated) at the versions pinned in
# requirements-lock.txt, then byte-compiles what is installed -- each step only when
# pyproject.toml, the lock or this script changed since it last ran for the same extras (stamps
# in .venv hold their checksum), so that a restart spends nothing here.
#
# Installers: uv (pinned below) for everything: it resolves and installs in seconds where pip
# took minutes. pip only bootstraps uv into .venv, and lends uv its find-links: that is where the
# torch CPU build lies on the development machines' disk (pip's configuration), and uv by itself
# looks only at PyPI, whose Linux x86_64 torch is a multi-GB CUDA build. Given both, uv takes
# the highest version that the pin admits: 2.13.0+cpu from the disk over PyPI's 2.13.0.
#
# Byte-code: uv does not compile, and an environment with PYTHONDONTWRITEBYTECODE set never
# writes what it imports, so every process would compile torch again (an import of torch and
# transformers took 22 s from source, 10 s compiled). MODE `now` (the default) compiles before
# returning; `background` (scripts/serve) compiles in a niced process while the caller goes on:
# the service's analytic path needs none of it, and a trace worker started meanwhile imports
# from source, slower but correct.
#
# VRAMBUDGET_REINSTALL=1 installs and compiles even when the stamps match.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
VRAMBUDGET_UV_VERSION=0.13.8
_extras="$1"
_mode="${2:-now}"
_sum="$(cat pyproject.toml requirements-lock.txt scripts/_venv.sh | cksum)"
_installed=".venv/.vrambudget-installed-${_extras//,/+}"
_compiled=".venv/.vrambudget-compiled-${_extras//,/+}"
if [ "${VRAMBUDGET_REINSTALL:-0}" = 1 ]; then
  rm -f "$_installed" "$_compiled"
fi
if [ ! -x .venv/bin/python ] || [ ! -f "$_installed" ] || [ "$(cat "$_installed")" != "$_sum" ]
then
  echo "setting up .venv (extras: $_extras) ..." >&2
  if [ ! -x .venv/bin/python ]; then
    # without pip: ensurepip alone took 4-28 s here; uv installs pip below
    "$PYTHON" -m venv --without-pip .venv
  fi
  rm -f "$_installed" "$_compiled"
  if ! .venv/bin/uv --version 2>/dev/null | grep -qx "uv $VRAMBUDGET_UV_VERSION"; then
    # pip (22.3 or newer) installs into another environment with --python; else the venv's own
    "$PYTHON" -m pip --python .venv/bin/python install --quiet --disable-pip-version-check \
      "uv==$VRAMBUDGET_UV_VERSION" \
      || { .venv/bin/python -m ensurepip --upgrade >/dev/null \
        && .venv/bin/python -m pip install --quiet --disable-pip-version-check \
          "uv==$VRAMBUDGET_UV_VERSION"; }
  fi
  _links=()
  for _dir in $("$PYTHON" -m pip config list 2>/dev/null \
    | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" | tr ' ' '\n' | sort -u); do
    _links+=(--find-links "$_dir")
  done
  .venv/bin/uv pip install --quiet --python .venv/bin/python ${_links[@]+"${_links[@]}"} \
    --constraint requirements-lock.txt --editable ".[$_extras]" pip
  echo "$_sum" > "$_installed"
fi
if [ ! -f "$_compiled" ] || [ "$(cat "$_compiled")" != "$_sum" ]; then
  # compileall skips files whose byte-code is current, so a run cut short resumes; its exit
  # status is ignored (a few packages ship files for newer Pythons that cannot compile here).
  if [ "$_mode" = background ]; then
    # One compiler at a time: a restart while it runs leaves it be (its pid is in .venv).
    if ! kill -0 "$(cat .venv/.vrambudget-compiling 2>/dev/null)" 2>/dev/null; then
      echo "byte-compiling .venv in the background (until it ends, a trace worker starts" \
        "slower)" >&2
      (nice -n 10 .venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null 2>&1 || true
        echo "$_sum" > "$_compiled"
        rm -f .venv/.vrambudget-compiling) </dev/null >/dev/null 2>&1 &
      echo "$!" > .venv/.vrambudget-compiling
    fi
  else
    echo "byte-compiling .venv ..." >&2
    .venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null 2>&1 || true
    echo "$_sum" > "$_compiled"
  fi
fi
unset _extras _mode _sum _installed _compiled _links _dir
