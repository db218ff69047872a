"""Kubernetes requests for a budget's layout: the GPUs (device plugin or MIG resource), CPU,
host memory, ephemeral storage and ``/dev/shm`` of one pod per node, and the same GPUs as a
Dynamic Resource Allocation claim. Plain dicts in the shape of the Kubernetes objects (a Pod,
a ``resource.k8s.io/v1`` ResourceClaim and ResourceClaimTemplate); the service writes them as
JSON or YAML. docs/KUBERNETES.md explains every rule and its source.

``sources`` (what each rule follows), ``resources`` (the quantities of one pod), ``objects``
(the Kubernetes objects), ``layout`` (the budget or fit row a request renders).

Quantities round *up* to whole MiB (an underestimate is the worst error a request can make):
a memory request below the real use is what lets the scheduler overcommit a node until the
kernel kills pods (the issue behind this package: a node OOM cascade from an engine whose
host-RAM request was far below its real usage).
"""

from __future__ import annotations

from .layout import cluster_requests
from .objects import ClusterAnswer, render
from .resources import ClusterLine, memory_quantity
from .sources import DEFAULT_SHM_BYTES

__all__ = [
    "DEFAULT_SHM_BYTES",
    "ClusterAnswer",
    "ClusterLine",
    "cluster_requests",
    "memory_quantity",
    "render",
]
