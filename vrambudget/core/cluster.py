"""Kubernetes requests for a budget's layout: the GPUs (device plugin or MIG resource), CPU,
host memory, ephemeral storage and ``/dev/shm`` of one pod per node, and the same GPUs as a
Dynamic Resource Allocation claim. Plain dicts in the shape of the Kubernetes objects (a Pod,
a ``resource.k8s.io/v1`` ResourceClaim and ResourceClaimTemplate); the service writes them as
JSON or YAML. Every rule below names its source; docs/KUBERNETES.md explains them.

Quantities round *up* to whole MiB (an underestimate is the worst error a request can make):
a memory request below the real use is what lets the scheduler overcommit a node until the
kernel kills pods (the issue behind this module: a node OOM cascade from an engine whose
host-RAM request was far below its real usage).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .budget.fit import layout_for
from .calibration import ProfileSet
from .catalog import GPU, gpus
from .errors import InvalidWorkload
from .estimate import estimate
from .fit import fit
from .host import PROCESS_RSS_BYTES, PROCESS_RSS_HIGH_BYTES
from .layout import GPUS_PER_NODE
from .result import Budget, LayoutFit
from .spec import (
    BudgetRequest,
    CatalogDevice,
    CustomDevice,
    DeviceRef,
    GenericWorkload,
    GGUFOptions,
    LLMServingWorkload,
    Workload,
)
from .spec.cluster import ClusterRequest, FromBudget, FromFit
from .spec.diffusion import ImageGenerationWorkload
from .units import GiB, MiB, ceil_div

__all__ = [
    "DEFAULT_SHM_BYTES",
    "ClusterAnswer",
    "ClusterLine",
    "cluster_requests",
    "memory_quantity",
    "render",
]

# ------------------------------------------------------------------------------ sources --

NVIDIA_GPU_RESOURCE = "nvidia.com/gpu"
SRC_NVIDIA_PLUGIN = (
    "NVIDIA/k8s-device-plugin README.md @1b826acc: 'NVIDIA GPUs can now be requested by a "
    "container using the `nvidia.com/gpu` resource type'"
)
SRC_MIG_MIXED = (
    "NVIDIA/k8s-device-plugin README.md @1b826acc: 'With a `MIG_STRATEGY` of mixed, you will "
    "have additional resources available to you of the form "
    "`nvidia.com/mig-<slice_count>g.<memory_size>gb`'"
)
AMD_GPU_RESOURCE = "amd.com/gpu"
SRC_AMD_PLUGIN = (
    "ROCm/k8s-device-plugin docs/index.md @ed764684: 'Exposes AMD GPUs as `amd.com/gpu` "
    "resources in Kubernetes'"
)
SRC_VLLM_CPU = (
    "vLLM docs/configuration/optimization.md @10056c17, 'CPU Resources for GPU Deployments': "
    "'Minimum physical cores = A + DP + N + (1 if DP > 1 else 0)' (A API servers, default DP)"
)
SRC_ENGINE_CPU = (
    "assumption: vLLM's rule (one front-end process, one scheduler, one process per GPU; "
    "docs/configuration/optimization.md @10056c17) applied to this engine"
)
SRC_PROCESS_CPU = (
    "one core per GPU process (the host budget's processes) plus its PyTorch DataLoader "
    "workers: torch/utils/data/dataloader.py 'num_workers (int, optional): how many "
    "subprocesses to use for data loading. 0 means that the data will be loaded in the main "
    "process. (default: 0)'"
)
SRC_HYPERTHREADS = (
    "vLLM docs/configuration/optimization.md @10056c17: 'If your system has hyperthreading "
    "enabled, then 1 vCPU = 1 hyperthread = 1/2 physical CPU core, so you need `2 x (2 + N)` "
    "minimum vCPUs'"
)
DEFAULT_SHM_BYTES = 2 * GiB
"""``/dev/shm`` of vLLM's Kubernetes example (``sizeLimit: "2Gi"``)."""
SRC_SHM = (
    "vLLM docs/deployment/k8s.md @051f9b87: 'vLLM needs to access the host's shared memory for "
    'tensor parallel inference.\' (emptyDir medium: Memory, sizeLimit: "2Gi"); PyTorch '
    "README: 'PyTorch uses shared memory to share data between processes, so if torch "
    "multiprocessing is used (e.g. for multithreaded data loaders) the default shared memory "
    "segment size that container runs with is not enough'"
)
SRC_TMPFS = (
    "kubernetes.io/docs/concepts/storage/volumes/#emptydir: 'any files you write will count "
    "against your Container's memory limit'"
)
SRC_REQUEST_EQ_LIMIT = (
    "kubernetes.io/docs/concepts/configuration/manage-resources-containers/: 'Kubernetes "
    "schedules pods based on resource requests ... and will not consider memory usage above "
    "the request when deciding if another pod can fit on a given node'"
)
SRC_HOST_HEADROOM = (
    "vrambudget.core.host: the process resident set is assumed 2 GiB, typically 1.5-3 GiB; "
    "the headroom lifts each process to the top of that range"
)
SRC_DISK = "the budget's disk (model files, conversion space, a spare copy; checkpoints)"
SRC_GFD = (
    "NVIDIA/k8s-device-plugin docs/gpu-feature-discovery/README.md @1b826acc: "
    "'nvidia.com/gpu.memory | Integer | Memory of the GPU in mebibytes (MiB)', "
    "'nvidia.com/gpu.compute.major | Integer | Major of the compute capabilities'"
)
SRC_TOLERATION = (
    "NVIDIA/k8s-device-plugin README.md @1b826acc: the example pod tolerates key "
    "nvidia.com/gpu, operator Exists, effect NoSchedule"
)
DRA_DRIVER = "gpu.nvidia.com"
SRC_DRA = (
    "NVIDIA/k8s-dra-driver-gpu @22407113: DeviceClass gpu.nvidia.com (type 'gpu') and "
    "mig.nvidia.com (type 'mig'); attributes productName, cudaComputeCapability (version), "
    "profile (MIG); capacity memory = NVML memory.Total (cmd/gpu-kubelet-plugin/deviceinfo.go, "
    "partitions.go, nvlib.go)"
)
DRA_API = "resource.k8s.io/v1"
"""DRA's API group, served from Kubernetes 1.34 (GA)."""

