"""Kubernetes requests of a budget's layout (vrambudget.core.cluster): exact quantities from a
hand computation, the objects validated against the Kubernetes 1.34 schemas
(kubernetes-validate, offline), AMD and MIG variants, and the layouts that are refused."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import msgspec
import pytest

from vrambudget.core.catalog import preset
from vrambudget.core.cluster import ClusterAnswer, cluster_requests, memory_quantity
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.spec.cluster import ClusterRequest

MiB, GiB = 1 << 20, 1 << 30
K8S = "1.34.0"  # resource.k8s.io/v1 (DRA GA) is served from 1.34
H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}
A100 = {"source": "catalog", "id": "a100-sxm4-80gb"}
MI300X = {"source": "catalog", "id": "mi300x-192gb"}
LLAMA_8B_FILES = 16_060_522_496  # the preset's published safetensors total


def preset_model(name: str) -> dict[str, str]:
    return {"source": "preset", "id": name}


def serving(model: str, **fields: Any) -> dict[str, Any]:
    return {"kind": "llm_serving", "model": preset_model(model), **fields}


def inference(model: str, **fields: Any) -> dict[str, Any]:
    return {"kind": "inference", "model": preset_model(model), **fields}


def from_budget(workloads: list[dict[str, Any]], device: Any = H100, **opts: Any) -> ClusterAnswer:
    body = {"source": {"from": "budget", "request": {"workloads": workloads, "device": device}}}
    return cluster_requests(msgspec.convert({**body, **opts}, ClusterRequest))


def from_fit(request: dict[str, Any], gpu_id: str, device_count: int, **opts: Any) -> ClusterAnswer:
    body = {
        "source": {
            "from": "fit",
            "request": request,
            "gpu_id": gpu_id,
            "device_count": device_count,
        }
    }
    return cluster_requests(msgspec.convert({**body, **opts}, ClusterRequest))


def lines(a: ClusterAnswer) -> dict[str, str]:
    return {ln.resource: ln.quantity for ln in a.lines}


def objects(a: ClusterAnswer) -> list[dict[str, Any]]:
    return [
        o for o in (a.pod, a.resource_claim, a.resource_claim_template, a.dra_pod) if o is not None
    ]


def quantity_bytes(q: str) -> int:
    for suffix, unit in (("Gi", GiB), ("Mi", MiB)):
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * unit
    return int(q)


# ------------------------------------------------------------------------- quantities --


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0"),
        (1, "1Mi"),
        (MiB, "1Mi"),
        (MiB + 1, "2Mi"),
        (GiB - 1, "1024Mi"),
        (GiB, "1Gi"),
        (2 * GiB + 1, "2049Mi"),
        (17_179_869_184, "16Gi"),
    ],
)
def test_memory_quantity_rounds_up(n: int, expected: str) -> None:
    assert memory_quantity(n) == expected


@pytest.mark.parametrize("n", [1, 999, MiB - 1, 10**9, 10**9 + 1, 123_456_789_012, 2**40 + 3])
def test_memory_quantity_is_never_below_the_bytes_and_less_than_a_mib_above(n: int) -> None:
    q = quantity_bytes(memory_quantity(n))
    assert n <= q < n + MiB


# ------------------------------------------------------------- exact, by hand --


def test_vllm_tensor_parallel_2_on_h100_by_hand() -> None:
    assert preset("llama-3.1-8b").checkpoint.total_size_bytes == LLAMA_8B_FILES
    a = from_budget([serving("llama-3.1-8b", parallelism={"tensor": 2})])
    # host RAM: 2 processes x (2 GiB resident + min(files, 5 GB shard)); headroom 1 GiB per
    # process; /dev/shm 2 GiB; rounded up to MiB
    host = 2 * 2 * GiB + 2 * 5 * 10**9
    memory = host + 2 * GiB + 2 * GiB
    assert memory == 18_589_934_592
    mem_mib = -(-memory // MiB)
    assert mem_mib == 17_729  # 17,728.75 MiB rounded up
    disk_mib = -(-(3 * LLAMA_8B_FILES) // MiB)  # files, conversion space, a spare copy
    assert disk_mib == 45_950
    # vLLM: A + DP + N = 1 + 1 + 2 physical cores, x 2 hyperthreads
    assert lines(a) == {
        "nvidia.com/gpu": "2",
        "cpu": "8",
        "memory": "17729Mi",
        "/dev/shm": "2Gi",
        "ephemeral-storage": "45950Mi",
        "nodeAffinity": "nvidia.com/gpu.memory > 81558, compute capability >= 9.0",
        "resourceClaim": "2 x gpu.nvidia.com",
    }
    memory_line = next(ln for ln in a.lines if ln.resource == "memory")
    assert memory_line.bytes == 17_729 * MiB
    assert (a.pods, a.devices_per_pod, a.resource_name) == (1, 2, "nvidia.com/gpu")
    res = a.pod["spec"]["containers"][0]["resources"]
    assert res["requests"] == {
        "cpu": "8",
        "memory": "17729Mi",
        "ephemeral-storage": "45950Mi",
        "nvidia.com/gpu": "2",
    }
    assert res["limits"] == {"memory": "17729Mi", "nvidia.com/gpu": "2"}  # memory: req = lim
    assert a.pod["spec"]["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
    ]
    assert a.pod["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_dra_claim_selects_memory_and_compute_capability() -> None:
    a = from_budget([serving("llama-3.1-8b", parallelism={"tensor": 2})])
    assert a.resource_claim is not None and a.resource_claim_template is not None
    spec = a.resource_claim["spec"]
    assert a.resource_claim_template["spec"] == {"spec": spec}
    (req,) = spec["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert req["exactly"]["count"] == 2
    # the H100's nvidia-smi total (81,559 MiB, the catalog's) and its compute capability 9.0
    assert req["exactly"]["selectors"] == [
        {
            "cel": {
                "expression": '"memory" in device.capacity["gpu.nvidia.com"] && '
                'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("81559Mi")) >= 0 '
                '&& device.attributes["gpu.nvidia.com"].cudaComputeCapability'
                '.compareTo(semver("9.0.0")) >= 0'
            }
        }
    ]
    assert a.dra_pod is not None
    dra = a.dra_pod["spec"]
    assert dra["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": "vrambudget-workload-gpus"}
    ]
    res = dra["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in res["requests"] and res["claims"] == [{"name": "gpus"}]


def test_node_affinity_for_compute_capability_8_9() -> None:
    a = from_budget(
        [inference("llama-3.1-8b")], {"source": "catalog", "id": "l40s-48gb"}, hyperthreading=False
    )
    terms = a.pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    mem = {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["46067"]}
    assert terms == [
        {
            "matchExpressions": [
                mem,
                {"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["8"]},
            ]
        },
        {
            "matchExpressions": [
                mem,
                {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["8"]},
                {"key": "nvidia.com/gpu.compute.minor", "operator": "Gt", "values": ["8"]},
            ]
        },
    ]
    assert lines(a)["cpu"] == "1"  # 1 process x (1 + 0 workers), no hyperthreads


def test_node_affinity_can_be_left_out() -> None:
    a = from_budget([inference("qwen2.5-0.5b")], node_affinity=False)
    assert "affinity" not in a.pod["spec"]
    assert lines(a)["nodeAffinity"] == "none"
    assert a.pod["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_analytic_cpu_counts_dataloader_workers_and_custom_headroom() -> None:
    a = from_budget(
        [inference("llama-3.1-8b")],
        dataloader_workers=3,
        host_headroom={"fraction": 0.5},
        shm_bytes=GiB,
        gpu_product_label="NVIDIA-H100-80GB-HBM3",
    )
    host = 2 * GiB + 5 * 10**9  # one process
    memory = host + host // 2 + GiB
    assert lines(a)["cpu"] == "8"  # 1 x (1 + 3) cores x 2
    assert lines(a)["memory"] == f"{-(-memory // MiB)}Mi"
    assert lines(a)["/dev/shm"] == "1Gi"
    assert a.pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    b = from_budget([inference("llama-3.1-8b")], host_headroom={"min_bytes": 10 * GiB})
    assert lines(b)["memory"] == f"{-(-(host + 10 * GiB + 2 * GiB) // MiB)}Mi"


def test_fit_layout_over_two_nodes() -> None:
    fit = {
        "workloads": [serving("llama-3.1-70b")],
        "devices": [H100],
        "device_counts": [4, 16],
    }
    a = from_fit(fit, "h100-sxm5-80gb", 16)
    assert (a.pods, a.devices_per_pod) == (2, 8)
    # per pod (one host): 8 processes x (2 GiB + 5 GB shard) + 8 x 1 GiB + 2 GiB /dev/shm
    memory = 8 * (2 * GiB + 5 * 10**9) + 8 * GiB + 2 * GiB
    assert memory == 67_917_287_424  # 64,770.97 MiB, rounded up to 64,771
    assert lines(a)["memory"] == "64771Mi"
    assert lines(a)["nvidia.com/gpu"] == "8"
    assert lines(a)["cpu"] == str(2 * (1 + 1 + 8))


# ----------------------------------------------------------------- AMD and MIG --


def test_amd_uses_amd_gpu_and_no_dra_claim() -> None:
    a = from_budget([serving("llama-3.1-8b")], MI300X, gpu_product_label="AMD_Instinct_MI300X_OAM")
    assert (a.vendor, a.resource_name) == ("amd", "amd.com/gpu")
    assert a.pod["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1"
    assert "tolerations" not in a.pod["spec"] and "affinity" not in a.pod["spec"]
    assert a.pod["spec"]["nodeSelector"] == {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}
    assert a.resource_claim is None and a.dra_pod is None
    assert any("DRA" in w for w in a.warnings)


@pytest.mark.parametrize("name", ["1g.10gb", "nvidia.com/mig-1g.10gb"])
def test_mig_profile_by_name_or_resource_name(name: str) -> None:
    a = from_budget([inference("qwen2.5-0.5b")], A100, mig_profile=name)
    assert a.resource_name == "nvidia.com/mig-1g.10gb"
    limits = a.pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/mig-1g.10gb"] == "1" and "nvidia.com/gpu" not in limits
    assert "affinity" not in a.pod["spec"]  # the resource name selects the node
    assert lines(a)["nodeAffinity"] == "none"
    assert a.resource_claim is not None
    (req,) = a.resource_claim["spec"]["devices"]["requests"]
    assert req["exactly"]["deviceClassName"] == "mig.nvidia.com"
    assert req["exactly"]["selectors"] == [
        {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'}}
    ]


# ------------------------------------------------------------ Kubernetes schemas --


VARIANTS = {
    "vllm-tp2": lambda: from_budget([serving("llama-3.1-8b", parallelism={"tensor": 2})]),
    "two-nodes": lambda: from_fit(
        {"workloads": [serving("llama-3.1-70b")], "devices": [H100], "device_counts": [16]},
        "h100-sxm5-80gb",
        16,
        namespace="inference",
        name="llama-70b",
    ),
    "training": lambda: from_budget(
        [
            {
                "kind": "training",
                "model": preset_model("qwen2.5-0.5b"),
                "micro_batch_size": 1,
                "sequence_length": 512,
            }
        ]
    ),
    "amd": lambda: from_budget([serving("llama-3.1-8b")], MI300X),
    "mig": lambda: from_budget([inference("qwen2.5-0.5b")], A100, mig_profile="1g.10gb"),
    "custom": lambda: from_budget(
        [inference("qwen2.5-0.5b")],
        {"source": "custom", "name": "lab-card", "memory_total_bytes": 40 * GiB},
        min_compute_capability="8.0",
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_objects_validate_against_kubernetes_1_34(variant: str) -> None:
    a = VARIANTS[variant]()
    objs = objects(a)
    assert objs
    for obj in objs:
        kubernetes_validate.validate(obj, K8S, strict=True)  # raises on any error


def test_the_validator_rejects_a_broken_pod() -> None:
    """The schema check above can fail: an unknown field and a misspelt one are refused."""
    pod = from_budget([inference("qwen2.5-0.5b")]).pod
    broken = {**pod, "spec": {**pod["spec"], "nodeSelectr": {"a": "b"}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S, strict=True)
    claim = from_budget([inference("qwen2.5-0.5b")]).resource_claim
    assert claim is not None
    moved = {**claim, "spec": {"devices": {"requests": [{"name": "gpus", "count": 1}]}}}
    with pytest.raises(kubernetes_validate.ValidationError):  # v1 needs `exactly`
        kubernetes_validate.validate(moved, K8S, strict=True)


# --------------------------------------------------------------------- refused --


def refused(fn: Any) -> InvalidWorkload:
    with pytest.raises(InvalidWorkload) as exc:
        fn()
    return exc.value


FIT_70B = {"workloads": [serving("llama-3.1-70b")], "devices": [H100], "device_counts": [1, 4]}


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (lambda: from_fit(FIT_70B, "l4-24gb", 4), "source.gpu_id", "allowed: h100-sxm5-80gb"),
        (lambda: from_fit(FIT_70B, "h100-sxm5-80gb", 2), "source.device_count", "allowed: 1, 4"),
        (
            lambda: from_fit(FIT_70B, "h100-sxm5-80gb", 1),
            "source.device_count",
            "does not fit 1 x",
        ),
        (
            lambda: from_budget([inference("llama-3.1-8b")], A100, mig_profile="2g.10gb"),
            "mig_profile",
            "allowed: 1g.10gb",
        ),
        (
            lambda: from_budget(
                [inference("qwen2.5-0.5b")],
                {"source": "catalog", "id": "l4-24gb"},
                mig_profile="1g.10gb",
            ),
            "mig_profile",
            "catalog lists no MIG profile",
        ),
        (
            lambda: from_budget([inference("llama-3.1-8b")], A100, mig_profile="1g.10gb"),
            "mig_profile",
            "exceed the 8500000000 B a 1g.10gb instance holds",
        ),
        (
            lambda: from_budget(
                [inference("llama-3.1-8b", parallelism={"tensor": 4, "pipeline": 3})]
            ),
            "source.request.workloads[0].parallelism",
            "whole 8-GPU nodes",
        ),
        (
            lambda: from_budget([inference("llama-3.1-8b", parallelism={"tensor": 3})]),
            "source.request.workloads[0].parallelism.tensor",
            "must divide",
        ),
        (
            lambda: from_budget(
                [inference("llama-3.1-70b")], {"source": "catalog", "id": "l4-24gb"}
            ),
            "source.request.device",
            "does not fit",
        ),
        (lambda: from_budget([inference("llama-3.1-8b")], None), "source.request.device", "needs"),
        (lambda: from_budget([inference("llama-3.1-8b")], H100, vendor="amd"), "vendor", "nvidia"),
    ],
)
def test_refused_layouts_name_the_field(call: Any, field: str, words: str) -> None:
    exc = refused(call)
    assert exc.field == field
    assert words in exc.message


def test_a_mig_profile_is_checked_against_the_capacity_a_mig_fit_gives_it() -> None:
    # Qwen2.5-0.5B at batch 104 on an A100 80GB: about 9.0 x 10^9 B per device (the headroom
    # follows the fitted inference band), under the 10 x 10^9 B
    # of the name `1g.10gb` but over the 0.85 x 10 x 10^9 = 8,500,000,000 B the MIG fit gives an
    # instance without an nvidia-smi listing (core/mig.py): refused, as the MIG fit would.
    with pytest.raises(InvalidWorkload) as e:
        from_budget([inference("qwen2.5-0.5b", batch_size=104)], A100, mig_profile="1g.10gb")
    assert e.value.field == "mig_profile"
    needed = int(re.search(r"budget's (\d+) B per device", str(e.value)).group(1))  # type: ignore[union-attr]
    assert 8_500_000_000 < needed < 10 * 10**9 and "8500000000 B" in str(e.value)
    a = from_budget([inference("qwen2.5-0.5b", batch_size=96)], A100, mig_profile="1g.10gb")
    assert a.resource_name == "nvidia.com/mig-1g.10gb"


def test_a_budget_that_fits_only_a_bare_gpu_is_not_rendered() -> None:
    """Memory other processes hold on the device counts here as in the budget's own verdict:
    Llama 3.1 8B fits an RTX 4090 but not beside 20 GiB held elsewhere."""
    rtx = {"source": "catalog", "id": "rtx-4090-24gb"}
    assert from_budget([inference("llama-3.1-8b")], rtx) is not None
    with pytest.raises(InvalidWorkload, match=r"does not fit.*others hold") as exc:
        from_budget([inference("llama-3.1-8b")], {**rtx, "memory_in_use_bytes": 20 * GiB})
    assert exc.value.field == "source.request.device"
