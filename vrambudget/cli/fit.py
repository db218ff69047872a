"""``vrambudget fit``: which GPUs a workload fits, at which device counts, and the largest batch,
context or concurrency on each -- the answer of ``POST /v1/fits`` computed in this process, as a
table (or its JSON).

    vrambudget fit --model llama-3.1-8b --batch 8 --prompt 4096     # every catalog GPU
    vrambudget fit --model llama-3.1-70b --gpu h100-sxm5-80gb --gpu l40s-48gb --counts 1,2,4,8
    vrambudget fit --kind llm_serving --model llama-3.1-8b --max-model-len 32768 \\
        --target-concurrency 16
    vrambudget fit --file fit-request.json --json                   # a FitRequest

The exit status says whether anything fits: 0 when at least one layout of one GPU does, 3 when
none does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, get_args

import msgspec

from .catalog import print_table
from .errors import EXIT_CODES, EXIT_DOES_NOT_FIT, EXIT_FITS, report
from .workload_args import (
    DESKTOP_ARG,
    FLAG_OF,
    UsageError,
    add_workload_args,
    reject_with_file,
    request_fields,
    workload_from_args,
)

__all__ = ["add_parser"]

GiB = 1 << 30


def _csv_ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None


def _request(args: argparse.Namespace) -> Any:
    from vrambudget.core.spec import FitRequest

    gpus = [g.strip() for item in args.gpu for g in item.split(",") if g.strip()]
    if args.memory_in_use and not gpus:
        raise UsageError("--memory-in-use needs --gpu: the devices whose memory others hold")
    if args.desktop and not gpus:
        raise UsageError("--desktop needs --gpu: the devices that drive the desktop")
    held: dict[str, object] = (
        {"memory_in_use_bytes": round(args.memory_in_use * (1 << 30))} if args.memory_in_use else {}
    )
    if args.desktop:
        held["desktop_session"] = args.desktop
    devices = [{"source": "catalog", "id": g, **held} for g in gpus]
    if args.file:
        reject_with_file(args)
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        data = msgspec.json.decode(raw)
        if devices and isinstance(data, dict):  # --gpu names the devices of the file's request
            data["devices"] = devices
        return msgspec.convert(data, FitRequest)
    body: dict[str, Any] = {"workloads": [workload_from_args(args, "fit")], **request_fields(args)}
    if devices:
        body["devices"] = devices
    if args.counts:
        body["device_counts"] = args.counts
    if args.solve:
        body["solve"] = args.solve
    if args.target_concurrency is not None:
        body["target_concurrency"] = args.target_concurrency
    if args.max_device_count is not None:
        body["max_device_count"] = args.max_device_count
    return msgspec.convert(body, FitRequest)


def _verdict_words(lay: Any) -> str:
    """The verdict as the fit table (``/ui/fits``) words it: never "fits" where the total with
    its headroom exceeds the memory; ``fits_if_low`` reads "only if low"."""
    if lay.verdict == "fits_if_low":
        return "only if low"
    return "fits" if lay.verdict == "fits" and lay.fits else "does not fit"


def _maxima(m: Any) -> str:
    """The solved maxima of a layout, in words (``-`` when none was solved)."""
    parts = []
    if m.batch_size is not None:
        parts.append(f"batch {m.batch_size:,}")
    if m.context_tokens is not None:
        limit = " (model limit)" if m.context_limited_by_model else ""
        parts.append(f"context {m.context_tokens:,}{limit}")
    if m.concurrent_requests is not None and m.max_concurrency is None:
        parts.append(f"concurrency {m.concurrent_requests:,}")
    if m.max_concurrency is not None:
        parts.append(f"concurrency {m.max_concurrency:g}")
    if m.max_model_len is not None:
        parts.append(f"max_model_len {m.max_model_len:,}")
    if m.n_gpu_layers is not None:
        parts.append(f"gpu layers {m.n_gpu_layers}")
    if m.file_type is not None:
        parts.append(f"file type {m.file_type}")
    return ", ".join(parts) or "-"


def print_fit(answer: Any, show_all: bool, solved_count: bool) -> None:
    """The fit as a table, smallest GPU first: one row per GPU and device count (unless
    ``show_all``, the layouts that fit or fit if the real peak is low, and each GPU's first),
    its ``GiB`` what each device leaves the workload (its total less what other processes
    hold),
    with the smallest device count that fits (``min n``; ``none`` when none up to the
    request's maximum does); below it, the warnings of the rows that do not fit (often why)."""
    headers = ("gpu", "GiB", "n", "verdict", "used GiB", "free GiB", "limiting", "min n", "maxima")
    rows: list[tuple[str, ...]] = []
    why: list[str] = []
    for g in sorted(answer.gpus, key=lambda g: (g.memory_total_bytes, g.gpu_id or g.name)):
        smallest = "-" if not solved_count else str(g.min_device_count or "none")
        for i, lay in enumerate(g.layouts):
            if not (show_all or lay.fits or lay.verdict != "does_not_fit" or i == 0):
                continue
            rows.append(
                (
                    g.gpu_id or g.name,
                    f"{lay.capacity_bytes / GiB:.2f}",  # the total less what others hold
                    str(lay.device_count),
                    _verdict_words(lay),
                    f"{lay.total_bytes / GiB:.2f}",
                    f"{lay.free_bytes / GiB:.2f}",
                    lay.limiting_component.value,
                    smallest,
                    _maxima(lay.maxima),
                )
            )
            if not lay.fits:
                why += [f"{g.gpu_id or g.name} x{lay.device_count}: {w}" for w in lay.warnings]
    if rows:
        print_table(headers, rows, {1, 2, 4, 5, 7})
    if why:
        print()
    for line_ in why:
        print(f"note: {line_}")
    if answer.cheapest is not None:
        c = answer.cheapest
        basis = f"cost {c.cost:g}" if c.basis == "price" else "the fewest devices"
        print(f"\ncheapest: {c.gpu_id or c.name} x{c.device_count} ({basis})")
    for e in answer.excluded:
        failing = "; ".join(ch.reason for ch in e.compatibility.checks if ch.verdict != "supported")
        print(f"excluded: {e.gpu_id or e.name}: {failing}")
    for g in answer.gpus:
        for w in g.warnings:
            print(f"warning: {g.gpu_id or g.name}: {w}")
    for w in answer.warnings:
        print(f"warning: {w}")


def _run(args: argparse.Namespace) -> int:
    from vrambudget.core.errors import BudgetError
    from vrambudget.core.fit import fit
    from vrambudget.core.spec import FitRequest

    from .progress import progress
    from .workload_args import model_resolver

    try:
        req = _request(args)
        with progress("resolving the model"):
            req = msgspec.structs.replace(req, workloads=model_resolver()(req.workloads))
        n = "every catalog GPU" if req.devices is None else f"{len(req.devices)} GPU(s)"
        with progress(f"fitting on {n}"):
            answer = fit(req)
    except (UsageError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (msgspec.ValidationError, msgspec.DecodeError, BudgetError) as exc:
        return report(exc, FitRequest, FLAG_OF)
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(answer)).decode() + "\n")
    else:
        print_fit(answer, args.all, "device_count" in req.solve)
    fits = any(lay.fits for g in answer.gpus for lay in g.layouts)
    return EXIT_FITS if fits else EXIT_DOES_NOT_FIT


def add_parser(sub: Any) -> None:
    from vrambudget.core.spec import FitVariable

    p = sub.add_parser(
        "fit",
        help="which GPUs a workload fits, at which device counts, with the largest batch / "
        "context / concurrency (POST /v1/fits)",
        description=__doc__,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--file",
        metavar="FILE",
        help="a FitRequest as JSON ('-' for stdin) instead of the workload flags",
    )
    add_workload_args(p)
    f = p.add_argument_group("the fit")
    f.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="ID[,ID...]",
        help="catalog GPU ids to check (repeat or comma-separate; `vrambudget gpus` lists "
        "them); default: the whole catalog",
    )
    f.add_argument(
        "--memory-in-use",
        metavar="GIB",
        type=float,
        default=0.0,
        help="GiB other processes already hold on each --gpu (a desktop, another server: "
        "nvidia-smi's used memory with nothing of yours running)",
    )
    f.add_argument("--desktop", **DESKTOP_ARG)
    f.add_argument(
        "--counts",
        type=_csv_ints,
        metavar="N[,N...]",
        help="devices per replica to check, e.g. 1,2,4,8 (default 1)",
    )
    f.add_argument(
        "--solve",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        metavar="VAR[,VAR...]",
        help="maxima to solve (default all that apply): " + ", ".join(get_args(FitVariable)),
    )
    f.add_argument(
        "--target-concurrency",
        type=float,
        metavar="N",
        help="llm_serving: a layout fits when the engine holds at least N requests of "
        "max_model_len at once (default: when it starts)",
    )
    f.add_argument(
        "--max-device-count",
        type=int,
        metavar="N",
        help="the largest device count tried for the smallest that fits (default 64)",
    )
    f.add_argument(
        "--all",
        action="store_true",
        help="print every layout (default: the ones that fit or fit only if low, and each "
        "GPU's first)",
    )
    f.add_argument("--json", action="store_true", help="print the FitResponse JSON")
    p.set_defaults(func=_run)
