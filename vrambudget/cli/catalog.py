"""``vrambudget gpus`` and ``vrambudget models``: the catalogs the service serves at
``GET /v1/gpus`` and ``GET /v1/models``, as tables (or the same JSON), with filters.

    vrambudget gpus                                  # every catalog GPU, smallest memory first
    vrambudget gpus --vendor nvidia --min-memory 40  # NVIDIA GPUs with at least 40 GiB
    vrambudget gpus --search h100 --json             # the GET /v1/gpus objects
    vrambudget models --search qwen                  # model presets whose id or name has 'qwen'
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from .errors import EXIT_CODES

__all__ = ["add_parsers"]

GiB = 1 << 30


def _match(text: str | None, *fields: str) -> bool:
    return text is None or any(text.lower() in f.lower() for f in fields)


def print_table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: set[int]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(line(headers))
    for r in rows:
        print(line(r))


def _json(items: list[Any]) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(items)).decode() + "\n")


def _gpus(args: argparse.Namespace) -> int:
    from vrambudget.core.catalog import gpus
    from vrambudget.core.catalog_view import gpu_entry

    chosen = [
        g
        for g in gpus().values()
        if (args.vendor is None or g.vendor == args.vendor)
        and (args.segment is None or g.segment == args.segment)
        and (args.architecture is None or g.architecture == args.architecture.lower())
        and (args.min_memory is None or g.memory_total_bytes >= args.min_memory * GiB)
        and (args.max_memory is None or g.memory_total_bytes <= args.max_memory * GiB)
        and _match(args.search, g.id, g.name)
    ]
    chosen.sort(key=lambda g: (g.memory_total_bytes, g.id))
    if args.json:
        _json([gpu_entry(g) for g in chosen])
        return 0
    if not chosen:
        print("no catalog GPU matches these filters", file=sys.stderr)
        return 0
    rows = [
        (
            g.id,
            g.name,
            f"{g.memory_total_bytes / GiB:.2f}",
            g.vendor,
            g.architecture,
            g.segment,
            f"{g.mig_profiles[0].name} .. {g.mig_profiles[-1].name}" if g.mig_profiles else "-",
        )
        for g in chosen
    ]
    print_table(("id", "name", "GiB", "vendor", "architecture", "segment", "MIG"), rows, {2})
    return 0


def _models(args: argparse.Namespace) -> int:
    from vrambudget.core.catalog import presets
    from vrambudget.service.wire import model_summary

    chosen = [
        model_summary(i)
        for i, p in presets().items()
        if _match(args.search, p.id, p.display_name, p.hf_repo)
    ]
    chosen = [
        m
        for m in chosen
        if (args.model_type is None or m.model_type == args.model_type)
        and (args.max_params is None or m.num_params <= args.max_params * 1e9)
    ]
    chosen.sort(key=lambda m: (m.num_params, m.id))
    if args.json:
        _json(chosen)
        return 0
    if not chosen:
        print("no model preset matches these filters", file=sys.stderr)
        return 0
    rows = [
        (
            m.id,
            m.display_name,
            f"{m.num_params / 1e9:.2f}",
            m.model_type,
            str(m.num_layers),
            f"{m.max_position_embeddings:,}",
            f"{m.kv_cache_bytes_per_token_bf16 / 1024:.0f}",
            m.hf_repo,
        )
        for m in chosen
    ]
    print_table(
        ("id", "name", "B params", "type", "layers", "context", "KiB/token", "hub repository"),
        rows,
        {2, 4, 5, 6},
    )
    return 0


def add_parsers(sub: Any) -> None:
    """The ``gpus`` and ``models`` subcommands."""
    g = sub.add_parser(
        "gpus",
        help="list the GPU catalog (ids for --gpu), with filters",
        description="The GPU catalog (GET /v1/gpus), smallest memory first. GiB is the "
        "memory a process can use, as the catalog states it (the capacity fits compare with).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("--vendor", choices=["nvidia", "amd"], help="only this vendor's GPUs")
    g.add_argument(
        "--segment",
        choices=["datacenter", "workstation", "consumer"],
        help="only GPUs of this market segment",
    )
    g.add_argument(
        "--architecture", metavar="NAME", help="only this architecture (hopper, ada, cdna3, ...)"
    )
    g.add_argument(
        "--min-memory", type=float, metavar="GIB", help="only GPUs with at least this much memory"
    )
    g.add_argument(
        "--max-memory", type=float, metavar="GIB", help="only GPUs with at most this much memory"
    )
    g.add_argument("--search", metavar="TEXT", help="only GPUs whose id or name contains TEXT")
    g.add_argument("--json", action="store_true", help="print the catalog entries as JSON")
    g.set_defaults(func=_gpus)
    m = sub.add_parser(
        "models",
        help="list the model presets (ids for --model), with filters",
        description="The model presets (GET /v1/models), smallest first: parameters, layers, "
        "context and the bf16 KV cache per token.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    m.add_argument(
        "--search", metavar="TEXT", help="only presets whose id, name or repository has TEXT"
    )
    m.add_argument("--model-type", metavar="TYPE", help="only this model_type (llama, qwen2, ...)")
    m.add_argument(
        "--max-params", type=float, metavar="BILLIONS", help="only models up to this many params"
    )
    m.add_argument("--json", action="store_true", help="print the GET /v1/models objects")
    m.set_defaults(func=_models)
