"""What one replica of the calculation service holds: requests/s, latency and memory.

Starts ``vrambudget serve`` on 127.0.0.1 as a Deployment's pod runs it (the compute and trace
worker counts given explicitly, not derived from the host's cores), then drives a mix of
requests with wrk at increasing concurrency, each level ``--rounds`` times for ``--duration``
seconds, and reports per level the median requests/s, the median p50 / p99 latency, errors, and
the CPU the server's process tree used (cores = CPU seconds / wall seconds, from
``/proc/PID/stat`` of the server and every worker). A sampler reads the process tree's memory
every 0.2 s: the sum of RSS (what ``ps`` shows; shared library pages count once per process)
and the sum of PSS (shared pages divided among the processes that map them: the tree's real
footprint, closer to what the container's cgroup charges). Last, an optional trace phase sends
``--trace-requests`` distinct ``method: trace`` budgets, so the peak includes a trace worker
with torch and transformers loaded and a 70B trace's recording (the largest memory the
replica reaches).

Every request body is unique (no answer is served from the answer cache), so the throughput is
the replica's computing rate -- the lower bound; repeated requests (a catalog page's views) are
answered from the cache several times faster (docs/PERFORMANCE.md, HTTP throughput).

The mix (``MIX``): per 20 requests, 12 inference budgets, 3 training budgets, 3 ``llm_serving``
budgets and 2 whole-catalog fits, over four models with batch sizes / lengths counting up.

wrk runs on the same machine (``-t1``): it takes CPU from the server, so on a small shared
machine the figures are a lower bound of what a replica holds on its own cores.

    .venv/bin/python bench/replica_capacity.py --json /tmp/capacity-1.json   # defaults below
    .venv/bin/python bench/replica_capacity.py --levels 1,4,16 --rounds 3 --duration 10 \
        --compute-workers 2 --json /tmp/capacity-2.json
    .venv/bin/python bench/replica_capacity.py --summarize /tmp/capacity-*.json

Needs wrk (``apt-get install wrk``). Everything stops by itself: the whole run is bounded by
``--max-seconds`` (the server is killed at the end in any case).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# wrk script: every request a different body (a counter in each), so the answer cache never
# answers; 20 requests make one turn of the mix.
MIX = r"""
local counter = tonumber(os.getenv("CAPACITY_OFFSET") or "0")
local models = {"llama-3.1-8b", "qwen2.5-7b", "mixtral-8x7b", "gemma-2-9b"}
local device = ',"device":{"source":"catalog","id":"h100-sxm5-80gb"}'
request = function()
  counter = counter + 1
  local model = '{"source":"preset","id":"' .. models[(counter % #models) + 1] .. '"}'
  local turn = counter % 20
  local path = "/v1/budgets"
  local body
  if turn == 0 or turn == 10 then
    path = "/v1/fits"
    body = '{"workloads":[{"kind":"inference","model":' .. model .. ',"batch_size":'
      .. tostring(1 + counter % 64) .. ',"prompt_tokens":' .. tostring(1024 + counter % 8192)
      .. ',"generated_tokens":256}]}'
  elseif turn == 5 or turn == 15 or turn == 7 then
    body = '{"workloads":[{"kind":"llm_serving","model":' .. model .. ',"max_model_len":'
      .. tostring(1024 + counter % 30000) .. '}]' .. device .. '}'
  elseif turn == 3 or turn == 13 or turn == 17 then
    body = '{"workloads":[{"kind":"training","model":' .. model .. ',"micro_batch_size":'
      .. tostring(1 + counter % 16) .. ',"sequence_length":' .. tostring(512 + counter % 4096)
      .. ',"parallelism":{"data":8,"zero_stage":3}}]' .. device .. '}'
  else
    body = '{"workloads":[{"kind":"inference","model":' .. model .. ',"batch_size":'
      .. tostring(1 + counter % 1000000) .. ',"prompt_tokens":' .. tostring(512 + counter % 7)
      .. ',"generated_tokens":256}]' .. device .. '}'
  end
  return wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
end
"""

# Traces of the largest presets (dense 70B and 405B, the MoE Mixtral 8x22B), one after the other:
# the memory peak of a trace worker (a trace past the service's time limit is answered 422; its
# peak counts all the same).
TRACE_MODELS = ("llama-3.1-70b", "llama-3.1-405b", "mixtral-8x22b")
TRACE_BODY = (
    '{"method":"trace","workloads":[{"kind":"inference","model":{"source":"preset",'
    '"id":"%s"},"batch_size":8,"prompt_tokens":4096,"generated_tokens":256}],'
    '"device":{"source":"catalog","id":"h100-sxm5-80gb"}}'
)


@dataclass
class Run:
    connections: int
    rps: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int
    cores: float
    main_cores: float


@dataclass
class Level:
    connections: int
    runs: list[Run]
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cores: float = 0.0
    main_cores: float = 0.0
    errors: int = 0


@dataclass
class Report:
    command: str
    compute_workers: int
    trace_workers: int
    duration_s: float
    rounds: int
    cpu_count: int
    loadavg_before: tuple[float, float, float]
    loadavg_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    levels: list[Level] = field(default_factory=list)
    start_rss_bytes: int = 0
    peak_rss_bytes: int = 0
    peak_pss_bytes: int = 0
    peak_rss_bytes_analytic: int = 0
    peak_pss_bytes_analytic: int = 0
    peak_processes: int = 0
    trace_seconds: list[float] = field(default_factory=list)


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it (the worker pools are its children)."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            out += tree(int(child))
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / CLK_TCK


def memory(pids: list[int]) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) in bytes."""
    rss = pss = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for key, value in re.findall(r"^(Rss|Pss):\s+(\d+) kB", text, re.M):
            if key == "Rss":
                rss += int(value) * 1024
            else:
                pss += int(value) * 1024
    return rss, pss


class Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.stop = threading.Event()
        self.peak_rss = self.peak_pss = self.peak_processes = 0

    def run(self) -> None:
        while not self.stop.wait(0.2):
            pids = tree(self.pid)
            rss, pss = memory(pids)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_processes = max(self.peak_processes, len(pids))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(port: int, compute_workers: int, trace_workers: int) -> Iterator[int]:
    exe = Path(sys.executable).with_name("vrambudget")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "VRAMBUDGET_COMPUTE_WORKERS": str(compute_workers),
        "VRAMBUDGET_TRACE_WORKERS": str(trace_workers),
    }
    proc = subprocess.Popen(
        [str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("the service did not become ready within 60 s")
        yield proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def wrk(
    port: int, script: Path, connections: int, duration: float, offset: int
) -> dict[str, float]:
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{duration:g}s",
            "--latency",
            "--timeout",
            "30s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "CAPACITY_OFFSET": str(offset)},
        timeout=duration + 60,
    ).stdout
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": _ms(lat["50"]),
        "p99_ms": _ms(lat["99"]),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(int(x) for x in sock.groups()) if sock else 0,
    }


def post(port: int, body: str, timeout: float) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/budgets",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:  # a 422 (trace past its time limit) is an answer
        return int(exc.code)


def measure(args: argparse.Namespace) -> Report:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    started = time.monotonic()
    levels = [int(x) for x in args.levels.split(",")]
    report = Report(
        command=" ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        compute_workers=args.compute_workers,
        trace_workers=args.trace_workers,
        duration_s=args.duration,
        rounds=args.rounds,
        cpu_count=os.cpu_count() or 0,
        loadavg_before=os.getloadavg(),
    )
    port = free_port()
    with (
        tempfile.TemporaryDirectory() as tmp,
        server(port, args.compute_workers, args.trace_workers) as pid,
    ):
        script = Path(tmp) / "mix.lua"
        script.write_text(MIX)
        report.start_rss_bytes = memory(tree(pid))[0]
        sampler = Sampler(pid)
        sampler.start()
        # Warm-up: start the compute workers, build each model's statics once per worker.
        wrk(port, script, max(levels), args.warmup, offset=10**9)
        offset = 0
        for _ in range(args.rounds):
            for connections in levels:  # rounds alternate over the levels: drift hits all
                if time.monotonic() - started > args.max_seconds:
                    raise SystemExit(f"stopped: past --max-seconds {args.max_seconds:g}")
                before, main_before = cpu_seconds(tree(pid)), cpu_seconds([pid])
                t0 = time.monotonic()
                result = wrk(port, script, connections, args.duration, offset)
                wall = time.monotonic() - t0
                cores = (cpu_seconds(tree(pid)) - before) / wall
                main_cores = (cpu_seconds([pid]) - main_before) / wall
                offset += 10**7
                level = next((x for x in report.levels if x.connections == connections), None)
                if level is None:
                    level = Level(connections=connections, runs=[])
                    report.levels.append(level)
                level.runs.append(
                    Run(connections=connections, cores=cores, main_cores=main_cores, **result)  # type: ignore[arg-type]
                )
                errors = result["non_2xx"] + result["socket_errors"]
                print(
                    f"c={connections:3d}  {result['rps']:8.1f} req/s"
                    f"  p50 {result['p50_ms']:7.2f} ms  p99 {result['p99_ms']:7.2f} ms"
                    f"  cores {cores:4.2f} (server {main_cores:4.2f})  errors {errors:.0f}",
                    flush=True,
                )
        report.peak_rss_bytes_analytic = sampler.peak_rss
        report.peak_pss_bytes_analytic = sampler.peak_pss
        for i in range(args.trace_requests):
            if time.monotonic() - started > args.max_seconds:
                break
            t0 = time.monotonic()
            model = TRACE_MODELS[i % len(TRACE_MODELS)]
            status = post(port, TRACE_BODY % model, timeout=args.trace_timeout)
            report.trace_seconds.append(time.monotonic() - t0)
            print(f"trace {model}: {status} in {report.trace_seconds[-1]:.1f} s", flush=True)
        time.sleep(0.5)
        sampler.stop.set()
        sampler.join()
        report.peak_rss_bytes = sampler.peak_rss
        report.peak_pss_bytes = sampler.peak_pss
        report.peak_processes = sampler.peak_processes
    for level in report.levels:
        level.rps = statistics.median(r.rps for r in level.runs)
        level.p50_ms = statistics.median(r.p50_ms for r in level.runs)
        level.p99_ms = statistics.median(r.p99_ms for r in level.runs)
        level.cores = statistics.median(r.cores for r in level.runs)
        level.main_cores = statistics.median(r.main_cores for r in level.runs)
        level.errors = sum(r.non_2xx + r.socket_errors for r in level.runs)
    report.loadavg_after = os.getloadavg()
    return report


def table(report: Report) -> str:
    mib = 2**20
    lines = [
        f"compute workers {report.compute_workers}, trace workers {report.trace_workers}; "
        f"{report.rounds} rounds x {report.duration_s:g} s per level; {report.cpu_count} CPUs; "
        f"load average before {report.loadavg_before[0]:.2f}, after {report.loadavg_after[0]:.2f}",
        "",
        "| connections | req/s (median; each round) | p50 | p99 | cores: all (server process) "
        "| errors |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for lv in report.levels:
        each = " / ".join(f"{r.rps:.0f}" for r in lv.runs)
        lines.append(
            f"| {lv.connections} | **{lv.rps:.0f}** ({each}) | {lv.p50_ms:.2f} ms "
            f"| {lv.p99_ms:.2f} ms | {lv.cores:.2f} ({lv.main_cores:.2f}) | {lv.errors} |"
        )
    lines += [
        "",
        f"memory of the process tree: at start {report.start_rss_bytes / mib:.0f} MiB RSS; "
        f"peak under the analytic mix {report.peak_rss_bytes_analytic / mib:.0f} MiB RSS / "
        f"{report.peak_pss_bytes_analytic / mib:.0f} MiB PSS; peak with traces "
        f"{report.peak_rss_bytes / mib:.0f} MiB RSS / {report.peak_pss_bytes / mib:.0f} MiB PSS "
        f"({report.peak_processes} processes)",
    ]
    if report.trace_seconds:
        lines.append("traces: " + ", ".join(f"{s:.1f} s" for s in report.trace_seconds))
    return "\n".join(lines)


def summarize(paths: list[Path]) -> str:
    """Across runs (``--json`` files): each run's capacity (the load level with the most
    requests/s), the median capacity, the requests/s per core used and the server process's
    share of the CPU (medians over every wrk run), and the largest memory peak."""
    reports = [json.loads(p.read_text()) for p in paths]
    lines = ["| run | capacity req/s | at connections | p50 | p99 | cores | load average |"]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    capacities = []
    for path, r in zip(paths, reports, strict=True):
        best = max(r["levels"], key=lambda lv: lv["rps"])
        capacities.append(best["rps"])
        lines.append(
            f"| {path.name} | {best['rps']:.0f} | {best['connections']} | {best['p50_ms']:.2f} ms"
            f" | {best['p99_ms']:.2f} ms | {best['cores']:.2f} | {r['loadavg_before'][0]:.2f}"
            f" -> {r['loadavg_after'][0]:.2f} |"
        )
    runs = [run for r in reports for lv in r["levels"] for run in lv["runs"]]
    per_core = statistics.median(run["rps"] / run["cores"] for run in runs)
    share = statistics.median(run["main_cores"] / run["cores"] for run in runs)
    mib = 2**20
    lines += [
        "",
        f"capacity, median of {len(reports)} runs: {statistics.median(capacities):.0f} req/s",
        f"req/s per core used, median of {len(runs)} wrk runs: {per_core:.0f}",
        f"the server process's share of the CPU, median: {share:.2f}"
        f" -> ceiling (server process at one core): {per_core / share:.0f} req/s"
        f" on {1 / share:.2f} cores",
        f"peak memory of the process tree, largest of the runs: "
        f"{max(r['peak_rss_bytes'] for r in reports) / mib:.0f} MiB RSS, "
        f"{max(r['peak_pss_bytes'] for r in reports) / mib:.0f} MiB PSS; without traces "
        f"{max(r['peak_rss_bytes_analytic'] for r in reports) / mib:.0f} MiB RSS",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,2,4,8,16,32", help="wrk connections per level")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--compute-workers", type=int, default=2)
    parser.add_argument("--trace-workers", type=int, default=1)
    parser.add_argument("--trace-requests", type=int, default=len(TRACE_MODELS))
    parser.add_argument("--trace-timeout", type=float, default=120.0)
    parser.add_argument("--max-seconds", type=float, default=1200.0)
    parser.add_argument("--json", type=Path, help="also write the report as JSON")
    parser.add_argument(
        "--summarize", type=Path, nargs="+", metavar="JSON", help="summarize earlier runs' JSON"
    )
    args = parser.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return
    report = measure(args)
    print()
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")


if __name__ == "__main__":
    main()
