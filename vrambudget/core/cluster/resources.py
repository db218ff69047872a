"""The quantities of one pod, each a :class:`ClusterLine` with its rule and source: the GPUs
(device plugin or MIG resource), CPU, memory (host RAM + headroom + ``/dev/shm``), ephemeral
storage. Byte quantities round *up* to whole MiB: an underestimate is the worst error a request
can make."""

from __future__ import annotations

import re

import msgspec

from ..catalog import GPU, gpus
from ..errors import InvalidWorkload
from ..host import PROCESS_RSS_BYTES, PROCESS_RSS_HIGH_BYTES
from ..layout import GPUS_PER_NODE
from ..mig import mig_devices
from ..result import Budget
from ..spec import CatalogDevice, DeviceRef, LLMServingWorkload, Workload
from ..spec.cluster import ClusterRequest
from ..units import GiB, MiB, ceil_div
from .sources import (
    AMD_GPU_RESOURCE,
    DEFAULT_SHM_BYTES,
    NVIDIA_GPU_RESOURCE,
    SRC_AMD_PLUGIN,
    SRC_DISK,
    SRC_ENGINE_CPU,
    SRC_HOST_HEADROOM,
    SRC_HYPERTHREADS,
    SRC_MIG_MIXED,
    SRC_NVIDIA_PLUGIN,
    SRC_PROCESS_CPU,
    SRC_REQUEST_EQ_LIMIT,
    SRC_SHM,
    SRC_TMPFS,
    SRC_VLLM_CPU,
)

__all__ = [
    "ChosenDevice",
    "ClusterLine",
    "chosen_device",
    "cpu_line",
    "gpu_line",
    "memory_lines",
    "memory_quantity",
    "mig_profile",
    "pods_of",
    "storage_line",
]

_MIG_NAME = re.compile(r"^(?:nvidia\.com/mig-)?(?P<profile>[0-9]+g\.(?P<gb>[0-9]+)gb)$")


class ClusterLine(msgspec.Struct, frozen=True, kw_only=True):
    """One requested resource: its quantity, the bytes behind it, the rule and its source."""

    resource: str
    quantity: str
    bytes: int | None = None
    """Byte quantities: the bytes the quantity stands for (rounded up to MiB)."""
    formula: str
    source: str


def memory_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity, rounded *up*: whole GiB as ``Gi``, else whole MiB as
    ``Mi`` (1 B -> ``1Mi``; 2 GiB + 1 B -> ``2049Mi``)."""
    if n <= 0:
        return "0"
    if n % GiB == 0:
        return f"{n // GiB}Gi"
    return f"{ceil_div(n, MiB)}Mi"


def _rounded(n: int) -> int:
    """The bytes :func:`memory_quantity` writes for ``n``."""
    return ceil_div(n, MiB) * MiB if n > 0 else 0


class ChosenDevice(msgspec.Struct, frozen=True, kw_only=True):
    """What the cluster needs to know of the device the budget was computed for."""

    name: str
    vendor: str
    memory_mib: int
    """The smallest ``nvidia.com/gpu.memory`` / DRA ``memory`` (NVML total) the chosen card
    has: the catalog's nvidia-smi total when known, else its runtime total (a lower bound)."""
    memory_basis: str
    compute_capability: str | None
    mig_profiles: tuple[str, ...] = ()
    gpu_id: str | None = None


def chosen_device(ref: DeviceRef, req: ClusterRequest) -> ChosenDevice:
    if isinstance(ref, CatalogDevice):
        g: GPU = gpus()[ref.id]
        if req.vendor is not None and req.vendor != g.vendor:
            raise InvalidWorkload(
                "vendor", f"{req.vendor} contradicts the catalog's {g.vendor} for {g.id}; omit it"
            )
        if g.nvidia_smi_total_mib is not None:
            mib, basis = g.nvidia_smi_total_mib, "the catalog's nvidia-smi total"
        else:
            mib, basis = g.memory_total_bytes // MiB, "the catalog's runtime total (a lower bound)"
        return ChosenDevice(
            name=g.name,
            vendor=g.vendor,
            memory_mib=mib,
            memory_basis=basis,
            compute_capability=req.min_compute_capability or g.compute_capability,
            mig_profiles=tuple(p.name for p in g.mig_profiles),
            gpu_id=g.id,
        )
    return ChosenDevice(
        name=ref.name,
        vendor=req.vendor or "nvidia",
        memory_mib=ref.memory_total_bytes // MiB,
        memory_basis="the custom device's memory_total_bytes",
        compute_capability=req.min_compute_capability,
    )


def mig_profile(req: ClusterRequest, dev: ChosenDevice, budget: Budget) -> tuple[str, str] | None:
    """(the MIG profile, a warning), or None for whole GPUs. The profile must be the catalog
    GPU's, and the budget must fit the capacity a MIG fit gives one instance of it
    (:func:`vrambudget.core.mig.capacity`: nvidia-smi's listing where one is known, else 0.85 x
    the GB in the profile's name)."""
    if req.mig_profile is None:
        return None
    m = _MIG_NAME.match(req.mig_profile)
    assert m is not None  # the wire pattern
    profile = m["profile"]
    if profile not in dev.mig_profiles:
        allowed = ", ".join(dev.mig_profiles) or "none: the catalog lists no MIG profile"
        raise InvalidWorkload(
            "mig_profile", f"{profile} is not a MIG profile of {dev.name} (allowed: {allowed})"
        )
    instance = next(d for d in mig_devices(dev.gpu_id) if d.profile.name == profile)
    if budget.total_bytes > instance.capacity_bytes:
        raise InvalidWorkload(
            "mig_profile",
            f"the budget's {budget.total_bytes} B per device exceed the "
            f"{instance.capacity_bytes} B a {profile} instance holds ({instance.basis}); "
            "choose a larger profile or fit MIG devices",
        )
    return profile, (
        f"the budget was computed for a whole {dev.name} and compared with the "
        f"{instance.capacity_bytes} B of one {profile} instance ({instance.basis}, "
        "docs/MIG.md)"
    )


