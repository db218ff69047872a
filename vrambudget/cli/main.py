"""``vrambudget``: serve the API, or print a budget as a table on the terminal.

    vrambudget serve [--host 127.0.0.1] [--port 8000]
    vrambudget estimate --model llama-3.1-8b --batch 4 --prompt 2048 --generate 512 \
        --gpu h100-sxm5-80gb
    vrambudget estimate --file workload.json        # a BudgetRequest or a single workload
    vrambudget estimate --hub Qwen/Qwen2.5-7B-Instruct-AWQ --gpu l4-24gb   # config + headers
    vrambudget estimate --checkpoint ./my-model --batch 8   # a local checkpoint directory
    vrambudget estimate --config config.json         # any model_type transformers knows
    vrambudget estimate --model qwen2.5-0.5b --method trace   # the trace tier, in-process
    vrambudget openapi > openapi/service.json
    vrambudget chart comparison.json -o comparison.svg   # a Comparison or a probe resource
    vrambudget calibrate --store agent-data/agent.sqlite3 --out profiles/   # see calibrate -h
    vrambudget cluster request.json --yaml        # Kubernetes requests (docs/KUBERNETES.md)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import msgspec

__all__ = ["main"]


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
    from vrambudget.core.spec import BudgetRequest, Workload

    if args.file:
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        data = json.loads(raw)
        if isinstance(data, dict) and "workloads" in data:
            return msgspec.convert(data, BudgetRequest)
        return BudgetRequest(workloads=(msgspec.convert(data, Workload),))
    model = _model_from_args(args)
    workload: dict[str, object] = {
        "kind": args.kind,
        "model": model,
        "precision": {"weights": args.weights, "compute": args.compute},
        "parallelism": {
            "tensor": args.tp,
            "pipeline": args.pp,
            "data": args.dp,
            "zero_stage": args.zero,
        },
    }
    if args.quant:
        workload["precision"]["quantization"] = {"scheme": args.quant}  # type: ignore[index]
    if args.kind == "inference":
        workload.update(
            batch_size=args.batch,
            prompt_tokens=args.prompt,
            generated_tokens=args.generate,
            concurrent_requests=args.concurrency,
        )
    else:
        workload.update(
            micro_batch_size=args.batch,
            sequence_length=args.prompt,
            checkpointing=args.checkpointing,
        )
    request: dict[str, object] = {"workloads": [workload]}
    if args.iterations is not None or args.expandable_segments:
        request["trace"] = {
            "iterations": args.iterations or 2,
            "expandable_segments": args.expandable_segments,
        }
    if args.gpu:
        request["device"] = {"source": "catalog", "id": args.gpu}
    return msgspec.convert(request, BudgetRequest)


def _model_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The model of ``--model``, ``--config``, ``--hub`` or ``--checkpoint`` (exactly one)."""
    given = [a for a in ("model", "config", "hub", "checkpoint") if getattr(args, a)]
    if len(given) != 1:
        raise SystemExit(
            "estimate: give one of --model PRESET, --config config.json, --hub OWNER/NAME[@REV], "
            "--checkpoint DIR (or --file FILE)"
        )
    if args.model:
        return {"source": "preset", "id": args.model}
    if args.config:
        return {"source": "hf_config", "config": json.loads(Path(args.config).read_bytes())}
    if args.hub:
        repo, _, revision = args.hub.partition("@")
        return {"source": "hub", "id": repo, "revision": revision or None}
    from vrambudget.trace.models import local_checkpoint_model

    return local_checkpoint_model(args.checkpoint)


def _estimate(args: argparse.Namespace) -> int:
    from vrambudget.core.errors import BudgetError
    from vrambudget.core.estimate import estimate
    from vrambudget.core.units import format_bytes

    missing = _missing_framework()
    if missing:
        resolve_models = _no_framework(missing)
    else:
        from vrambudget.trace.models import resolve_models
    try:
        req = _request_from_args(args)
        if args.method:
            req = msgspec.structs.replace(req, method=args.method)  # type: ignore[type-var]
        req = msgspec.structs.replace(
            req,  # type: ignore[type-var]
            workloads=resolve_models(req.workloads),  # type: ignore[attr-defined]
        )
        if req.method == "trace":  # type: ignore[attr-defined]
            budget = _trace_engine()(req)
        else:
            budget = estimate(
                req.workloads,  # type: ignore[attr-defined]
                req.device,  # type: ignore[attr-defined]
                req.headroom,  # type: ignore[attr-defined]
                software=req.software,  # type: ignore[attr-defined]
                disk=req.disk,  # type: ignore[attr-defined]
            )
    except (msgspec.ValidationError, BudgetError, _NoTraceTier) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from vrambudget.service.tracing import encode_answer

        # (msgspec.json.encode refuses str subclasses such as torch.__version__)
        sys.stdout.write(msgspec.json.format(encode_answer(budget).decode()) + "\n")
        return 0
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
        if sv.version_note:
            print(f"  note: {sv.version_note}")
        for remedy in sv.remedies:
            print(f"  remedy: {remedy}")
        print(f"  launch: {sv.launch}")
    elif budget.device:
        free = budget.device.memory_total_bytes - budget.total_bytes
        verdict = "fits" if free >= 0 else "does NOT fit"
        print(
            f"\n{budget.device.name}: {format_bytes(budget.device.memory_total_bytes)} "
            f"-> {verdict} ({format_bytes(abs(free))} {'free' if free >= 0 else 'short'})"
        )
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
    return 0


