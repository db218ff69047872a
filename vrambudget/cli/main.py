"""``vrambudget``: serve the API, or print a budget (and whether it fits) on the terminal.

    vrambudget serve [--host 127.0.0.1] [--port 8000]
    vrambudget estimate --model llama-3.1-8b --batch 4 --prompt 2048 --generate 512 \
        --gpu h100-sxm5-80gb
    vrambudget estimate --file workload.json        # a BudgetRequest or a single workload
    vrambudget estimate --hub Qwen/Qwen2.5-7B-Instruct-AWQ --gpu l4-24gb   # config + headers
    vrambudget estimate --checkpoint ./my-model --batch 8   # a local checkpoint directory
    vrambudget estimate --config config.json         # any model_type transformers knows
    vrambudget estimate --model qwen2.5-0.5b --method trace   # the trace tier, in-process
    vrambudget estimate --model llama-3.1-8b --gpu l4-24gb --svg budget.svg   # and its picture
    vrambudget openapi > openapi/service.json
    vrambudget chart comparison.json -o comparison.svg   # a Comparison or a probe resource
    vrambudget calibrate --store agent-data/agent.sqlite3 --out profiles/   # see calibrate -h
    vrambudget cluster request.json --yaml        # Kubernetes requests (docs/KUBERNETES.md)
    vrambudget fit --model llama-3.1-70b --counts 1,2,4,8    # which GPUs it fits, the maxima
    vrambudget estimate --kind llm_serving --engine vllm --model llama-3.1-8b \\
        --max-model-len 32768 --gpu l40s-48gb                  # a serving engine's budget
    vrambudget gpus --min-memory 40               # the GPU catalog (ids for --gpu)
    vrambudget models --search qwen               # the model presets (ids for --model)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["build_parser", "main"]


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from vrambudget.service.app import Settings, SettingsError, create_app

    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    host = args.host or settings.host
    port = args.port or settings.port
    # SIGTERM: stop accepting, let requests in flight finish for up to 5 s (every computation
    # runs in the compute pool, so the event loop is free to drain), then stop the workers.
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


def _request_from_args(args: argparse.Namespace) -> object:
    from vrambudget.core.spec import BudgetRequest

    from .workload_args import reject_with_file, request_fields, workload_from_args

    if args.file:
        reject_with_file(args)
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        data = json.loads(raw)
        if not (isinstance(data, dict) and "workloads" in data):
            data = {"workloads": [data]}
        if args.gpu:  # --gpu names the device of the file's request
            data["device"] = _device(args)
        return msgspec.convert(data, BudgetRequest)
    request: dict[str, object] = {
        "workloads": [workload_from_args(args, "estimate")],
        **request_fields(args),
    }
    if args.iterations is not None:
        request["trace"] = {"iterations": args.iterations}
    if args.gpu:
        request["device"] = _device(args)
    return msgspec.convert(request, BudgetRequest)


def _device(args: argparse.Namespace) -> dict[str, object]:
    """``--gpu`` with ``--memory-in-use`` (GiB, as nvidia-smi shows what other processes
    hold)."""
    device: dict[str, object] = {"source": "catalog", "id": args.gpu}
    if args.memory_in_use:
        device["memory_in_use_bytes"] = round(args.memory_in_use * (1 << 30))
    if args.desktop:
        device["desktop_session"] = args.desktop
    return device


def _estimate(args: argparse.Namespace) -> int:
    from vrambudget.core.errors import BudgetError
    from vrambudget.core.estimate import estimate
    from vrambudget.core.spec import BudgetRequest
    from vrambudget.core.units import format_bytes

    from .errors import report
    from .progress import progress
    from .workload_args import FLAG_OF, UsageError, model_resolver

    try:
        if args.memory_in_use and not args.gpu:
            raise UsageError("--memory-in-use needs --gpu: the device whose memory others hold")
        if args.desktop and not args.gpu:
            raise UsageError("--desktop needs --gpu: the device that drives the desktop")
        req = _request_from_args(args)
        if args.method:
            req = msgspec.structs.replace(req, method=args.method)  # type: ignore[type-var]
        with progress("resolving the model"):
            req = msgspec.structs.replace(
                req,  # type: ignore[type-var]
                workloads=model_resolver()(req.workloads),  # type: ignore[attr-defined]
            )
        if req.method == "trace":  # type: ignore[attr-defined]
            if args.allocator_replay:
                raise UsageError(
                    "--allocator-replay belongs to the analytic method: a trace replays the "
                    "allocator already (its trace.peak_reserved_bytes)"
                )
            engine = _trace_engine()
            with progress("tracing (fake tensors, then the allocator replay)"):
                budget = engine(req)
        else:
            budget = estimate(
                req.workloads,  # type: ignore[attr-defined]
                req.device,  # type: ignore[attr-defined]
                req.headroom,  # type: ignore[attr-defined]
                software=req.software,  # type: ignore[attr-defined]
                disk=req.disk,  # type: ignore[attr-defined]
                allocator_replay=args.allocator_replay or req.allocator_replay,  # type: ignore[attr-defined]
            )
    except (msgspec.ValidationError, BudgetError) as exc:
        return report(exc, BudgetRequest, FLAG_OF)
    except (UsageError, _NoTraceTier, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.svg is not None and not _write_budget_svg(budget, args.svg):
        return 2
    if args.json:
        from vrambudget.service.tracing import encode_answer

        # (msgspec.json.encode refuses str subclasses such as torch.__version__)
        sys.stdout.write(msgspec.json.format(encode_answer(budget).decode()) + "\n")
        return _exit_status(budget)
    for w in budget.workloads:
        params = f"{w.num_params:,} params" if w.num_params else ""
        print(
            f"{w.name} ({w.kind}) {params}, {w.devices_per_instance} device(s) x "
            f"{w.instances} instance(s)"
        )
        if w.model is not None:
            print(f"  model: {w.model.source}")
        if w.format is not None:
            f = w.format
            quant = f"; {f.quantization} ({f.quantization_from})" if f.quantization else ""
            print(
                f"  format: weights {f.weights} ({f.weights_from}), compute {f.compute}{quant}; "
                f"bytes {f.stored_bytes}"
            )
    if budget.stack is not None:
        print("  " + _stack_words(budget.stack))
    for i, d in enumerate(budget.devices):
        mark = "  <- most loaded" if i == budget.most_loaded and len(budget.devices) > 1 else ""
        print(f"\n{d.label} (x{d.num_devices}), peak at {d.peak_phase}{mark}")
        print(f"  {'component':<24}{'bytes':>20}{'':>4}{'GiB':>10}")
        for line in d.lines:
            print(
                f"  {line.component.value:<24}{line.bytes:>20,}{'':>4}{line.bytes / 2**30:>10.3f}"
            )
        print(f"  {'total':<24}{d.total_bytes:>20,}{'':>4}{d.total_bytes / 2**30:>10.3f}")
        print("  phases: " + ", ".join(f"{p.name} {format_bytes(p.total_bytes)}" for p in d.phases))
        if d.band is not None:
            b = d.band
            unseen = (
                ""
                if b.source_coverage is None
                else f"; for a source left out of the fit, {100 * b.source_coverage:.0f}% inside"
            )
            floor = (
                " (the low end: the model's own tensors, which it must hold)"
                if b.counted_bytes and b.low_bytes == b.counted_bytes
                else ""
            )
            print(
                f"  error band: the real peak {format_bytes(b.low_bytes)} .. "
                f"{format_bytes(b.high_bytes)}{floor}, headroom excluded ({b.basis}{unseen})"
            )
        c = d.allocator_cache
        if c is not None:
            flush = "; the allocator will release its cache and retry" if c.releases_cache else ""
            print(
                f"  generate replay: nvidia-smi ~{format_bytes(c.device_used_bytes)}, reserved "
                f"{format_bytes(c.reserved_bytes)} ({format_bytes(c.cached_bytes)} cached "
                f"beyond the allocated bytes{flush}); with expandable_segments:True "
                f"{format_bytes(c.expandable_segments_cached_bytes)} cached"
            )
    if budget.serving:
        sv = budget.serving
        start = "starts" if sv.would_start else f"would NOT start: {sv.reason}"
        rules = sv.modelled_version
        print(
            f"\n{sv.engine} {sv.engine_version} (rules of {rules}) on "
            f"{budget.device.name if budget.device else '?'}: {start}\n  KV pool "
            f"{format_bytes(sv.kv_cache_pool_bytes)} = {sv.kv_cache_tokens:,} tokens; max "
            f"concurrency {sv.max_concurrency:g} at {sv.max_model_len:,} tokens per request"
        )
        if sv.kv_cache_tokens_band is not None:
            b = sv.kv_cache_tokens_band
            print(f"  KV tokens may be {b.low:,} .. {b.high:,} ({b.basis})")
        if sv.version_note:
            print(f"  note: {sv.version_note}")
        for remedy in sv.remedies:
            print(f"  remedy: {remedy}")
        print(f"  launch: {sv.launch}")
    print(
        f"\nhost RAM per host: {format_bytes(budget.host_ram.total_bytes)}; "
        f"disk: {format_bytes(budget.disk.total_bytes)}"
    )
    if budget.trace:
        t = budget.trace
        print(
            f"trace: peak allocated {format_bytes(t.peak_allocated_bytes)}, peak reserved "
            f"{format_bytes(t.peak_reserved_bytes)} at {t.peak_phase} (iteration "
            f"{t.peak_iteration} of {t.iterations}), {t.num_events:,} allocator events, "
            f"torch {t.torch_version}"
        )
    for warning in budget.warnings:
        print(f"warning: {warning}")
    _print_verdict(budget)
    return _exit_status(budget)


def _write_budget_svg(budget: Any, path: str) -> bool:
    """``estimate --svg FILE``: the budget's picture (docs/PICTURES.md); False, with the
    reason on stderr, when the file cannot be written."""
    from vrambudget.core.budget_chart import render_budget_svg

    try:
        Path(path).write_text(render_budget_svg(budget), encoding="utf-8")
    except OSError as exc:
        print(f"error: {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True


def _print_verdict(budget: Any) -> None:
    """The last line of the table: whether the budget fits its device (``Budget.fit``)."""
    from vrambudget.core.units import format_bytes

    f = budget.fit
    if f is None or budget.device is None:
        return
    d = budget.device
    held = d.memory_in_use_bytes
    who = (
        f"assumed held by the {d.desktop_session} desktop (published readings "
        f"{format_bytes(d.memory_in_use_low_bytes)} .. {format_bytes(d.memory_in_use_high_bytes)})"
        if d.memory_in_use_basis is not None
        else "held by other processes"
    )
    room = format_bytes(f.capacity_bytes) + (
        f" left of {format_bytes(d.memory_total_bytes)}, {format_bytes(held)} {who}" if held else ""
    )
    name = f"{budget.device.name} ({room})"
    used = format_bytes(f.used_bytes)
    if f.fits:
        band = (
            "; the error band's high end does not fit: it fits only if the real peak is low"
            if f.verdict == "fits_if_low"
            else ""
        )
        print(f"\nFITS {name}: uses {used}, {format_bytes(f.free_bytes)} free{band}")
    else:
        short = f", {format_bytes(f.missing_bytes)} missing" if f.missing_bytes else ""
        why = f"; {f.reason}" if budget.serving is not None and f.reason else ""
        print(f"\nDOES NOT FIT {name}: needs {used}{short}{why}")


def _exit_status(budget: Any) -> int:
    """0 (fits, or no device), 3 (does not fit its device): :data:`EXIT_CODES`."""
    from .errors import EXIT_DOES_NOT_FIT, EXIT_FITS

    return EXIT_DOES_NOT_FIT if budget.fit is not None and not budget.fit.fits else EXIT_FITS


class _NoTraceTier(Exception):
    """The trace tier cannot run in this process (not installed, or a bad entry point)."""


def _trace_engine() -> Any:
    """The trace engine, run in this process (the service runs it in a worker pool): the
    function named by VRAMBUDGET_TRACE_ENTRY, default vrambudget.trace.engine:trace_budget."""
    import os

    from vrambudget.service.tracing import (
        DEFAULT_ENTRY,
        ENTRY_PATTERN,
        INSTALL_HINT,
        load_entry,
    )

    entry = os.environ.get("VRAMBUDGET_TRACE_ENTRY", DEFAULT_ENTRY).strip()
    if not ENTRY_PATTERN.match(entry):
        raise _NoTraceTier(f"VRAMBUDGET_TRACE_ENTRY must be 'module:function', got {entry!r}")
    try:
        return load_entry(entry)
    except ImportError as exc:
        raise _NoTraceTier(f"{INSTALL_HINT} ({exc})") from None


def _openapi(_: argparse.Namespace) -> int:
    from vrambudget.service.app import create_app
    from vrambudget.service.openapi import openapi_document

    sys.stdout.write(json.dumps(openapi_document(create_app()), indent=2, sort_keys=True) + "\n")
    return 0


def _chart(args: argparse.Namespace) -> int:
    from vrambudget.core.chart import run_chart

    return run_chart(args.file, args.output, args.title)


def _agent(args: argparse.Namespace) -> int:
    from vrambudget.agent.__main__ import main as agent_main

    agent_main(["openapi"] if args.action == "openapi" else [])
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"vrambudget {version('vrambudget')}"
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "vrambudget (not installed)"


def _stack_words(stack: Any) -> str:
    """One line of the stack the budget assumed: the framework and torch releases and the
    behaviours by name (``--json`` gives each one's assumption and source)."""
    named = [f"{stack.framework} {stack.framework_version}"]
    if stack.torch_version:
        named.append(f"torch {stack.torch_version}")
    names = ", ".join(b.name for b in stack.behaviours)
    return f"stack: {', '.join(named)}; behaviours assumed: {names} (--json: each with its source)"


def build_parser() -> argparse.ArgumentParser:
    """The ``vrambudget`` parser with every subcommand."""
    from .errors import EXIT_CODES
    from .workload_args import DESKTOP_ARG, add_workload_args

    parser = argparse.ArgumentParser(
        prog="vrambudget",
        description=__doc__,
        epilog=EXIT_CODES + "\n\nEach command's --help lists its flags (docs/CLI.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=_version(), help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the calculation service")
    serve.add_argument(
        "--host", help="address to listen on (default: VRAMBUDGET_HOST, else 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=int, help="port to listen on (default: VRAMBUDGET_PORT, else 8000)"
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level (default info)",
    )
    serve.set_defaults(func=_serve)
    est = sub.add_parser(
        "estimate",
        help="print a budget table: every component's bytes, and whether it fits --gpu",
        description="A budget of one workload (or a BudgetRequest file), computed in this\n"
        "process as POST /v1/budgets answers it. With --gpu the last line says whether it\n"
        "fits, and so does the exit status (0 fits, 3 does not).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    est.add_argument(
        "--file",
        metavar="FILE",
        help="JSON workload or BudgetRequest ('-' for stdin) instead of the workload flags",
    )
    add_workload_args(est)
    est.add_argument(
        "--gpu", metavar="ID", help="catalog GPU id (`vrambudget gpus` lists them): the device"
    )
    est.add_argument(
        "--memory-in-use",
        metavar="GIB",
        type=float,
        default=0.0,
        help="GiB other processes already hold on --gpu (a desktop, another server: "
        "nvidia-smi's used memory with nothing of yours running); the fit and the serving "
        "engines' pools see what is left",
    )
    est.add_argument("--desktop", **DESKTOP_ARG)
    est.add_argument("--json", action="store_true", help="print the JSON budget")
    est.add_argument(
        "--svg",
        metavar="FILE",
        help="also write the budget as an SVG picture to FILE: a stacked bar per device, the "
        "GPU's capacity and the error band (docs/PICTURES.md)",
    )
    est.add_argument(
        "--method",
        choices=["analytic", "trace"],
        help="analytic formulas (default) or the trace tier, run in this process "
        "(needs vrambudget[trace]); overrides the method of a --file request",
    )
    est.add_argument(
        "--allocator-replay",
        action="store_true",
        help="also replay transformers' generate through the caching-allocator model: what "
        "nvidia-smi and max_memory_reserved will show (docs/COMPONENTS.md, section 13)",
    )
    est.add_argument(
        "--iterations", type=int, metavar="N", help="trace: steps traced (2 .. 8, default 2)"
    )
    est.set_defaults(func=_estimate)
    oa = sub.add_parser("openapi", help="print the service's OpenAPI document")
    oa.set_defaults(func=_openapi)
    from vrambudget.cli.calibrate import add_parser as add_calibrate

    add_calibrate(sub)
    from vrambudget.cli.gguf_file import add_parser as add_gguf

    add_gguf(sub)
    from vrambudget.cli.cluster import add_parser as add_cluster

    add_cluster(sub)
    from vrambudget.cli.fit import add_parser as add_fit

    add_fit(sub)
    from vrambudget.cli.catalog import add_parsers as add_catalogs

    add_catalogs(sub)
    ch = sub.add_parser("chart", help="draw a comparison (estimate vs measured) as SVG")
    ch.add_argument(
        "file", help="JSON Comparison, or a probe resource with a 'comparison' key ('-' for stdin)"
    )
    ch.add_argument("-o", "--output", help="SVG file to write (default: stdout)")
    ch.add_argument("--title", help="the chart's title (default: device and probe id)")
    ch.set_defaults(func=_chart)
    ag = sub.add_parser(
        "agent",
        help="run the probe agent (VRAMBUDGET_AGENT_* settings; needs "
        "vrambudget[agent]); 'agent openapi' prints its OpenAPI document",
    )
    ag.add_argument(
        "action",
        nargs="?",
        choices=["serve", "openapi"],
        default="serve",
        help="serve (default): run the agent; openapi: print its OpenAPI document",
    )
    ag.set_defaults(func=_agent)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `vrambudget gpus | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
