#!/usr/bin/env bash
# The GPU campaign on a bare CUDA machine (bench/gpu/campaign.py says what it measures): installs
# the wheels bench/gpu/prepare.sh left in bench/gpu/wheels/ into a scratch folder (no network,
# no other package touched), then runs the matrix with the machine's python3. Under 8 minutes on
# one H100/H200; one JSON file, $OUT/gpu_campaign.json where $OUT is set (plus campaign.log,
# stack_overheads.json and generate_ratchet.json).
#
#   bash bench/gpu/campaign.sh [OUT.json] [--dry-run] [--budget-s S] [--only NAME]...
#
# From this workplace's device tool, after bench/gpu/prepare.sh here (the device's copy of .git
# may be older than the tree it runs, so name the commit; commit first):
#   run(command="VRAMBUDGET_COMMIT=<this checkout's HEAD> bash bench/gpu/campaign.sh",
#       carry=["bench/gpu/wheels"], timeout_s=540)
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
SITE=${CAMPAIGN_SITE:-${TMPDIR:-/tmp}/vrambudget-campaign}
export PYTHONUNBUFFERED=1
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

install() { # target wheel...
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --upgrade --target "$@"
}

base=() framework=()
for w in "$HERE"/wheels/*.whl; do
    [ -e "$w" ] || continue
    case $(basename "$w") in
    transformers-* | peft-*) framework+=("$w") ;;
    *) base+=("$w") ;;
    esac
done
rm -rf "$SITE"
if [ ${#base[@]} -gt 0 ]; then
    install "$SITE/base" "${base[@]}" || exit 2
    PYTHONPATH="$SITE/base:$PYTHONPATH"
fi
# transformers and peft as pinned, unless they refuse this machine's packages (their versions)
check() { "$PY" -c "import msgspec, torch, transformers, peft; from transformers import Qwen2ForCausalLM"; }
if [ ${#framework[@]} -gt 0 ]; then
    install "$SITE/framework" "${framework[@]}" || exit 2
    if PYTHONPATH="$SITE/framework:$PYTHONPATH" check 2>"$SITE/framework.err"; then
        PYTHONPATH="$SITE/framework:$PYTHONPATH"
    else
        echo "campaign.sh: the carried transformers/peft do not import here:" >&2
        tail -n 3 "$SITE/framework.err" >&2
        framework=()
    fi
fi
export PYTHONPATH
if [ ${#framework[@]} -eq 0 ] && ! check; then
    echo "campaign.sh: msgspec, torch, transformers or peft missing for $PY;" \
        "run bench/gpu/prepare.sh where pip works and carry bench/gpu/wheels" >&2
    exit 2
fi
echo "campaign.sh: ready after ${SECONDS} s (PYTHONPATH=$PYTHONPATH)"

if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    "$PY" -m bench.gpu.campaign "$@" 2>&1 | tee "$OUT/campaign.log"
else
    "$PY" -m bench.gpu.campaign "$@"
fi
rc=$?
# After the matrix, not in a dry run (they need CUDA): the stack's own overheads (CUDA context
# lazy/eager, each first kernel's images; ~25 s) and the reserved memory over repeated
# generate calls (its first series took ~45 s on an H100; the file is rewritten after each
# series, so the 90 s limit keeps the series it finished).
case " $* " in
*" --dry-run "*) ;;
*)
    for script in stack_overheads generate_ratchet; do
        timeout 90 "$PY" "bench/gpu/$script.py" "${OUT:-bench/results}/$script.json" ||
            echo "campaign.sh: $script.py failed (exit $?)" >&2
    done
    ;;
esac
echo "campaign.sh: ${SECONDS} s in all, exit $rc"
exit $rc
