"""Runtime overheads that only real hardware fixes exactly, per device type: the built-in
defaults (each component's constants and sources are in its formula module) or a calibration
profile's measurements (:mod:`vrambudget.core.calibration` replaces them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .formulas.allocator_overhead import (
    ALLOCATOR_FRAGMENTATION_FRACTION,
    FRAGMENTATION_SOURCE,
    INFERENCE_FRAGMENTATION_FRACTION,
    TRAINING_FRAGMENTATION_FRACTION,
    ppm,
)
from .formulas.communication_buffers import NCCL_SOURCE
from .formulas.cuda_context import (
    CUDA_CONTEXT_EAGER_BYTES,
    CUDA_CONTEXT_EAGER_SOURCE,
    default_context,
)
from .formulas.runtime_workspace import default_workspace
from .spec import Software
from .stack import DEFAULT_STACK, Stack, resolve_stack, version_tuple

__all__ = ["DEFAULT_OVERHEADS", "Overheads", "device_overheads", "with_software"]


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


def device_overheads(
    compute_capability: str | None, vendor: str, gfx_target: str | None
) -> Overheads:
    """The built-in overheads of a device type (its CUDA context and library workspaces)."""
    ws, ws_source = default_workspace(compute_capability, vendor, gfx_target)
    context, context_source = default_context(compute_capability, vendor)
    return Overheads(context, context_source, ws, ws_source)


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
    if stack.eager_modules and ov.profile is None:
        ov = dataclasses.replace(
            ov,
            cuda_context_bytes=max(ov.cuda_context_bytes, CUDA_CONTEXT_EAGER_BYTES),
            cuda_context_source=CUDA_CONTEXT_EAGER_SOURCE,
        )
    return ov
