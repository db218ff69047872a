#!/usr/bin/env bash
# Fill bench/gpu/wheels/ here, where pip reaches the index, with what campaign.sh installs on a
# bare GPU machine (its python3 has torch, transformers, peft, accelerate and nvidia-ml-py, and
# nothing can be fetched there): msgspec (the version this checkout's venv runs) and the
# transformers and peft this project pins (pyproject.toml, the trace extra) -- the code the
# trace tier follows. campaign.sh falls back to the machine's own transformers/peft when the
# carried ones do not import there.
#
#   bash bench/gpu/prepare.sh              # for the device's Python 3.12 (PYVER=3.11 ... to change)
#
# The folder ignores itself (its own .gitignore), so the device call must carry it:
#   run(command="bash bench/gpu/campaign.sh", carry=["bench/gpu/wheels"], timeout_s=540)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DEST=$HERE/wheels
PYVER=${PYVER:-3.12}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3

read -r -a PINS <<<"$("$PY" - "$ROOT/pyproject.toml" <<'EOF'
import importlib.metadata as md
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
trace = {
    r.split("==")[0].strip().lower(): r.strip()
    for r in project["optional-dependencies"]["trace"]
    if "==" in r
}
try:
    msgspec = f"msgspec=={md.version('msgspec')}"
except md.PackageNotFoundError:
    msgspec = "msgspec"
print(msgspec, trace["transformers"], trace["peft"])
EOF
)"

rm -rf "$DEST"
mkdir -p "$DEST"
printf '# filled by prepare.sh, carried to the GPU machine, never committed\n*\n' >"$DEST/.gitignore"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    -d "$DEST" "${PINS[@]}"
echo "prepare.sh: ${PINS[*]} for Python $PYVER in $DEST ($(du -sh "$DEST" | cut -f1)):"
ls -1 "$DEST"
