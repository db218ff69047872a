#!/usr/bin/env bash
# HTTP throughput of POST /v1/budgets against the trivial GET /healthz of the same app, measured
# side by side in one run: one uvicorn worker on 127.0.0.1, wrk with 2 threads / 32 connections,
# ROUNDS alternating 10 s runs, medians reported. Two budget loads: the same body repeated
# (served by the answer cache, as a catalog page's repeated views are) and a unique body per
# request (every answer computed). Needs wrk (apt-get install wrk).
#   bash bench/http_throughput.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
PORT="${PORT:-8791}"
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 2; }
.venv/bin/vrambudget serve --host 127.0.0.1 --port "$PORT" --log-level warning &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.1; done
curl -sf -X POST -H 'content-type: application/json' \
  -d "$(sed -n "s/^wrk.body = '\(.*\)'$/\1/p" bench/budget_post.lua)" \
  "http://127.0.0.1:$PORT/v1/budgets" >/dev/null
rps() { wrk -t2 -c32 -d10s --latency "$@" | awk '/Requests\/sec/ {print $2}'; }
trivial=(); repeated=(); unique=()
for _ in $(seq "$ROUNDS"); do
  trivial+=("$(rps "http://127.0.0.1:$PORT/healthz")")
  repeated+=("$(rps -s bench/budget_post.lua "http://127.0.0.1:$PORT/v1/budgets")")
  unique+=("$(rps -s bench/budget_post_unique.lua "http://127.0.0.1:$PORT/v1/budgets")")
done
python3 - "${trivial[*]}" "${repeated[*]}" "${unique[*]}" <<'PY'
import statistics, sys
t, r, u = ([float(x) for x in arg.split()] for arg in sys.argv[1:4])
print("GET  /healthz                  req/s:", t, "median", statistics.median(t))
print("POST /v1/budgets, same body    req/s:", r, "median", statistics.median(r))
print("POST /v1/budgets, unique bodies req/s:", u, "median", statistics.median(u))
print(f"ratio same-body / healthz:   {statistics.median(r) / statistics.median(t):.3f}")
print(f"ratio unique-body / healthz: {statistics.median(u) / statistics.median(t):.3f}")
PY