_MIG_NAME = re.compile(r"^(?:nvidia\.com/mig-)?(?P<profile>(?P<slices>[0-9]+)g\.(?P<gb>[0-9]+)gb)$")

# ----------------------------------------------------------------------------- answer --


class ClusterLine(msgspec.Struct, frozen=True, kw_only=True):
    """One requested resource: its quantity, the bytes behind it, the rule and its source."""

    resource: str
    quantity: str
    bytes: int | None = None
    formula: str
    source: str


class ClusterAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """Kubernetes objects for the layout: ``pods`` identical pods (one per node), each as
    ``pod`` (device plugin) or ``dra_pod`` + ``resource_claim_template`` (DRA)."""

    gpu: str
    """The device the budget was computed for."""
    vendor: str
    pods: int
    """Pods of the layout, one per node (layouts over 8 GPUs fill whole 8-GPU nodes)."""
    devices_per_pod: int
    resource_name: str
    """The device plugin's resource: ``nvidia.com/gpu``, ``amd.com/gpu`` or
    ``nvidia.com/mig-<profile>``."""
    lines: tuple[ClusterLine, ...]
    pod: dict[str, Any]
    """A ``v1`` Pod requesting the GPUs from the device plugin."""
    resource_claim: dict[str, Any] | None = None
    """A ``resource.k8s.io/v1`` ResourceClaim for one pod's GPUs (NVIDIA's DRA driver); null
    for AMD."""
    resource_claim_template: dict[str, Any] | None = None
    """The same claim as a template: one claim per pod (for Deployments and StatefulSets)."""
    dra_pod: dict[str, Any] | None = None
    """The pod requesting the GPUs through the template instead of the device plugin."""
    warnings: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- rules --


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


