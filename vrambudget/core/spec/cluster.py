"""What a caller sends to have an answer rendered as Kubernetes requests
(``POST /v1/cluster-requests``): the budget or fit it comes from, the chosen layout, and the
few choices the cluster needs that a budget does not say (the image, the pod's name)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from .limits import MAX_SOLVED_DEVICE_COUNT, Bytes, Wire
from .requests import BudgetRequest, FitRequest, Headroom

__all__ = ["ClusterRequest", "ClusterSource", "FromBudget", "FromFit"]

DNSLabel = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=50,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="A Kubernetes object name (RFC 1123 label, at most 50 characters: the "
        "answer appends `-gpus` and `-dra`).",
    ),
]


class FromBudget(Wire, tag="budget", tag_field="from", frozen=True, kw_only=True):
    """The layout is the budget's: its device and each workload's parallelism."""

    request: Annotated[
        BudgetRequest,
        Meta(description="A `POST /v1/budgets` body (`method: analytic`); `device` is required."),
    ]


class FromFit(Wire, tag="fit", tag_field="from", frozen=True, kw_only=True):
    """The layout is one row of the fit's answer: ``gpus[gpu_id].layouts[device_count]``."""

    request: Annotated[FitRequest, Meta(description="A `POST /v1/fits` body.")]
    gpu_id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=128,
            description="The fit's GPU: a catalog id, or a custom device's `name`.",
        ),
    ]
    device_count: Annotated[
        int,
        Meta(
            ge=1,
            le=MAX_SOLVED_DEVICE_COUNT,
            description="The layout's device count: one of the fit's `device_counts`, or the "
            "GPU's `min_device_count`.",
        ),
    ]


ClusterSource = FromBudget | FromFit

CapabilityVersion = Annotated[str, Meta(pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")]
MIGName = Annotated[
    str, Meta(min_length=1, max_length=64, pattern=r"^(nvidia\.com/mig-)?[0-9]+g\.[0-9]+gb$")
]
Namespace = Annotated[
    str, Meta(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
LabelValue = Annotated[
    str, Meta(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
]


class ClusterRequest(Wire, frozen=True, kw_only=True):
    """A budget or fit, the layout chosen from it, and how to name the pod."""

    source: Annotated[
        ClusterSource,
        Meta(
            description='`{"from": "budget", "request": ...}` or `{"from": "fit", '
            '"request": ..., "gpu_id": ..., "device_count": ...}`.'
        ),
    ]
    mig_profile: Annotated[
        MIGName | None,
        Meta(
            description="Run on MIG instances of the GPU instead of whole GPUs: a profile of "
            "the catalog GPU (`1g.10gb`), or its device-plugin resource name "
            "(`nvidia.com/mig-1g.10gb`). The layout's device count is then the number of "
            "instances.",
        ),
    ] = None
    name: DNSLabel = "vrambudget-workload"
    namespace: Annotated[
        Namespace | None,
        Meta(
            description="Namespace of the objects; default (null): none written.",
        ),
    ] = None
    image: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=512,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$",
            description="Container image reference of the pod (the budget does not know it).",
        ),
    ] = "replace-with-your-image:latest"
    host_headroom: Annotated[
        Headroom | None,
        Meta(
            description="Margin on the budget's host RAM: max(fraction x host RAM, "
            "min_bytes). Default (null): the process resident set at the top of its typical "
            "range (1 GiB more per process than the budget assumes)."
        ),
    ] = None
    shm_bytes: Annotated[
        Bytes | None,
        Meta(
            description="Size of the memory-backed `/dev/shm` (counted in the memory limit). "
            "Default (null): 2 GiB, vLLM's Kubernetes example."
        ),
    ] = None
    dataloader_workers: Annotated[
        int,
        Meta(
            ge=0,
            le=256,
            description="PyTorch DataLoader worker processes per GPU process (inference and "
            "training workloads): each adds a CPU core. Default 0, PyTorch's.",
        ),
    ] = 0
    hyperthreading: Annotated[
        bool,
        Meta(
            description="The nodes' CPUs are hyperthreads: a Kubernetes CPU is half a "
            "physical core, so the cores are requested twice."
        ),
    ] = True
    vendor: Annotated[
        Literal["nvidia", "amd"] | None,
        Meta(
            description="The GPU vendor of a custom device (default nvidia); a catalog GPU's "
            "is the catalog's."
        ),
    ] = None
    min_compute_capability: Annotated[
        CapabilityVersion | None,
        Meta(
            description="NVIDIA: the lowest compute capability the node and the DRA selector "
            "accept (`8.0`). Default (null): the chosen catalog GPU's."
        ),
    ] = None
    node_affinity: Annotated[
        bool,
        Meta(
            description="NVIDIA whole GPUs: require nodes whose GPU feature discovery labels "
            "show at least the chosen card's memory and compute capability. Set false on "
            "clusters without GPU feature discovery (the pod would never be scheduled)."
        ),
    ] = True
    gpu_product_label: Annotated[
        LabelValue | None,
        Meta(
            description="The product label your nodes carry (`nvidia.com/gpu.product` from GPU "
            "feature discovery, e.g. `NVIDIA-H100-80GB-HBM3`; `amd.com/gpu.product-name` from "
            "AMD's node labeller): written as a nodeSelector. The catalog does not hold these "
            "names.",
        ),
    ] = None
