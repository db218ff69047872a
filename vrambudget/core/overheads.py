"""Runtime overheads that only real hardware fixes exactly, per device type: the built-in
defaults (each component's constants and sources are in its formula module) or a calibration
profile's measurements (:mod:`vrambudget.core.calibration` replaces them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from .arch import SCORES_MATERIALIZED, Arch
from .formulas.allocator_overhead import (
    ALLOCATOR_FRAGMENTATION_FRACTION,
    CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION,
    EAGER_INFERENCE_FRAGMENTATION_FRACTION,
    EXPANDABLE_FRACTIONS,
    EXPANDABLE_SOURCE,
    FRAGMENTATION_SOURCE,
    INFERENCE_FRAGMENTATION_FRACTION,
    TRAINING_FRAGMENTATION_FRACTION,
    ppm,
)
from .formulas.communication_buffers import NCCL_SOURCE
from .formulas.cuda_context import (
    CONTEXT_PART,
    CUDA_CONTEXT_EAGER_BYTES,
    CUDA_CONTEXT_EAGER_SOURCE,
    KERNEL_IMAGES_PART,
    default_context,
    eager_context,
    kernel_images,
    wheel_cuda,
)
from .formulas.runtime_workspace import default_workspace
from .formulas.sdpa import flash_hardware, mem_efficient_gqa, transformers_sdpa_backend
from .spec import Software
from .stack import DEFAULT_STACK, Stack, resolve_stack, version_tuple

__all__ = ["DEFAULT_OVERHEADS", "Overheads", "device_overheads", "with_software"]


@lru_cache(maxsize=4096)
def _sdpa_math(
    heads: int,
    kv_heads: int,
    head_dim: int,
    stack: Stack,
    flash_hw: bool,
    vendor: str,
    compute: str,
    masked: bool,
) -> bool:
    """:meth:`Overheads.sdpa_math` for a model without MLA, keyed by what it reads (``Stack``
    hashes by identity, and the stacks are themselves cached: a lookup costs a tuple hash)."""
    if stack.transformers_version is None:
        return False
    backend = transformers_sdpa_backend(
        dtype=compute,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        native_gqa=stack.sdpa_native_gqa,
        flash_hw=flash_hw,
        mem_efficient_gqa=mem_efficient_gqa(version_tuple(stack.torch_version), vendor),
        mask=masked,
    )
    return backend == "math"


@dataclass(frozen=True, slots=True)
class Overheads:
    """Per-process device overheads for one device type: the built-in defaults, or a
    calibration profile's measurements (``profile`` names it)."""

    cuda_context_bytes: int
    cuda_context_source: str
    workspace_bytes: int
    workspace_source: str
    inference_fragmentation_ppm: int = ppm(INFERENCE_FRAGMENTATION_FRACTION)
    training_fragmentation_ppm: int = ppm(TRAINING_FRAGMENTATION_FRACTION)
    generic_fragmentation_ppm: int = ppm(ALLOCATOR_FRAGMENTATION_FRACTION)
    eager_inference_fragmentation_ppm: int = ppm(EAGER_INFERENCE_FRAGMENTATION_FRACTION)
    """Inference with eager attention; never below ``inference_fragmentation_ppm`` (a profile's
    measured inference fraction raises it): :meth:`inference_fragmentation`."""
    checkpointed_training_fragmentation_ppm: int = ppm(CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION)
    """Training with full activation checkpointing; never below ``training_fragmentation_ppm``:
    :meth:`training_fragmentation`."""
    fragmentation_source: str = FRAGMENTATION_SOURCE
    nccl_communicator_bytes: int | None = None
    """A measured NCCL communicator's bytes; None: the built-in pair/group values."""
    communication_source: str = NCCL_SOURCE
    profile: str | None = None
    """The calibration profile these values came from (None: built-in defaults)."""
    profile_match: tuple[str, ...] = ()
    """What the profile matched on (``gpu``, ``torch``, ``cuda``, ``driver``)."""
    stack: Stack = DEFAULT_STACK
    """The software these overheads are for, and the behaviours the formulas follow."""
    kernel_images_inference_bytes: int = 0
    """Kernel images an inference's ops load into the context after it exists (lazy module
    loading; 0 where the context holds them from the start or none were measured)."""
    kernel_images_training_bytes: int = 0
    """The same for a training step (backward and optimizer kernels too)."""
    flash_hw: bool = True
    """The device runs SDPA's FlashAttention kernel, and its memory-efficient one in bf16
    (:func:`vrambudget.core.formulas.sdpa.flash_hardware`: NVIDIA sm80+, or unknown)."""
    vendor: str = "nvidia"
    """The device's vendor (NVIDIA's memory-efficient SDPA kernel takes grouped heads from torch
    2.14)."""

    def sdpa_math(self, arch: Arch, compute: str, masked: bool = False) -> bool:
        """Whether transformers' SDPA attention runs torch's math path for ``arch`` in the
        ``compute`` dtype on this device and stack (an unpadded batch; ``masked``: a
        sliding-window layer's call with its mask:
        :func:`vrambudget.core.formulas.sdpa.transformers_sdpa_backend`); False for frameworks
        with their own attention code (their calls are not modelled here). Cached per
        (attention shape, stack, device kind): the budget and the solver ask it on every
        evaluation."""
        if arch.mla is not None:
            return False
        return _sdpa_math(
            arch.num_heads,
            arch.num_kv_heads,
            arch.head_dim,
            self.stack,
            self.flash_hw,
            self.vendor,
            compute,
            masked,
        )

    @property
    def mem_efficient_gqa(self) -> bool:
        """SDPA's memory-efficient kernel takes grouped K/V heads: NVIDIA, torch 2.14 on."""
        return mem_efficient_gqa(version_tuple(self.stack.torch_version), self.vendor)

    def inference_fragmentation(self, attention: str) -> int:
        """The inference fraction, in millionths, for the attention implementation that runs
        (:func:`vrambudget.core.arch.attention_run`): SDPA's math path materializes the scores
        as eager attention does, and takes its fraction."""
        if attention in SCORES_MATERIALIZED:
            return max(self.eager_inference_fragmentation_ppm, self.inference_fragmentation_ppm)
        return self.inference_fragmentation_ppm

    def training_fragmentation(self, checkpointing: str) -> int:
        """The training fraction, in millionths, for the workload's activation checkpointing."""
        if checkpointing == "full":
            return max(
                self.checkpointed_training_fragmentation_ppm, self.training_fragmentation_ppm
            )
        return self.training_fragmentation_ppm

    def kernel_images_bytes(self, kind: str) -> int:
        """The kernel images of a workload kind (``training`` or anything else: inference)."""
        if kind == "training":
            return self.kernel_images_training_bytes
        return self.kernel_images_inference_bytes

    def process_context_bytes(self, kind: str) -> int:
        """One process's device memory outside the allocator: the context and the kernel
        images its ops load."""
        return self.cuda_context_bytes + self.kernel_images_bytes(kind)

    def context_parts(self, kind: str, processes: int) -> tuple[tuple[str, int], ...]:
        """The context line's parts for ``processes`` processes (none without kernel images)."""
        images = self.kernel_images_bytes(kind)
        if not images:
            return ()
        return (
            (CONTEXT_PART, self.cuda_context_bytes * processes),
            (KERNEL_IMAGES_PART, images * processes),
        )