class _Device(msgspec.Struct, frozen=True, kw_only=True):
    """What the cluster needs to know of the chosen device."""

    name: str
    vendor: str
    memory_mib: int
    """The smallest ``nvidia.com/gpu.memory`` / DRA ``memory`` (NVML total) the chosen card
    has: the catalog's nvidia-smi total when known, else its runtime total (a lower bound)."""
    memory_basis: str
    compute_capability: str | None
    mig_profiles: tuple[str, ...] = ()


def _device(ref: DeviceRef, req: ClusterRequest, field: str) -> _Device:
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
        return _Device(
            name=g.name,
            vendor=g.vendor,
            memory_mib=mib,
            memory_basis=basis,
            compute_capability=req.min_compute_capability or g.compute_capability,
            mig_profiles=tuple(p.name for p in g.mig_profiles),
        )
    del field
    return _Device(
        name=ref.name,
        vendor=req.vendor or "nvidia",
        memory_mib=ref.memory_total_bytes // MiB,
        memory_basis="the custom device's memory_total_bytes",
        compute_capability=req.min_compute_capability,
    )


def _devices_of(budget: Budget) -> int:
    """GPUs of one replica of the layout (co-located workloads and instances share them)."""
    return max(w.devices_per_instance for w in budget.workloads)


def _pods(devices: int, field: str) -> tuple[int, int]:
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


def _cpu(
    budget: Budget, workloads: tuple[Workload, ...], per_pod: int, req: ClusterRequest
) -> ClusterLine:
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
    host = budget.host_ram
    default = host.num_processes * (PROCESS_RSS_HIGH_BYTES - PROCESS_RSS_BYTES)
    words = f"{host.num_processes} processes x {PROCESS_RSS_HIGH_BYTES - PROCESS_RSS_BYTES} B"
    h = req.host_headroom
    if h is None:
        return default, words
    if h.fraction is not None:
        default = int(h.fraction * host.total_bytes + 0.5)  # fractions are exact to 1 B
        words = f"{h.fraction} x host RAM"
    if h.min_bytes > default:
        return h.min_bytes, f"min_bytes {h.min_bytes} B"
    return default, words


def _memory_lines(budget: Budget, req: ClusterRequest) -> tuple[ClusterLine, ClusterLine, int]:
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
    return memory, shm_line, shm


def _labels(req: ClusterRequest) -> dict[str, str]:
    return {"app.kubernetes.io/name": req.name, "app.kubernetes.io/managed-by": "vrambudget"}


def _metadata(req: ClusterRequest, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(req)}
    if req.namespace is not None:
        meta["namespace"] = req.namespace
    return meta


def _node_affinity(dev: _Device) -> dict[str, Any]:
    """GPU feature discovery's labels: memory at least the chosen card's, and (with a compute
    capability) major > M, or major == M and minor >= m."""
    memory = {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": [str(dev.memory_mib - 1)]}
    terms: list[dict[str, Any]]
    if dev.compute_capability is None:
        terms = [{"matchExpressions": [memory]}]
    else:
        major, minor = (int(x) for x in dev.compute_capability.split("."))
        newer = {"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": [str(major)]}
        same = {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": [str(major)]}
        same_major = [memory, same]
        if minor > 0:
            same_major.append(
                {
                    "key": "nvidia.com/gpu.compute.minor",
                    "operator": "Gt",
                    "values": [str(minor - 1)],
                }
            )
        terms = [{"matchExpressions": [memory, newer]}, {"matchExpressions": same_major}]
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}


def _cel(dev: _Device, mig: str | None) -> str:
    attrs = f'device.attributes["{DRA_DRIVER}"]'
    if mig is not None:
        return f'{attrs}.profile == "{mig}"'
    caps = f'device.capacity["{DRA_DRIVER}"]'
    parts = [f'"memory" in {caps}', f'{caps}.memory.compareTo(quantity("{dev.memory_mib}Mi")) >= 0']
    if dev.compute_capability is not None:
        parts.append(
            f'{attrs}.cudaComputeCapability.compareTo(semver("{dev.compute_capability}.0")) >= 0'
        )
    return " && ".join(parts)


def _claim_spec(dev: _Device, mig: str | None, count: int) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "exactly": {
                        "deviceClassName": "mig.nvidia.com" if mig else "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": count,
                        "selectors": [{"cel": {"expression": _cel(dev, mig)}}],
                    },
                }
            ]
        }
    }


