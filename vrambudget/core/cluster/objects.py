"""The Kubernetes objects of a layout, as plain dicts: a ``v1`` Pod requesting the GPUs from the
device plugin, and (NVIDIA) a ``resource.k8s.io/v1`` ResourceClaim, the same spec as a
ResourceClaimTemplate and the Pod that uses it. Node placement follows GPU feature discovery's
labels; the claim's CEL selector uses NVIDIA's DRA driver's names (``sources``)."""

from __future__ import annotations

from typing import Any

import msgspec

from ..result import Budget
from ..spec import DeviceRef, Workload
from ..spec.cluster import ClusterRequest
from .resources import (
    ChosenDevice,
    ClusterLine,
    chosen_device,
    cpu_line,
    gpu_line,
    memory_lines,
    mig_profile,
    pods_of,
    storage_line,
)
from .sources import DRA_API, DRA_DRIVER, SRC_DRA, SRC_GFD, SRC_TOLERATION

__all__ = ["ClusterAnswer", "render"]

_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


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


def _metadata(req: ClusterRequest, name: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": req.name, "app.kubernetes.io/managed-by": "vrambudget"}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if req.namespace is not None:
        meta["namespace"] = req.namespace
    return meta


def _node_affinity(dev: ChosenDevice) -> dict[str, Any]:
    """GPU feature discovery's labels: memory at least the chosen card's, and (with a compute
    capability M.m) major > M, or major == M and minor >= m."""
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


def _placement_line(dev: ChosenDevice, mig: str | None, written: bool) -> ClusterLine:
    capability = (
        f", compute capability >= {dev.compute_capability}" if dev.compute_capability else ""
    )
    if written:
        quantity = f"nvidia.com/gpu.memory > {dev.memory_mib - 1}{capability}"
        formula = f"GPU memory (MiB) at least the chosen card's ({dev.memory_basis})"
    else:
        quantity = "none"
        formula = (
            "not written: the MIG resource name selects the node"
            if mig is not None
            else "not written (node_affinity: false); the toleration only"
        )
    return ClusterLine(
        resource="nodeAffinity",
        quantity=quantity,
        formula=formula,
        source=f"{SRC_GFD}; {SRC_TOLERATION}",
    )


def _cel(dev: ChosenDevice, mig: str | None) -> str:
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


def _claim_spec(dev: ChosenDevice, mig: str | None, count: int) -> dict[str, Any]:
    exactly = {
        "deviceClassName": "mig.nvidia.com" if mig else "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": count,
        "selectors": [{"cel": {"expression": _cel(dev, mig)}}],
    }
    return {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}


def _pod(req: ClusterRequest, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _metadata(req, name), "spec": spec}


def render(
    req: ClusterRequest,
    budget: Budget,
    workloads: tuple[Workload, ...],
    ref: DeviceRef,
    devices: int,
    field: str,
) -> ClusterAnswer:
    """The Kubernetes objects for ``budget``, laid out on ``devices`` devices of ``ref``
    (``field``: where a layout that cannot be split into pods is refused)."""
    dev = chosen_device(ref, req)
    mig_and_warning = mig_profile(req, dev, budget)
    mig = mig_and_warning[0] if mig_and_warning else None
    warnings = [mig_and_warning[1]] if mig_and_warning else []
    pods, per_pod = (1, devices) if mig else pods_of(devices, field)
    gpus = gpu_line(dev, mig, devices, pods)
    cpu = cpu_line(budget, workloads, per_pod, req)
    memory, shm = memory_lines(budget, req)
    storage = storage_line(budget)
    lines = [gpus, cpu, memory, shm, storage]
    requests = {
        "cpu": cpu.quantity,
        "memory": memory.quantity,
        "ephemeral-storage": storage.quantity,
    }
    limits = {"memory": memory.quantity}
    gpu = {gpus.resource: gpus.quantity}
    container: dict[str, Any] = {
        "name": req.name,
        "image": req.image,
        "resources": {"requests": {**requests, **gpu}, "limits": {**limits, **gpu}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm.quantity}}],
    }
    affinity = dev.vendor == "nvidia" and mig is None and req.node_affinity
    if dev.vendor == "nvidia":
        spec["tolerations"] = [_TOLERATION]
        lines.append(_placement_line(dev, mig, affinity))
    if req.gpu_product_label:
        label = "nvidia.com/gpu.product" if dev.vendor == "nvidia" else "amd.com/gpu.product-name"
        spec["nodeSelector"] = {label: req.gpu_product_label}
    pod_spec = dict(spec)
    if affinity:
        pod_spec["affinity"] = {"nodeAffinity": _node_affinity(dev)}
    answer = ClusterAnswer(
        gpu=dev.name,
        vendor=dev.vendor,
        pods=pods,
        devices_per_pod=per_pod,
        resource_name=gpus.resource,
        lines=tuple(lines),
        pod=_pod(req, req.name, pod_spec),
    )
    if dev.vendor != "nvidia":
        warnings.append("no DRA claim: AMD's DRA driver is experimental; the device plugin only")
        return msgspec.structs.replace(answer, warnings=tuple(warnings))
    return _with_claim(answer, req, dev, mig, container, spec, warnings)


def _with_claim(
    answer: ClusterAnswer,
    req: ClusterRequest,
    dev: ChosenDevice,
    mig: str | None,
    container: dict[str, Any],
    spec: dict[str, Any],
    warnings: list[str],
) -> ClusterAnswer:
    """The answer with the DRA objects: the claim, its template, and the pod that uses the
    template (the container's GPU resource replaced by the claim)."""
    claim_name = f"{req.name}-gpus"
    claim_spec = _claim_spec(dev, mig, answer.devices_per_pod)
    line = ClusterLine(
        resource="resourceClaim",
        quantity=f"{answer.devices_per_pod} x {'mig' if mig else 'gpu'}.nvidia.com",
        formula=_cel(dev, mig),
        source=SRC_DRA,
    )
    resources = container["resources"]
    dra_container = {
        **container,
        "resources": {
            "requests": {
                k: v for k, v in resources["requests"].items() if k != answer.resource_name
            },
            "limits": {k: v for k, v in resources["limits"].items() if k != answer.resource_name},
            "claims": [{"name": "gpus"}],
        },
    }
    dra_spec = {
        **spec,
        "containers": [dra_container],
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": claim_name}],
    }
    return msgspec.structs.replace(
        answer,
        lines=(*answer.lines, line),
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
        dra_pod=_pod(req, f"{req.name}-dra", dra_spec),
        warnings=tuple(warnings),
    )