def device_overheads(
    compute_capability: str | None, vendor: str, gfx_target: str | None
) -> Overheads:
    """The built-in overheads of a device type (its CUDA context and library workspaces)."""
    ws, ws_source = default_workspace(compute_capability, vendor, gfx_target)
    context, context_source = default_context(compute_capability, vendor)
    return Overheads(
        context,
        context_source,
        ws,
        ws_source,
        kernel_images_inference_bytes=kernel_images("inference", vendor, eager=False),
        kernel_images_training_bytes=kernel_images("training", vendor, eager=False),
        flash_hw=flash_hardware(compute_capability, vendor),
        vendor=vendor,
    )


DEFAULT_OVERHEADS = device_overheads(None, "nvidia", None)
"""A device of unknown type (or none named): the larger cuBLAS default, the 426 MiB context."""


def with_software(
    ov: Overheads,
    software: Software | None,
    compute_capability: str | None = None,
    vendor: str = "nvidia",
    gfx_target: str | None = None,
) -> Overheads:
    """The overheads of a device type for a software stack: its behaviours, the BLAS
    workspaces of its torch release, and the eager-loading context where the stack loads
    modules eagerly (a calibration profile's measurements are kept)."""
    if software is None:
        return ov
    stack = resolve_stack(software)
    if stack is ov.stack:
        return ov
    ov = dataclasses.replace(ov, stack=stack)
    if ov.profile is None:
        ws, ws_source = default_workspace(
            compute_capability, vendor, gfx_target, version_tuple(stack.torch_version)
        )
        ov = dataclasses.replace(ov, workspace_bytes=ws, workspace_source=ws_source)
    if stack.eager_modules and vendor == "nvidia":
        # Eager: the context as created holds torch's kernel images, the first GEMM brings
        # cuBLAS's whole set from CUDA 11 on (kernel_images(eager=True)); with no CUDA named,
        # the release's wheels' (wheel_cuda).
        cuda = version_tuple(software.cuda_version) if software.cuda_version else None
        if cuda is None:
            cuda = wheel_cuda(stack.torch_version)
        if ov.profile is None:
            context, source = eager_context(cuda, ov.process_context_bytes("training"))
            ov = dataclasses.replace(ov, cuda_context_bytes=context, cuda_context_source=source)
        images = kernel_images("training", vendor, eager=True, cuda_version=cuda)
        ov = dataclasses.replace(
            ov, kernel_images_inference_bytes=images, kernel_images_training_bytes=images
        )
    elif stack.eager_modules and ov.profile is None:  # other vendors: the torch 1.13 A/B
        ov = dataclasses.replace(
            ov,
            cuda_context_bytes=max(ov.cuda_context_bytes, CUDA_CONTEXT_EAGER_BYTES),
            cuda_context_source=CUDA_CONTEXT_EAGER_SOURCE,
        )
    if stack.expandable_segments:
        # A profile's fractions were measured with fixed segments (calibrate leaves out probes
        # that ran with expandable ones): the expandable fractions replace them.
        ov = dataclasses.replace(
            ov,
            inference_fragmentation_ppm=ppm(EXPANDABLE_FRACTIONS["sdpa"]),
            eager_inference_fragmentation_ppm=ppm(EXPANDABLE_FRACTIONS["eager"]),
            training_fragmentation_ppm=ppm(EXPANDABLE_FRACTIONS["training"]),
            checkpointed_training_fragmentation_ppm=ppm(EXPANDABLE_FRACTIONS["checkpointing"]),
            fragmentation_source=EXPANDABLE_SOURCE,
        )
    return ov