def render(
    req: ClusterRequest,
    budget: Budget,
    workloads: tuple[Workload, ...],
    ref: DeviceRef,
    devices: int,
    field: str,
) -> ClusterAnswer:
    """The Kubernetes objects for ``budget``, laid out on ``devices`` devices of ``ref``."""
    dev = _device(ref, req, field)
    warnings: list[str] = []
    mig: str | None = None
    if req.mig_profile is not None:
        m = _MIG_NAME.match(req.mig_profile)
        assert m is not None  # the wire pattern
        mig = m["profile"]
        if mig not in dev.mig_profiles:
            allowed = ", ".join(dev.mig_profiles) or "none: the catalog lists no MIG profile"
            raise InvalidWorkload(
                "mig_profile", f"{mig} is not a MIG profile of {dev.name} (allowed: {allowed})"
            )
        capacity = int(m["gb"]) * 10**9
        if budget.total_bytes > capacity:
            raise InvalidWorkload(
                "mig_profile",
                f"the budget's {budget.total_bytes} B per device exceed the {m['gb']} GB "
                f"(10^9 B) of a {mig} instance; choose a larger profile or fit MIG devices",
            )
        warnings.append(
            f"the budget was computed for a whole {dev.name} and compared with the {m['gb']} "
            f"GB the profile's name states (the catalog has no exact MIG capacity)"
        )
    pods, per_pod = (1, devices) if mig else _pods(devices, field)
    if mig:
        resource, gpu_source = f"nvidia.com/mig-{mig}", SRC_MIG_MIXED
    elif dev.vendor == "amd":
        resource, gpu_source = AMD_GPU_RESOURCE, SRC_AMD_PLUGIN
    else:
        resource, gpu_source = NVIDIA_GPU_RESOURCE, SRC_NVIDIA_PLUGIN
    gpu_line = ClusterLine(
        resource=resource,
        quantity=str(per_pod),
        formula=f"{devices} devices of the layout / {pods} pod(s), one per node; requests = limits",
        source=gpu_source,
    )
    cpu = _cpu(budget, workloads, per_pod, req)
    memory, shm_line, shm = _memory_lines(budget, req)
    disk = budget.disk.total_bytes
    storage = ClusterLine(
        resource="ephemeral-storage",
        quantity=memory_quantity(disk),
        bytes=_rounded(disk),
        formula=f"disk {disk} B rounded up to MiB; a request only (a limit evicts the pod, and "
        f"logs and caches are not budgeted)",
        source=SRC_DISK,
    )
    base_requests = {
        "cpu": cpu.quantity,
        "memory": memory.quantity,
        "ephemeral-storage": storage.quantity,
    }
    base_limits = {"memory": memory.quantity}
    container: dict[str, Any] = {
        "name": req.name,
        "image": req.image,
        "resources": {
            "requests": {**base_requests, resource: str(per_pod)},
            "limits": {**base_limits, resource: str(per_pod)},
        },
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": memory_quantity(shm)}}
        ],
    }
    lines = [gpu_line, cpu, memory, shm_line, storage]
    node_selector: dict[str, str] = {}
    if dev.vendor == "nvidia":
        spec["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        if req.gpu_product_label:
            node_selector["nvidia.com/gpu.product"] = req.gpu_product_label
        lines.append(
            ClusterLine(
                resource="nodeAffinity",
                quantity=f"nvidia.com/gpu.memory > {dev.memory_mib - 1}"
                + (
                    f", compute capability >= {dev.compute_capability}"
                    if dev.compute_capability
                    else ""
                ),
                formula=f"GPU memory (MiB) at least the chosen card's ({dev.memory_basis})"
                + ("" if mig is None else "; not written for MIG (the resource name selects)"),
                source=f"{SRC_GFD}; {SRC_TOLERATION}",
            )
        )
    elif req.gpu_product_label:
        node_selector["amd.com/gpu.product-name"] = req.gpu_product_label
    pod_spec = dict(spec)
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if dev.vendor == "nvidia" and mig is None and req.node_affinity:
        pod_spec["affinity"] = {"nodeAffinity": _node_affinity(dev)}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(req, req.name),
        "spec": pod_spec,
    }
    if dev.vendor != "nvidia":
        warnings.append("no DRA claim: AMD's DRA driver is experimental; the device plugin only")
        return ClusterAnswer(
            gpu=dev.name,
            vendor=dev.vendor,
            pods=pods,
            devices_per_pod=per_pod,
            resource_name=resource,
            lines=tuple(lines),
            pod=pod,
            warnings=tuple(warnings),
        )
    claim_name = f"{req.name}-gpus"
    claim_spec = _claim_spec(dev, mig, per_pod)
    lines.append(
        ClusterLine(
            resource="resourceClaim",
            quantity=f"{per_pod} x {'mig' if mig else 'gpu'}.nvidia.com",
            formula=claim_spec["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"][
                "expression"
            ],
            source=SRC_DRA,
        )
    )
    dra_container = {
        **container,
        "resources": {
            "requests": base_requests,
            "limits": base_limits,
            "claims": [{"name": "gpus"}],
        },
    }
    dra_spec = {
        **spec,
        "containers": [dra_container],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": claim_name}],
    }
    if node_selector:
        dra_spec["nodeSelector"] = node_selector
    return ClusterAnswer(
        gpu=dev.name,
        vendor=dev.vendor,
        pods=pods,
        devices_per_pod=per_pod,
        resource_name=resource,
        lines=tuple(lines),
        pod=pod,
        resource_claim={
            "apiVersion": DRA_API,
            "kind": "ResourceClaim",
            "metadata": _metadata(req, claim_name),
            "spec": claim_spec,
        },
        resource_claim_template={
            "apiVersion": DRA_API,
            "kind": "ResourceClaimTemplate",
            "metadata": _metadata(req, claim_name),
            "spec": {"spec": claim_spec},
        },
        dra_pod={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": _metadata(req, f"{req.name}-dra"),
            "spec": dra_spec,
        },
        warnings=tuple(warnings),
    )


