"""The device a budget is for: a catalog GPU or a caller's custom device, resolved once into
what the formulas need (its memory, native dtypes and overheads, calibrated when a profile
matches). The one device resolver of the core: analytic budgets, fits, serving-engine budgets
and the trace tier all use it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .calibration import ProfileSet, apply_profile
from .catalog import GPU, gpu
from .errors import InvalidWorkload
from .memo import BoundedCache
from .overheads import DEFAULT_OVERHEADS, Overheads, device_overheads, with_software
from .result import DeviceSummary
from .spec import CatalogDevice, CustomDevice, DeviceRef, Software

__all__ = ["DeviceContext", "require_device", "resolve_device"]


@dataclass(frozen=True, slots=True)
class DeviceContext:
    name: str
    id: str | None
    memory_total_bytes: int
    architecture: str
    vendor: str
    native_dtypes: frozenset[str]
    overheads: Overheads
    compute_capability: str | None = None
    gfx_target: str | None = None
    memory_in_use_bytes: int = 0
    """Memory other processes hold before the workload starts (the request's device)."""
    nvidia_smi_total_mib: int | None = None
    """``nvidia-smi``'s total (the catalog's, where published): what engines that read
    nvidia-smi size their defaults from; the runtime's ``memory_total_bytes`` is smaller by the
    driver's reservation."""
    sm_count: int | None = None
    """Streaming multiprocessors (the catalog's, NVIDIA): what the bare CUDA context at a
    process's start grows with (:func:`~.formulas.cuda_context.start_context`)."""
    segment: str | None = None
    """The catalog's market segment (``datacenter``, ``workstation``, ``consumer``)."""

    @property
    def capacity_bytes(self) -> int:
        """What the workload may use: the total less what other processes hold. Every fit
        compares with it; an engine's own fraction (``gpu_memory_utilization``,
        ``mem_fraction_static``) still reads the total, as the engine does."""
        return self.memory_total_bytes - self.memory_in_use_bytes

    def summary(self) -> DeviceSummary:
        return DeviceSummary(
            name=self.name,
            id=self.id,
            memory_total_bytes=self.memory_total_bytes,
            architecture=self.architecture,
            memory_in_use_bytes=self.memory_in_use_bytes,
        )


_CONTEXTS: BoundedCache[str, DeviceContext] = BoundedCache(1024)  # by catalog id
_CALIBRATED: BoundedCache[tuple[DeviceContext, str, tuple[str, ...]], DeviceContext] = BoundedCache(
    4096
)  # custom devices are part of the key: bounded
_STACKED: BoundedCache[tuple[DeviceContext, Software], DeviceContext] = BoundedCache(4096)


def resolve_device(
    ref: DeviceRef | GPU | None,
    profiles: ProfileSet | None = None,
    software: Software | None = None,
    field: str = "device",
) -> DeviceContext | None:
    """The device's context; with ``profiles``, the overheads of the best-matching calibration
    profile replace the built-in ones. ``field``: where the request holds ``ref`` (errors name
    it)."""
    match ref:
        case None:
            return None
        case CatalogDevice():
            ctx = _catalog_context(gpu(ref.id))
        case GPU():
            ctx = _catalog_context(ref)
        case CustomDevice():
            ctx = DeviceContext(
                ref.name,
                None,
                ref.memory_total_bytes,
                ref.architecture,
                "nvidia",
                frozenset(ref.native_dtypes),
                DEFAULT_OVERHEADS,
            )
        case _:
            raise TypeError(ref)
    if not isinstance(ref, GPU) and ref.memory_in_use_bytes:
        ctx = _in_use(ctx, ref.memory_in_use_bytes, field)
    if software is not None:
        ctx = _STACKED.get_or(
            (ctx, software),
            lambda: dataclasses.replace(
                ctx,
                overheads=with_software(
                    ctx.overheads, software, ctx.compute_capability, ctx.vendor, ctx.gfx_target
                ),
            ),
        )
    if profiles:
        profile, matched = profiles.best(ctx.id, ctx.name, software)
        if profile is not None:
            key = (ctx, profile.id, matched)
            hit = _CALIBRATED.get(key)
            if hit is None:
                hit = _CALIBRATED.put(
                    key,
                    dataclasses.replace(
                        ctx, overheads=apply_profile(ctx.overheads, profile, matched)
                    ),
                )
            return hit
    return ctx


def _in_use(ctx: DeviceContext, in_use: int, field: str) -> DeviceContext:
    """The device with memory other processes hold (a 422 when that is all of it)."""
    if in_use >= ctx.memory_total_bytes:
        raise InvalidWorkload(
            f"{field}.memory_in_use_bytes",
            f"must be below the {ctx.name}'s {ctx.memory_total_bytes} bytes (got {in_use})",
        )
    return dataclasses.replace(ctx, memory_in_use_bytes=in_use)


def require_device(ref: DeviceRef | None, what: str) -> DeviceContext:
    """The device's context, or a 422 naming ``device`` when none was given."""
    ctx = resolve_device(ref)
    if ctx is None:
        raise InvalidWorkload("device", what)
    return ctx


def display_note(ctx: DeviceContext, engine: str) -> str | None:
    """A warning for an engine that sizes its pool from the memory free at its start, on a
    consumer card nothing is said to share: such a card often drives a display, and a desktop
    session holds memory first. Three published launches on Windows/WSL2 desktops did (0.58
    GiB on an RTX 3090 and 0.88 GiB on an RTX 4090 before SGLang measured, about 1.1 GiB on an
    RTX 5060 Ti before vLLM; docs/ACCURACY.md, *Serving engines across releases*). None where
    the request says what others hold, or for another segment."""
    if ctx.segment != "consumer" or ctx.memory_in_use_bytes:
        return None
    return (
        f"{ctx.name} is a consumer card: if it also drives a display, the desktop holds memory "
        f"before {engine} starts (0.6-1.1 GiB in three published launches on Windows/WSL2 "
        "desktops), which this answer, made for a card nothing else uses, does not subtract; "
        "give device.memory_in_use_bytes (nvidia-smi's used memory before the engine starts)"
    )


def _catalog_context(g: GPU) -> DeviceContext:
    ctx = _CONTEXTS.get(g.id)
    if ctx is None:
        ctx = _CONTEXTS.put(
            g.id,
            DeviceContext(
                g.name,
                g.id,
                g.memory_total_bytes,
                g.architecture,
                g.vendor,
                frozenset(g.native_dtypes),
                device_overheads(g.compute_capability, g.vendor, g.gfx_target),
                g.compute_capability,
                g.gfx_target,
                nvidia_smi_total_mib=g.nvidia_smi_total_mib,
                sm_count=g.sm_count,
                segment=g.segment,
            ),
        )
    return ctx
