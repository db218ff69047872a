#!/usr/bin/env bash
# Soak: one `vrambudget serve` process on 127.0.0.1, wrk (2 threads, 16 connections) sending a
# unique body per request (bench/soak_unique.lua) -- a 10 s warm-up, then two 30 s halves of the
# 60 s soak. Prints per run: requests/s, p50/p99 latency, errors (socket errors and non-2xx), and
# the RSS of the server and its worker processes after the warm-up and after each half (flat
# after warm-up = bounded memory).
# Needs wrk (apt-get install wrk). Traffic goes to 127.0.0.1 only and stops by itself.
#   bash bench/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-8792}"
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 2; }
# The server's log (an access line per request) goes to a file, as in a deployment.
.venv/bin/vrambudget serve --host 127.0.0.1 --port "$PORT" --log-level warning \
  > /tmp/soak-server.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.1; done
# uvicorn may run the app in a child of the launcher: measure the process that listens.
PID=$(ss -ltnp "sport = :$PORT" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
# RSS of the server and every process below it (the compute and trace worker pools).
tree() { echo "$1"; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree "$c"; done; }
rss() { for p in $(tree "$PID"); do awk '/VmRSS/ {print $2 * 1024}' "/proc/$p/status" 2>/dev/null; done \
  | awk '{s += $1} END {print s}'; }
run() {  # label offset seconds
  SOAK_OFFSET="$2" wrk -t2 -c16 -d"$3"s --latency -s bench/soak_unique.lua \
    "http://127.0.0.1:$PORT/v1/budgets" > "/tmp/soak-$1.txt"
  python3 - "$1" "/tmp/soak-$1.txt" "$(rss)" <<'PY'
import re, sys
label, path, rss = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(path).read()
rps = re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)
lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", text, re.M))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
sock = re.search(r"Socket errors: (.*)", text)
print(f"{label:8} req/s {rps:>9}  p50 {lat.get('50')}  p99 {lat.get('99')}  "
      f"non-2xx {non2xx.group(1) if non2xx else 0}  socket errors {sock.group(1) if sock else 'none'}"
      f"  RSS after {rss / 2**20:.1f} MiB")
PY
}
echo "RSS at start: $(( $(rss) / 1048576 )) MiB"
run warmup 0 10
run soak-1 10000000 30
run soak-2 20000000 30