# ------------------------------------------------------------------------ entry point --


def _fits(budget: Budget) -> str | None:
    """Why the budget does not fit its device (None: it fits)."""
    if budget.serving is not None:
        return None if budget.serving.would_start else budget.serving.reason or "would not start"
    if budget.device is not None and budget.total_bytes > budget.device.memory_total_bytes:
        return (
            f"the most loaded device needs {budget.total_bytes} B, more than the "
            f"{budget.device.memory_total_bytes} B of {budget.device.name}"
        )
    return None


def _placed(w: Workload, lay: LayoutFit) -> Workload:
    """The fit's first workload on the chosen layout, as the fit laid it out."""
    if isinstance(w, GenericWorkload | ImageGenerationWorkload):  # one device; never fitted
        return w
    if isinstance(w, LLMServingWorkload):
        if w.engine in ("llama_cpp", "ollama"):  # the fit splits the layers over n GPUs
            opts = w.gguf if w.gguf is not None else GGUFOptions()
            split = opts.tensor_split if opts.devices == lay.device_count else None
            gguf = msgspec.structs.replace(opts, devices=lay.device_count, tensor_split=split)
            return msgspec.structs.replace(w, gguf=gguf)
        par = msgspec.structs.replace(
            w.parallelism, tensor=lay.tensor, pipeline=lay.pipeline, data=lay.data
        )
        return msgspec.structs.replace(w, parallelism=par)
    par_a = layout_for(w, lay.device_count)
    assert par_a is not None  # the fit laid it out on this count
    return msgspec.structs.replace(w, parallelism=par_a)


