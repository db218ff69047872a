"""``vrambudget cluster FILE``: a budget's (or a fit row's) layout as Kubernetes requests, the
answer of ``POST /v1/cluster-requests`` computed in this process.

    vrambudget cluster request.json                 # JSON: pod, DRA claim, lines
    vrambudget cluster request.json --yaml | kubectl apply -f -
    vrambudget cluster request.json --yaml --dra    # the ResourceClaimTemplate and its Pod

FILE ('-' for stdin) is a ClusterRequest (docs/KUBERNETES.md). Models are resolved as the
analytic tier does (presets, config.json, dimensions); a ``hub`` model needs the service.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["add_parser"]


def _run(args: argparse.Namespace) -> int:
    from vrambudget.core.cluster import cluster_requests
    from vrambudget.core.errors import BudgetError
    from vrambudget.core.spec.cluster import ClusterRequest
    from vrambudget.service.cluster_yaml import manifests_yaml

    raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    try:
        answer = cluster_requests(msgspec.json.decode(raw, type=ClusterRequest))
    except (msgspec.ValidationError, msgspec.DecodeError, BudgetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    data = msgspec.to_builtins(answer)
    if not args.yaml:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(data)).decode() + "\n")
        return 0
    if args.dra and answer.resource_claim_template is None:
        print(f"error: no DRA claim for {answer.gpu} ({answer.vendor})", file=sys.stderr)
        return 2
    sys.stdout.write(manifests_yaml(data, "dra" if args.dra else "device-plugin"))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cluster",
        help="print Kubernetes requests (a Pod, a DRA ResourceClaim) for a budget's layout",
    )
    p.add_argument("file", help="a ClusterRequest as JSON ('-' for stdin)")
    p.add_argument("--yaml", action="store_true", help="the manifests as YAML for kubectl")
    p.add_argument(
        "--dra", action="store_true", help="with --yaml: the ResourceClaimTemplate and its Pod"
    )
    p.set_defaults(func=_run)