def _missing_framework() -> str | None:
    """The first package a framework resolution imports (lazily, at the first model that needs
    it) that is not installed, or None."""
    import importlib.util

    return next((m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None), None)


def _no_framework(missing: str) -> Any:
    """Without the trace extra: models that need the framework are refused, naming it."""
    from vrambudget.core.errors import InvalidWorkload
    from vrambudget.core.resolve import needs_resolution

    def resolve(workloads: tuple[Any, ...]) -> tuple[Any, ...]:
        for i, w in enumerate(workloads):
            if getattr(w, "model", None) is not None and needs_resolution(w.model):
                raise InvalidWorkload(
                    f"workloads[{i}].model",
                    f"needs the framework ({missing} is not installed): "
                    "pip install 'vrambudget[trace]'",
                )
        return workloads

    return resolve


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


def main(argv: Sequence[str] | None = None) -> int:
    from vrambudget.core.dtypes import COMPUTE_DTYPES, WeightDType
    from vrambudget.core.spec import Quantization

    parser = argparse.ArgumentParser(
        prog="vrambudget", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the calculation service")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(func=_serve)
    est = sub.add_parser("estimate", help="print a budget table")
    est.add_argument("--file", help="JSON workload or BudgetRequest ('-' for stdin)")
    est.add_argument("--model", help="preset id (see GET /v1/models)")
    est.add_argument("--config", help="a model's config.json (any model_type transformers knows)")
    est.add_argument(
        "--hub",
        metavar="OWNER/NAME[@REVISION]",
        help="a Hugging Face Hub repository: its config.json and safetensors headers are fetched "
        "(VRAMBUDGET_HUB_ENDPOINT / _TOKEN or HF_TOKEN for gated repositories)",
    )
    est.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a local checkpoint directory: config.json and the safetensors headers (exact "
        "stored bytes; no tensor data is read)",
    )
    est.add_argument("--kind", choices=["inference", "training"], default="inference")
    est.add_argument("--batch", type=int, default=1)
    est.add_argument("--prompt", type=int, default=1024, help="prompt (or sequence) tokens")
    est.add_argument("--generate", type=int, default=256)
    est.add_argument("--concurrency", type=int, default=1)
    est.add_argument(
        "--weights",
        default="auto",
        choices=["auto", *get_args(WeightDType)],
        help="dtype of unquantized weights (default auto: the checkpoint's torch_dtype)",
    )
    est.add_argument(
        "--compute",
        default="auto",
        choices=["auto", *COMPUTE_DTYPES],
        help="activation dtype (default auto: the weights' dtype)",
    )
    est.add_argument(
        "--quant",
        choices=[t.__struct_config__.tag for t in get_args(Quantization)],
        help="quantize the linear layers (default: the checkpoint's quantization_config)",
    )
    est.add_argument("--checkpointing", choices=["none", "selective", "full"], default="none")
    est.add_argument("--tp", type=int, default=1)
    est.add_argument("--pp", type=int, default=1)
    est.add_argument("--dp", type=int, default=1)
    est.add_argument("--zero", type=int, default=0)
    est.add_argument("--gpu", help="catalog GPU id (see GET /v1/gpus)")
    est.add_argument("--json", action="store_true", help="print the JSON budget")
    est.add_argument(
        "--method",
        choices=["analytic", "trace"],
        help="analytic formulas (default) or the trace tier, run in this process "
        "(needs vrambudget[trace]); overrides the method of a --file request",
    )
    est.add_argument("--iterations", type=int, help="trace: steps traced (2 .. 8, default 2)")
    est.add_argument(
        "--expandable-segments",
        action="store_true",
        help="trace: replay with expandable_segments:True",
    )
    est.set_defaults(func=_estimate)
    oa = sub.add_parser("openapi", help="print the OpenAPI document")
    oa.set_defaults(func=_openapi)
    from vrambudget.cli.calibrate import add_parser as add_calibrate

    add_calibrate(sub)
    from vrambudget.cli.gguf_file import add_parser as add_gguf

    add_gguf(sub)
    from vrambudget.cli.cluster import add_parser as add_cluster

    add_cluster(sub)
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
    ag.add_argument("action", nargs="?", choices=["serve", "openapi"], default="serve")
    ag.set_defaults(func=_agent)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
