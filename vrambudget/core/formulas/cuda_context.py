"""CUDA context: device memory the driver takes per process before any tensor exists.

Shown in answers::

    one context per process

with the device type's source: a calibration profile's measurement, or one of the built-in
defaults below.
"""

from __future__ import annotations

from ..units import MiB

__all__ = [
    "CUDA_CONTEXT_BYTES",
    "CUDA_CONTEXT_DATACENTER_BYTES",
    "CUDA_CONTEXT_DATACENTER_SOURCE",
    "CUDA_CONTEXT_EAGER_BYTES",
    "CUDA_CONTEXT_EAGER_SOURCE",
    "CUDA_CONTEXT_SOURCE",
    "FORMULA",
    "SOURCE",
    "default_context",
    "per_device",
]

FORMULA = "one context per process"

# Device memory of a PyTorch process's CUDA context with lazy module loading (the default since
# torch 1.13, pytorch/pytorch#86509): 426 MiB on an RTX 6000 Ada, torch 2.10.0+cu130, measured by
# nvidia-smi per process before any tensor (unslothai/unsloth-zoo#1053). Other public points:
# 256 MiB RTX 3090 torch 2.7.1 (invoke-ai/InvokeAI#9413); "around 400MB if CUDA >= 11.7 is used
# and lazy module loading enabled" (pytorch/pytorch#109888). It grows with the SM count and with
# kernels loaded as ops first run; eager module loading costs 0.7-1.7 GB (pytorch/pytorch#55277).
# Datacenter Hopper/Blackwell (compute capability 9.x/10.x): ~534 MiB for a bare primary
# context on an H100 (meta-pytorch/torchcomms#777, 2026 stack, lazy loading; the only public
# datacenter lazy-loading record found). The median of the six public lazy-loading bare-context
# records is 463 MiB (range 256-616).
CUDA_CONTEXT_BYTES = 426 * MiB
CUDA_CONTEXT_SOURCE = (
    "measured: 426 MiB, RTX 6000 Ada, torch 2.10 (lazy loading), "
    "unslothai/unsloth-zoo#1053; ~400 MB per pytorch/pytorch#109888; "
    "public range 256-616 MiB (research/overhead_measurements.md)"
)
CUDA_CONTEXT_DATACENTER_BYTES = 534 * MiB
CUDA_CONTEXT_DATACENTER_SOURCE = (
    "measured: ~534 MiB, H100, bare primary context, lazy loading (meta-pytorch/torchcomms#777); "
    "public range 256-616 MiB (research/overhead_measurements.md)"
)
SOURCE = CUDA_CONTEXT_SOURCE
# Eager module loading (CUDA_MODULE_LOADING=EAGER, or a CUDA runtime before 11.7): every kernel
# image of torch's libraries is loaded into the context at creation. The one same-machine A/B
# (pytorch/pytorch#86509, torch 1.13): 666,632,192 B eager against 287,047,680 B lazy,
# cudaMemGetInfo total - free with a 6.4 MB tensor. Other eager points: 721 MB GTX 1080 cu101,
# 1,687 MB RTX 3090 cu111 (pytorch/pytorch#55277), 543 MiB (pytorch/pytorch#81257).
CUDA_CONTEXT_EAGER_BYTES = 666_632_192
CUDA_CONTEXT_EAGER_SOURCE = (
    "measured: 666,632,192 B with eager module loading against 287,047,680 B lazy on one "
    "machine (pytorch/pytorch#86509); eager range 543 MiB - 1,687 MB "
    "(research/overhead_measurements.md)"
)


def default_context(compute_capability: str | None, vendor: str) -> tuple[int, str]:
    """(bytes, source) of one process's context on a device type: 534 MiB on NVIDIA compute
    capability 9.x/10.x (Hopper, datacenter Blackwell), 426 MiB otherwise."""
    major = int(compute_capability.split(".")[0]) if compute_capability else 0
    if vendor == "nvidia" and major in (9, 10):
        return CUDA_CONTEXT_DATACENTER_BYTES, CUDA_CONTEXT_DATACENTER_SOURCE
    return CUDA_CONTEXT_BYTES, CUDA_CONTEXT_SOURCE


def per_device(context_bytes: int, processes: int) -> int:
    """``processes x context``: one context per process on the device.

    Worked number: two inference instances on an H100: 2 x 534 MiB = 1,119,879,168 B."""
    return context_bytes * processes
