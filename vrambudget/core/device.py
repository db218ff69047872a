"""The device a budget is for: a catalog GPU or a caller's custom device, resolved once into
what the formulas need (its memory, native dtypes and overheads, calibrated when a profile
matches). The one device resolver of the core: analytic budgets, fits, serving-engine budgets
and the trace tier all use it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from .calibration import ProfileSet, apply_profile
from .catalog import GPU, gpu, runtime_gaps
from .desktop import desktop_hold, hold_basis
from .errors import InvalidWorkload
from .memo import BoundedCache
from .overheads import DEFAULT_OVERHEADS, Overheads, device_overheads, with_software
from .result import DeviceSummary
from .spec import CatalogDevice, CustomDevice, DeviceRef, Software

__all__ = ["DeviceContext", "held_note", "require_device", "resolve_device", "total_note"]


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
    desktop_session: Literal["windows", "linux", "none"] | None = None
    """The request's ``desktop_session`` (None: not said)."""
    in_use_below: int = 0
    in_use_above: int = 0
    """How far below and above ``memory_in_use_bytes`` the real hold may lie: a desktop's
    published spread where the hold is assumed (:mod:`.desktop`), 0 where it was measured."""
    in_use_basis: str | None = None
    """Where an assumed hold comes from (None: the request's own number)."""
    total_basis: str = "runtime"
    """How ``memory_total_bytes`` is known (the catalog's ``memory_total_basis``; a custom
    device's: the caller's number, taken as the runtime's)."""

    @property
    def capacity_bytes(self) -> int:
        """What the workload may use: the total less what other processes hold. Every fit
        compares with it; an engine's own fraction (``gpu_memory_utilization``,
        ``mem_fraction_static``) still reads the total, as the engine does."""
        return self.memory_total_bytes - self.memory_in_use_bytes

    @property
    def capacity_low_bytes(self) -> int:
        """The capacity if others hold the high end of their assumed hold: what a "fits"
        verdict and the largest batch / context must hold under."""
        return self.capacity_bytes - self.in_use_above

    def at_hold(self, high: bool) -> DeviceContext:
        """The device with the high (or low) end of an assumed hold as what others hold, as if
        measured (no spread left); itself where the hold is measured (or none)."""
        if self.in_use_basis is None:
            return self
        held = self.memory_in_use_bytes + (self.in_use_above if high else -self.in_use_below)
        return dataclasses.replace(
            self, memory_in_use_bytes=held, in_use_below=0, in_use_above=0, in_use_basis=None
        )

    def summary(self) -> DeviceSummary:
        assumed = self.in_use_basis is not None
        return DeviceSummary(
            name=self.name,
            id=self.id,
            memory_total_bytes=self.memory_total_bytes,
            architecture=self.architecture,
            memory_in_use_bytes=self.memory_in_use_bytes,
            desktop_session=self.desktop_session,
            memory_in_use_low_bytes=self.memory_in_use_bytes - self.in_use_below
            if assumed
            else None,
            memory_in_use_high_bytes=self.memory_in_use_bytes + self.in_use_above
            if assumed
            else None,
            memory_in_use_basis=self.in_use_basis,
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
    if not isinstance(ref, GPU):
        if ref.memory_in_use_bytes:
            ctx = _in_use(ctx, ref.memory_in_use_bytes, field)
        if ref.desktop_session is not None:
            ctx = _desktop(ctx, ref.desktop_session, field)
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


def _desktop(
    ctx: DeviceContext, session: Literal["windows", "linux", "none"], field: str
) -> DeviceContext:
    """The device that drives ``session``: where the request did not measure what others hold,
    a desktop's published hold and its spread (a 422 when the hold's high end leaves nothing)."""
    if session == "none" or ctx.memory_in_use_bytes:
        return dataclasses.replace(ctx, desktop_session=session)
    h = desktop_hold(session)
    if h.high_bytes >= ctx.memory_total_bytes:
        raise InvalidWorkload(
            f"{field}.desktop_session",
            f"a {session} desktop holds up to {h.high_bytes} bytes, the {ctx.name}'s whole "
            f"{ctx.memory_total_bytes}: give memory_in_use_bytes as measured",
        )
    return dataclasses.replace(
        ctx,
        memory_in_use_bytes=h.typical_bytes,
        desktop_session=session,
        in_use_below=h.typical_bytes - h.low_bytes,
        in_use_above=h.high_bytes - h.typical_bytes,
        in_use_basis=hold_basis(session),
    )


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
    if ctx.segment != "consumer" or ctx.memory_in_use_bytes or ctx.desktop_session is not None:
        return None
    return (
        f"{ctx.name} is a consumer card: if it also drives a display, the desktop holds memory "
        f"before {engine} starts (0.6-1.1 GiB in three published launches on Windows/WSL2 "
        "desktops), which this answer, made for a card nothing else uses, does not subtract; "
        "give device.memory_in_use_bytes (nvidia-smi's used memory before the engine starts), "
        "or device.desktop_session to assume a desktop's published hold"
    )


def total_note(ctx: DeviceContext | None) -> str | None:
    """A warning where a catalog GPU's total is nvidia-smi's rather than the CUDA runtime's:
    the runtime reports less on every catalog GPU with both (the driver's reservation), so a
    fit within that margin may not hold. None for a runtime total (or a custom device)."""
    if ctx is None or ctx.total_basis != "nvidia_smi":
        return None
    low, high = runtime_gaps()
    return (
        f"{ctx.name}: memory_total_bytes is nvidia-smi's total (no runtime printout is cited "
        f"for this card); the CUDA runtime reports {low >> 20}-{-(-high >> 20)} MiB less on the "
        "catalog's GPUs that have both (the driver's reservation), so an answer within that "
        "margin of the capacity may not fit"
    )


def held_note(ctx: DeviceContext) -> str:
    """A fit's note where what others hold is assumed (a desktop session's): the capacity is
    the total less the median hold, and the verdicts and maxima hold at its high end."""
    return (
        f"capacity_bytes leaves out {ctx.in_use_basis}; the verdicts, the largest values and "
        f"the fewest devices hold beside the high end of that hold "
        f"({ctx.memory_in_use_bytes + ctx.in_use_above} bytes), on every GPU of a layout"
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
                total_basis=g.memory_total_basis,
            ),
        )
    return ctx
