"""The sources of the cluster rules: each resource name, label and constant with the text it
follows (repository @ commit, or the page, and a verbatim quote)."""

from __future__ import annotations

from ..units import GiB

__all__ = [
    "AMD_GPU_RESOURCE",
    "DEFAULT_SHM_BYTES",
    "DRA_API",
    "DRA_DRIVER",
    "NVIDIA_GPU_RESOURCE",
    "SRC_AMD_PLUGIN",
    "SRC_DISK",
    "SRC_DRA",
    "SRC_ENGINE_CPU",
    "SRC_GFD",
    "SRC_HOST_HEADROOM",
    "SRC_HYPERTHREADS",
    "SRC_MIG_MIXED",
    "SRC_NVIDIA_PLUGIN",
    "SRC_PROCESS_CPU",
    "SRC_REQUEST_EQ_LIMIT",
    "SRC_SHM",
    "SRC_TMPFS",
    "SRC_TOLERATION",
    "SRC_VLLM_CPU",
]


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