def _from_fit(src: FromFit, profiles: ProfileSet | None) -> tuple[BudgetRequest, DeviceRef, int]:
    answer = fit(src.request, profiles)
    names = [g.gpu_id if g.gpu_id is not None else g.name for g in answer.gpus]
    try:
        i = names.index(src.gpu_id)
    except ValueError:
        raise InvalidWorkload(
            "source.gpu_id", f"{src.gpu_id!r} is not a GPU of the fit (allowed: {', '.join(names)})"
        ) from None
    g = answer.gpus[i]
    counts = [lay.device_count for lay in g.layouts]
    if src.device_count not in counts:
        raise InvalidWorkload(
            "source.device_count",
            f"the fit has no layout of {src.device_count} devices on {g.name} (allowed: "
            f"{', '.join(map(str, counts)) or 'none'}; add it to device_counts)",
        )
    lay = g.layouts[counts.index(src.device_count)]
    if not lay.fits:
        fitting = [str(x.device_count) for x in g.layouts if x.fits]
        raise InvalidWorkload(
            "source.device_count",
            f"the workload does not fit {src.device_count} x {g.name} (allowed: the fitting "
            f"counts {', '.join(fitting) or 'none'}; smallest that fits: "
            f"{g.min_device_count})",
        )
    ref: DeviceRef
    if g.gpu_id is not None:
        ref = CatalogDevice(id=g.gpu_id)
    else:
        devices = src.request.devices or ()
        ref = next(d for d in devices if isinstance(d, CustomDevice) and d.name == g.name)
    req = src.request
    workloads = (_placed(req.workloads[0], lay), *req.workloads[1:])
    budget_req = BudgetRequest(
        workloads=workloads, device=ref, headroom=req.headroom, software=req.software
    )
    return budget_req, ref, src.device_count


def cluster_requests(req: ClusterRequest, profiles: ProfileSet | None = None) -> ClusterAnswer:
    """The Kubernetes requests of a budget, or of one layout of a fit. A field the inner
    budget or fit names is prefixed with ``source.request.``."""
    try:
        return _cluster_requests(req, profiles)
    except InvalidWorkload as exc:
        if exc.field.startswith(("source.", "mig_profile", "vendor")):
            raise
        raise InvalidWorkload(f"source.request.{exc.field}", exc.message) from None


def _cluster_requests(req: ClusterRequest, profiles: ProfileSet | None) -> ClusterAnswer:
    match req.source:
        case FromBudget(request=b):
            if b.method != "analytic":
                raise InvalidWorkload(
                    "source.request.method", "trace is not rendered; use analytic (the default)"
                )
            if b.device is None:
                raise InvalidWorkload(
                    "source.request.device",
                    "a cluster request needs the device: a catalog GPU or a custom device",
                )
            budget_req, ref, field = b, b.device, "source.request.workloads[0].parallelism"
            budget = estimate(b.workloads, b.device, b.headroom, profiles, b.software)
            devices = _devices_of(budget)
        case FromFit():
            budget_req, ref, devices = _from_fit(req.source, profiles)
            field = "source.device_count"
            budget = estimate(
                budget_req.workloads,
                ref,
                budget_req.headroom,
                profiles,
                budget_req.software,
            )
    why = _fits(budget)
    if why is not None:
        target = "source.request.device" if isinstance(req.source, FromBudget) else field
        raise InvalidWorkload(target, f"the layout does not fit: {why}")
    return render(req, budget, budget_req.workloads, ref, devices, field)
