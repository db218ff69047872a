# Shared by scripts/serve, scripts/test and scripts/lint (sourced, with the extras as $1): create
# .venv and install the project with those extras at the versions pinned in requirements-lock.txt
# -- only when pyproject.toml, the lock or this script changed since the last install of the same
# extras (a stamp in .venv holds their checksum), so that a restart spends nothing here.
#
# Installers: uv (pinned below, installed into .venv by pip) for everything but torch, which pip
# installs first. pip takes the torch CPU build that lies on the development machines' disk (its
# find-links); uv looks only at PyPI, whose Linux x86_64 torch is a multi-GB CUDA build. With
# torch installed, uv keeps it and installs its dependencies from its metadata.
# VRAMBUDGET_REINSTALL=1 installs even when the stamp matches.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VRAMBUDGET_UV_VERSION=0.13.8
_extras="$1"
_stamp=".venv/.vrambudget-installed-${_extras//,/+}"
_want="$(cat pyproject.toml requirements-lock.txt scripts/_venv.sh | cksum)"
if [ -x .venv/bin/python ] && [ "${VRAMBUDGET_REINSTALL:-0}" != 1 ] && [ -f "$_stamp" ] \
  && [ "$(cat "$_stamp")" = "$_want" ]; then
  : # installed, and nothing it was installed from has changed
else
  echo "setting up .venv (extras: $_extras) ..." >&2
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
  fi
  rm -f "$_stamp"
  if ! .venv/bin/uv --version 2>/dev/null | grep -qx "uv $VRAMBUDGET_UV_VERSION"; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check \
      "uv==$VRAMBUDGET_UV_VERSION"
  fi
  case ",$_extras," in
    *,trace,* | *,agent,* | *,dev,*)
      # The extras that need torch; its pin is the one in pyproject.toml. No byte-compiling:
      # the service never imports torch, and a trace worker writes what it imports on first use.
      .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
        --no-compile "$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')"
      ;;
  esac
  .venv/bin/uv pip install --quiet --python .venv/bin/python \
    --constraint requirements-lock.txt --editable ".[$_extras]"
  echo "$_want" > "$_stamp"
fi
unset _extras _stamp _want