def pods_of(devices: int, field: str) -> tuple[int, int]:
    """(pods, GPUs per pod): one pod per node of up to ``GPUS_PER_NODE`` GPUs."""
    if devices <= GPUS_PER_NODE:
        return 1, devices
    if devices % GPUS_PER_NODE:
        raise InvalidWorkload(
            field,
            f"{devices} GPUs span nodes but do not fill whole {GPUS_PER_NODE}-GPU nodes; "
            f"use at most {GPUS_PER_NODE} or a multiple of {GPUS_PER_NODE}",
        )
    return devices // GPUS_PER_NODE, GPUS_PER_NODE


def gpu_line(dev: ChosenDevice, mig: str | None, devices: int, pods: int) -> ClusterLine:
    """The device plugin's resource: NVIDIA, AMD, or a MIG profile (mixed strategy)."""
    if mig:
        resource, source = f"nvidia.com/mig-{mig}", SRC_MIG_MIXED
    elif dev.vendor == "amd":
        resource, source = AMD_GPU_RESOURCE, SRC_AMD_PLUGIN
    else:
        resource, source = NVIDIA_GPU_RESOURCE, SRC_NVIDIA_PLUGIN
    return ClusterLine(
        resource=resource,
        quantity=str(devices // pods),
        formula=f"{devices} devices of the layout / {pods} pod(s), one per node; requests = limits",
        source=source,
    )


def cpu_line(
    budget: Budget, workloads: tuple[Workload, ...], per_pod: int, req: ClusterRequest
) -> ClusterLine:
    """Serving engines: vLLM's ``A + DP + N + (DP > 1)`` physical cores; other workloads: one
    core per GPU process and per DataLoader worker. Doubled for hyperthreads."""
    w = workloads[0]
    if isinstance(w, LLMServingWorkload):
        dp = min(w.parallelism.data, per_pod) if w.engine in ("vllm", "sglang") else 1
        cores = dp + dp + per_pod + (1 if dp > 1 else 0)
        formula = f"A + DP + N + (DP > 1) = {dp} + {dp} + {per_pod} + {int(dp > 1)} physical cores"
        source = SRC_VLLM_CPU if w.engine == "vllm" else SRC_ENGINE_CPU
    else:
        n = budget.host_ram.num_processes
        cores = n * (1 + req.dataloader_workers)
        formula = f"{n} processes x (1 + {req.dataloader_workers} DataLoader workers) cores"
        source = SRC_PROCESS_CPU
    if req.hyperthreading:
        cores *= 2
        formula += " x 2 (hyperthreads)"
        source += "; " + SRC_HYPERTHREADS
    return ClusterLine(resource="cpu", quantity=str(cores), formula=formula, source=source)


def _host_headroom(budget: Budget, req: ClusterRequest) -> tuple[int, str]:
    """Default: each process's resident set lifted from the assumed 2 GiB to the top of its
    typical range, 3 GiB; ``host_headroom``: max(fraction x host RAM, min_bytes)."""
    host = budget.host_ram
    per_process = PROCESS_RSS_HIGH_BYTES - PROCESS_RSS_BYTES
    headroom, words = host.num_processes * per_process, f"{host.num_processes} x {per_process} B"
    h = req.host_headroom
    if h is None:
        return headroom, words
    if h.fraction is not None:
        headroom = int(h.fraction * host.total_bytes + 0.5)
        words = f"{h.fraction} x host RAM"
    if h.min_bytes > headroom:
        return h.min_bytes, f"min_bytes {h.min_bytes} B"
    return headroom, words


def memory_lines(budget: Budget, req: ClusterRequest) -> tuple[ClusterLine, ClusterLine]:
    """(memory, ``/dev/shm``): memory = host RAM + headroom + ``/dev/shm`` (a memory-backed
    emptyDir counts against the container's memory), requests = limits."""
    host = budget.host_ram.total_bytes
    headroom, words = _host_headroom(budget, req)
    shm = DEFAULT_SHM_BYTES if req.shm_bytes is None else req.shm_bytes
    total = host + headroom + shm
    memory = ClusterLine(
        resource="memory",
        quantity=memory_quantity(total),
        bytes=_rounded(total),
        formula=f"host RAM {host} B + headroom {headroom} B ({words}) + /dev/shm {shm} B, "
        f"rounded up to MiB; requests = limits",
        source=f"the budget's host_ram; {SRC_HOST_HEADROOM}; {SRC_TMPFS}; {SRC_REQUEST_EQ_LIMIT}",
    )
    shm_line = ClusterLine(
        resource="/dev/shm",
        quantity=memory_quantity(shm),
        bytes=_rounded(shm),
        formula="emptyDir medium Memory, sizeLimit"
        + (" (default)" if req.shm_bytes is None else ""),
        source=SRC_SHM,
    )
    return memory, shm_line


def storage_line(budget: Budget) -> ClusterLine:
    disk = budget.disk.total_bytes
    return ClusterLine(
        resource="ephemeral-storage",
        quantity=memory_quantity(disk),
        bytes=_rounded(disk),
        formula=f"disk {disk} B rounded up to MiB; a request only (a limit evicts the pod, and "
        f"logs and caches are not budgeted)",
        source=SRC_DISK,
    )
