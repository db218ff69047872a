"""MIG instances as devices: the memory a fit gives one MIG instance of a catalog GPU, the
Kubernetes resource it is requested by, and the smallest profile a workload fits in.

What a fit assumes on a MIG instance (docs/MIG.md):

- **One instance, no tensor parallelism across instances.** MIG instances have no
  peer-to-peer path: every ``nvidia-smi mig -lgip`` listing cited in the catalog prints
  ``P2P No`` for every profile, and "When using MIG, NVLink and NVSwitch are thus completely
  unavailable, forcing the application to take a more expensive communication channel via the
  system (CPU) memory" (RAPIDS, https://docs.rapids.ai/deployment/stable/guides/mig). A workload
  that needs several GPUs is not offered a MIG instance.
- **The capacity is the instance's memory** (:func:`capacity`): the listed size at the low end
  of nvidia-smi's two decimals, or, with no listing, 0.85 x the profile name's GB.
- **The same per-process overheads as the whole GPU.** The CUDA context and library workspaces
  keep the parent GPU's built-in values: the context "grows with the SM count"
  (:mod:`vrambudget.core.formulas.cuda_context`), and an instance has at most the GPU's SMs, so
  the whole GPU's context is an upper bound for an instance's (no public measurement of a
  context inside a MIG instance was found).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Literal

from .catalog import GPU, MIG_COMPUTE_SLICES, MIGProfile, gpus
from .result import MIGFit

__all__ = [
    "MARKETING_CAPACITY_PPM",
    "MIGDevice",
    "Verdict",
    "capacity",
    "mig_devices",
    "resource_name",
    "smallest_fitting",
]

GIB = 1 << 30

MARKETING_CAPACITY_PPM = 850_000
"""A profile without a published listing gets 0.85 x its name's GB (decimal) as capacity.
Every listed profile in the catalog holds more: the lowest ratio of a listing's bytes to its
name's GB is 0.895 (an early HGX GB200 ``1g.24gb`` at 20.00 GiB, NVIDIA/gpu-operator#1303);
``tests/core/test_mig.py`` checks the rule against every listing."""

RESOURCE_PREFIX = "nvidia.com/mig-"
"""The NVIDIA device plugin's ``mixed`` MIG strategy exposes each profile as its own resource,
``nvidia.com/mig-<profile>``: "a container cannot request both an nvidia.com/gpu and an
nvidia.com/mig-3g.20gb at the same time. However, it can request multiple instances of the same
resource type (e.g. nvidia.com/gpu: 2 or nvidia.com/mig-3g.20gb: 2)"
(https://github.com/NVIDIA/k8s-device-plugin/releases/tag/v0.7.0-rc.1). Under the ``single``
strategy the instances are plain ``nvidia.com/gpu`` instead."""

ASSUMPTIONS = (
    "one MIG instance: MIG instances have no peer-to-peer path (nvidia-smi lists P2P No), so no "
    "tensor parallelism across instances",
    "the CUDA context and workspaces of the whole GPU (an upper bound: an instance has fewer SMs)",
)

Basis = Literal["nvidia_smi", "marketing"]


@dataclass(frozen=True, slots=True)
class MIGDevice:
    """One MIG profile of a catalog GPU as a device to fit against."""

    gpu: GPU
    profile: MIGProfile
    capacity_bytes: int
    basis: Basis

    @property
    def name(self) -> str:
        """As CUDA names the device: the GPU's name and the profile."""
        return f"{self.gpu.name} MIG {self.profile.name}"


def _hundredths(text: str) -> int:
    whole, _, frac = text.partition(".")
    return int(whole) * 100 + int((frac + "00")[:2])


def _name_gb(name: str) -> int:
    """The ``gb`` number of a profile name: ``3g.40gb`` -> 40."""
    return int(name.split(".")[1].removesuffix("gb"))


def capacity(gpu: GPU, p: MIGProfile) -> tuple[int, Basis]:
    """The bytes a fit gives one instance of ``p``, and how they are known.

    - listed (``nvidia_smi``): nvidia-smi prints GiB rounded to two decimals, so the instance
      has at least ``(h - 0.5) / 100`` GiB for a printed ``h`` hundredths:
      ``(2h - 1) x 2^30 // 200``. Worked number: H200 ``1g.18gb`` prints 16.00 ->
      (3200 - 1) x 2^30 // 200 = 17,174,500,474 B.
    - no listing (``marketing``): ``N GB x 0.85``: ``3g.40gb`` -> 34,000,000,000 B.

    Never more than the whole GPU's runtime total."""
    basis: Basis
    if p.memory_gib_2dp is not None:
        h = _hundredths(p.memory_gib_2dp)
        value, basis = (2 * h - 1) * GIB // 200, "nvidia_smi"
    else:
        value = _name_gb(p.name) * 1_000_000_000 * MARKETING_CAPACITY_PPM // 1_000_000
        basis = "marketing"
    return min(value, gpu.memory_total_bytes), basis


def resource_name(p: MIGProfile) -> str:
    """``nvidia.com/mig-3g.40gb``: the device plugin's mixed-strategy resource."""
    return RESOURCE_PREFIX + p.name


@cache
def mig_devices(gpu_id: str | None) -> tuple[MIGDevice, ...]:
    """The MIG profiles of a catalog GPU, smallest first (by capacity, then compute slices:
    between equal memories the profile with more instances per GPU comes first); () for a GPU
    without MIG or a custom device. Cached: the catalog is fixed for the process, and a
    whole-catalog fit asks once per GPU."""
    g = gpus().get(gpu_id) if gpu_id is not None else None
    if g is None:
        return ()
    out = [MIGDevice(g, p, *capacity(g, p)) for p in g.mig_profiles]
    return tuple(sorted(out, key=lambda d: (d.capacity_bytes, d.profile.compute_slices)))


Verdict = Literal["fits", "fits_if_low", "does_not_fit"]


def smallest_fitting(
    gpu_id: str | None, check: Callable[[MIGDevice], tuple[bool, int, Verdict]]
) -> MIGFit | None:
    """The smallest MIG profile of ``gpu_id`` whose one instance holds the workload, by
    ``check(device) -> (fits, total_bytes, verdict)`` (profiles of equal capacity share one
    check: only the memory differs between devices); when none does, the largest with ``fits``
    false; None for a GPU without MIG."""
    devices = mig_devices(gpu_id)
    if not devices:
        return None
    result: tuple[MIGDevice, tuple[bool, int, Verdict]] | None = None
    by_capacity: dict[int, tuple[bool, int, Verdict]] = {}  # equal memories, one check
    for d in devices:
        if d.capacity_bytes not in by_capacity:
            by_capacity[d.capacity_bytes] = check(d)
        result = (d, by_capacity[d.capacity_bytes])
        if result[1][0]:
            break
    assert result is not None
    d, (fits, total, verdict) = result
    p = d.profile
    return MIGFit(
        mig_instance_of=d.gpu.id,
        profile=p.name,
        resource_name=resource_name(p),
        instances_per_gpu=p.max_instances,
        compute_slices=p.compute_slices,
        memory_fraction=p.memory_fraction,
        capacity_bytes=d.capacity_bytes,
        capacity_basis=d.basis,
        total_bytes=total,
        free_bytes=d.capacity_bytes - total,
        fits=fits,
        verdict=verdict,
        assumptions=(
            *ASSUMPTIONS,
            f"{p.compute_slices} of {MIG_COMPUTE_SLICES} compute slices: about "
            f"{p.compute_slices}/{MIG_COMPUTE_SLICES} of the GPU's SMs (and of its speed)",
        ),
    )
