"""``vrambudget calibrate``: build calibration profiles from probe reports.

    vrambudget calibrate --store agent-data/agent.sqlite3 --out profiles/
    vrambudget calibrate --store agent-data/agent.sqlite3 --probe 3f2a... --probe 91bc... --out p/
    vrambudget calibrate probe.json callback.json --out profiles/

Reports are read from the agent's SQLite file (``--store``; every succeeded CUDA probe, or the
``--probe`` ids) and/or JSON files: a probe resource (``GET /v1/probes/{id}``), a webhook body
(``{"type": ..., "data": <probe>}``) or a list of either. One profile is written per GPU model
and software (torch, CUDA, driver) group, as ``<out>/<profile id>.json``; point the service at
the directory with ``VRAMBUDGET_PROFILES_DIR``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    cal = sub.add_parser(
        "calibrate",
        help="build calibration profiles from probe reports",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cal.add_argument("files", nargs="*", help="probe resource / webhook JSON files ('-': stdin)")
    cal.add_argument("--store", help="the agent's SQLite file (agent-data/agent.sqlite3)")
    cal.add_argument(
        "--probe",
        action="append",
        default=[],
        help="probe id to use (repeat; default: every succeeded CUDA probe in --store)",
    )
    cal.add_argument("--out", required=True, help="directory to write the profiles to")
    cal.set_defaults(func=run)


def _reports_from_json(raw: bytes, origin: str) -> list[Any]:
    from vrambudget.core.probe_report import ProbeResource

    doc = msgspec.json.decode(raw)
    items = doc if isinstance(doc, list) else [doc]
    out = []
    for item in items:
        if isinstance(item, dict) and "data" in item and "type" in item:
            item = item["data"]  # a webhook body
        try:
            out.append(msgspec.convert(item, ProbeResource))
        except msgspec.ValidationError as exc:
            raise ValueError(f"{origin}: not a probe report: {exc}") from None
    return out


def _reports_from_store(path: str, ids: list[str]) -> list[Any]:
    from vrambudget.agent.store import Store
    from vrambudget.core.probe_report import ProbeRequest, ProbeResource, ProbeResult

    if not Path(path).is_file():
        raise ValueError(f"--store {path}: no such file")
    out = []
    with Store(Path(path)) as store:
        if ids:
            rows = []
            for probe_id in ids:
                row = store.get_probe(probe_id)
                if row is None:
                    raise ValueError(f"--probe {probe_id}: not in {path}")
                rows.append(row)
        else:
            rows, cursor = [], None
            while True:
                page, cursor = store.list_probes(500, cursor)
                rows += [
                    r
                    for r in page
                    if r.status == "succeeded"
                    and r.result
                    and '"device":"cuda"' in r.result.replace(" ", "")
                ]
                if cursor is None:
                    break
        for r in rows:
            out.append(
                ProbeResource(
                    id=r.id,
                    status=r.status,  # type: ignore[arg-type]
                    created_at=r.created_at,
                    updated_at=r.updated_at,
                    request=msgspec.json.decode(r.request, type=ProbeRequest),
                    result=msgspec.json.decode(r.result, type=ProbeResult) if r.result else None,
                    error=r.error,
                )
            )
    return out


def run(args: argparse.Namespace) -> int:
    from vrambudget.core.calibration import build_profiles
    from vrambudget.core.compare import estimate_input
    from vrambudget.core.errors import BudgetError
    from vrambudget.core.estimate import estimate
    from vrambudget.core.spec import Headroom

    try:
        reports = []
        for f in args.files:
            raw = sys.stdin.buffer.read() if f == "-" else Path(f).read_bytes()
            reports += _reports_from_json(raw, f)
        if args.store:
            stored = _reports_from_store(args.store, args.probe)
            if not stored and not args.probe:
                raise ValueError(
                    f"{args.store} has no succeeded CUDA probe (a CPU probe "
                    "measures no CUDA context, workspace or allocator overhead)"
                )
            reports += stored
        elif args.probe:
            raise ValueError("--probe needs --store")
        if not reports:
            raise ValueError("no probe reports: give --store and/or report files")
        inputs, skipped = [], []
        for report in reports:
            res = report.result
            if report.status != "succeeded" or res is None or res.device != "cuda":
                why = (
                    f"status {report.status}"
                    if report.status != "succeeded"
                    else "ran on the CPU: it measures no CUDA context, workspace or allocator "
                    "overhead"
                )
                skipped.append(f"{report.id}: {why}")
                continue
            if res.expandable_segments:
                # A profile's fractions are fixed segments' (expandable ones have their own).
                skipped.append(
                    f"{report.id}: ran with expandable_segments:True, whose fragmentation is "
                    "not the fixed-segment fraction a profile holds"
                )
                continue
            inp = estimate_input(report)
            budget = estimate((inp.workload,), inp.device, Headroom(fraction=0.0))
            inputs.append((report, budget, inp.gpu_id))
        for line in skipped:
            print(f"vrambudget calibrate: skipped {line}", file=sys.stderr)
        if not inputs:
            raise ValueError("no succeeded CUDA probe among the reports")
        now = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
        profiles = build_profiles(inputs, now)
    except (OSError, ValueError, msgspec.DecodeError, BudgetError) as exc:
        print(f"vrambudget calibrate: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for p in profiles:
        path = out / f"{p.id}.json"
        path.write_bytes(msgspec.json.format(msgspec.json.encode(p), indent=2) + b"\n")
        values = {
            k: getattr(p, k)
            for k in (
                "cuda_context_bytes",
                "workspace_bytes",
                "inference_fragmentation_fraction",
                "training_fragmentation_fraction",
            )
            if getattr(p, k) is not None
        }
        print(
            f"{path}: {p.gpu_name} (gpu {p.gpu_id}), torch {p.torch_version}, CUDA "
            f"{p.cuda_version}, driver {p.driver_version}; {len(p.probe_ids)} probe(s); "
            + ", ".join(f"{k}={v}" for k, v in values.items())
        )
    return 0
