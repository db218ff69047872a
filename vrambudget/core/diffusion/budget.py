"""The analytic budget of image-generation workloads: the walk of one pipeline call
(:mod:`.call`) replayed through the caching-allocator model, answered with the same shape as
every other budget -- one line per component at the allocated peak, the phases (text_encode,
denoise, vae_decode), host RAM and disk.

Lines (per device, ``instances`` processes each with its own copy):

* ``weights``: the parameters and buffers of the components on the GPU at the peak, by
  component (all of them; with ``cpu_offload: model`` the running one -- and the one before it
  until the first call of the next; with ``sequential`` the largest module);
* ``activations``: the live tensors of the walk at the peak;
* ``runtime_workspace``: the cuBLAS / cuBLASLt workspaces of the device type;
* ``allocator_overhead``: the replay's peak reserved bytes minus the bytes live at the
  allocated peak (512-byte rounding, unsplit remainders, cached segments);
* ``cuda_context`` and ``headroom`` as for every workload.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..bands import band_rule, resolve_headroom
from ..budget.explain import calibration_use, device_budget
from ..budget.stage import counted_bytes
from ..calibration import ProfileSet
from ..components import Component
from ..device import DeviceContext, resolve_device
from ..errors import InvalidWorkload
from ..formulas.gemm_workspaces import gemm_workspaces
from ..formulas.runtime_workspace import separate_cublaslt
from ..host import DEFAULT_DISK, PROCESS_RSS_BYTES, file_copies
from ..memo import BoundedCache
from ..overheads import DEFAULT_OVERHEADS, Overheads, with_software
from ..result import (
    Budget,
    DeviceBudget,
    DiskBudget,
    HostBudget,
    Item,
    WorkloadSummary,
)
from ..spec import DeviceRef, DiskOptions, Headroom, Software
from ..spec.diffusion import ImageGenerationWorkload
from ..stack import version_tuple
from .call import DENOISE_STEPS, walk_call
from .pipeline import Pipeline, resolve_pipeline
from .walk import Outcome, replay

__all__ = ["INPUT_NAMES", "diffusion_budget", "diffusion_outcome"]

C = Component

WEIGHTS_FORMULA = (
    "sum over the components on the GPU of params x bytes(precision) (+ fp32 modules the "
    "loader keeps, + buffers); model offload: the running component (and its predecessor until "
    "its first call); sequential offload: the largest module"
)
WEIGHTS_SOURCE = (
    "component inventories in closed form of diffusers 0.42.1 / transformers 5.23.0 __init__ "
    "(held equal to the libraries' meta-device module trees); offload: accelerate 1.15.0 "
    "hooks.py CpuOffload / AlignDevicesHook"
)
ACTIVATIONS_FORMULA = (
    "live tensors of the pipeline call at the peak, walked in the order the code allocates: "
    "text encoders, the denoiser on batch x cfg (UNet skips, resnet max(2 cin, cin + cout, "
    "4 cout), transformer block 20 c per token; DiT tokens (H/8/p)(W/8/p) + text), the VAE "
    "decoder (768 x H x W at the last level, or one tile)"
)
ACTIVATIONS_SOURCE = (
    "diffusers 0.42.1 pipelines/*/pipeline_*.py __call__, models/unets/unet_2d_condition.py, "
    "unet_2d_blocks.py, resnet.py, attention.py, attention_processor.py, transformers/"
    "transformer_{2d,sd3,flux}.py, autoencoders/autoencoder_kl.py + vae.py; CUDA SDPA backends "
    "(sdp_utils.cpp): O(s) flash / memory-efficient state"
)
OVERHEAD_FORMULA = "peak reserved - bytes live at the allocated peak (replay of the walk)"
OVERHEAD_SOURCE = (
    "replay of the walk through a model of c10/cuda/CUDACachingAllocator.cpp "
    "(vrambudget.core.allocator)"
)

_COMMON = ("precision", "instances")
INPUT_NAMES: dict[Component, tuple[str, ...]] = {
    C.WEIGHTS: ("pipeline", "precision", "cpu_offload", "instances"),
    C.ACTIVATIONS: (
        "height",
        "width",
        "batch_size",
        "denoiser_batch",
        "denoiser_tokens",
        "attention_slicing",
        "vae_tiling",
        "vae_slicing",
        *_COMMON,
    ),
    C.CUDA_CONTEXT: ("instances",),
    C.RUNTIME_WORKSPACE: ("instances",),
    C.ALLOCATOR_OVERHEAD: ("instances",),
    C.HEADROOM: ("headroom_fraction", "headroom_min_bytes", "subtotal_bytes"),
}
_TEXTS = {
    C.WEIGHTS: (WEIGHTS_FORMULA, WEIGHTS_SOURCE),
    C.ACTIVATIONS: (ACTIVATIONS_FORMULA, ACTIVATIONS_SOURCE),
    C.ALLOCATOR_OVERHEAD: (OVERHEAD_FORMULA, OVERHEAD_SOURCE),
}


_OUTCOMES: BoundedCache[tuple[object, ...], Outcome] = BoundedCache(256)


def diffusion_outcome(
    w: ImageGenerationWorkload,
    spaces: tuple[tuple[str, int], ...],
    field: str = "workloads[0]",
    flash_hw: bool = True,
) -> tuple[Pipeline, Outcome]:
    """The resolved pipeline and the replay of one call (cached by what they depend on) on a
    device with or without FlashAttention (``flash_hw``)."""
    p = resolve_pipeline(w, field)
    key = (msgspec.structs.replace(w, name=None, instances=1), spaces, flash_hw)
    hit = _OUTCOMES.get(key)
    if hit is None:
        hit = _OUTCOMES.put(key, replay(walk_call(p, w, spaces, DENOISE_STEPS, flash_hw)))
    return p, hit


def _inputs(w: ImageGenerationWorkload, p: Pipeline) -> dict[str, Any]:
    return {
        "pipeline": p.name,
        "precision": p.dtype,
        "height": w.height,
        "width": w.width,
        "batch_size": w.batch_size,
        "denoiser_batch": w.batch_size * p.cfg_batch,
        "denoiser_tokens": p.denoiser_tokens(w.height, w.width),
        "attention_slicing": w.attention_slicing,
        "vae_tiling": w.vae_tiling,
        "vae_slicing": w.vae_slicing,
        "cpu_offload": w.cpu_offload,
        "instances": w.instances,
    }


def _values(o: Outcome, ov: Overheads, k: int) -> dict[Component, int]:
    values = {c: 0 for c in Component}
    values.pop(C.HEADROOM)
    weights = o.components.get("weights", 0)
    act = o.components.get("activations", 0)
    ws = o.components.get("runtime_workspace", 0)
    values[C.WEIGHTS] = weights * k
    values[C.ACTIVATIONS] = act * k
    values[C.RUNTIME_WORKSPACE] = ws * k
    values[C.ALLOCATOR_OVERHEAD] = (o.peak_reserved - weights - act - ws) * k
    values[C.CUDA_CONTEXT] = ov.process_context_bytes("inference") * k
    return values


def _retext(device: DeviceBudget) -> DeviceBudget:
    """The lines whose words differ from the model workloads' (weights, activations, allocator
    overhead) get the diffusion texts."""
    lines = []
    for line in device.lines:
        texts = _TEXTS.get(line.component)
        if texts is not None:
            line = msgspec.structs.replace(line, formula=texts[0], source=texts[1])
        lines.append(line)
    return msgspec.structs.replace(device, lines=tuple(lines))


def _summary(w: ImageGenerationWorkload, p: Pipeline) -> WorkloadSummary:
    return WorkloadSummary(
        name=p.name,
        kind="image_generation",
        model_type=p.class_name,
        num_params=sum(c.inventory.num_params for c in p.components),
        num_layers=None,
        devices_per_instance=1,
        instances=w.instances,
    )


def _host_disk(
    pairs: list[tuple[ImageGenerationWorkload, Pipeline]], options: DiskOptions
) -> tuple[HostBudget, DiskBudget]:
    host: list[Item] = []
    disk: list[Item] = []
    processes = 0
    for w, p in pairs:
        processes += w.instances
        weights = sum(c.inventory.weight_bytes(p.dtype) for c in p.components)
        offloaded = w.cpu_offload != "none"
        host.append(
            Item(
                item=f"{p.name}: pipeline weights in host RAM"
                + (" (offloaded copies)" if offloaded else " (loaded on the CPU first)"),
                bytes=weights * w.instances,
                formula="sum of the components' parameters and buffers x instances"
                + ("; they stay in host RAM" if offloaded else "; freed after .to('cuda')"),
                source="diffusers DiffusionPipeline.from_pretrained loads every component on the "
                "CPU; enable_*_cpu_offload keeps them there (pipeline_utils.py)",
            )
        )
        stored = sum(
            c.inventory.num_params * (2 if p.dtype != "fp32" else 4)
            + sum(b.numel * 2 for b in c.inventory.buffers if b.persistent and b.dtype == "float")
            for c in p.components
        )
        disk.append(
            Item(
                item=f"{p.name}: safetensors of the variant matching precision",
                bytes=stored,
                formula="parameters x bytes(stored dtype) + persistent buffers",
                source="the checkpoint's safetensors (variant='fp16' for 16-bit precisions; "
                "the repositories' default fp32 files are twice as large)",
            )
        )
        disk += file_copies(p.name, stored, options, by_default=False)
    host.insert(
        0,
        Item(
            item="Python processes with torch and the CUDA libraries",
            bytes=processes * PROCESS_RSS_BYTES,
            formula=f"{processes} processes x {PROCESS_RSS_BYTES} B",
            source="an assumption (typical 1.5-3 GiB) until calibrated by probes",
        ),
    )
    return (
        HostBudget(
            num_processes=processes, items=tuple(host), total_bytes=sum(i.bytes for i in host)
        ),
        DiskBudget(items=tuple(disk), total_bytes=sum(i.bytes for i in disk)),
    )


def diffusion_budget(
    workloads: tuple[Any, ...],
    device: DeviceRef | None = None,
    headroom: Headroom | None = None,
    profiles: ProfileSet | None = None,
    software: Software | None = None,
    disk: DiskOptions = DEFAULT_DISK,
) -> Budget:
    """The answer for co-located image-generation workloads on one device type (``disk``:
    which extra copies of the pipelines' files the disk counts; none by default)."""
    for i, w in enumerate(workloads):
        if not isinstance(w, ImageGenerationWorkload):
            raise InvalidWorkload(
                f"workloads[{i}].kind",
                "an image_generation workload is budgeted with other image_generation "
                "workloads only",
            )
    ctx = resolve_device(device, profiles, software)
    ov = ctx.overheads if ctx else with_software(DEFAULT_OVERHEADS, software)
    band = band_rule(("other",), ov.stack)
    headroom = resolve_headroom(headroom or Headroom(), band)
    spaces = gemm_workspaces(
        ov.workspace_bytes,
        ctx.vendor if ctx else "nvidia",
        separate_cublaslt(version_tuple(ov.stack.torch_version)),
    )
    resolved = [
        diffusion_outcome(w, spaces, f"workloads[{i}]", ov.flash_hw)
        for i, w in enumerate(workloads)
    ]
    values: dict[Component, int] = {}
    parts: dict[Component, list[tuple[str, int]]] = {}
    phases: dict[str, int] = {}
    peaks = []
    context = 0
    for w, (p, o) in zip(workloads, resolved, strict=True):
        k = w.instances
        for c, v in _values(o, ov, k).items():
            values[c] = values.get(c, 0) + v
        for tag, comp in (("weights", C.WEIGHTS), ("activations", C.ACTIVATIONS)):
            for name, b in o.parts.get(tag, {}).items():
                label = name if len(workloads) == 1 else f"{p.name}: {name}"
                parts.setdefault(comp, []).append((label, b * k))
        context += ov.process_context_bytes("inference") * k
        for name, b in ov.context_parts("inference", k):
            label = name if len(workloads) == 1 else f"{p.name}: {name}"
            parts.setdefault(C.CUDA_CONTEXT, []).append((label, b))
        for name, reserved in o.phase_reserved:
            if name in ("text_encode", "denoise", "vae_decode"):
                phases[name] = phases.get(name, 0) + reserved * k
        peaks.append(o.peak_phase)
    single = len(workloads) == 1
    w0, (p0, _) = workloads[0], resolved[0]
    dev = device_budget(
        "every device" if single else "co-located image-generation workloads",
        None,
        1,
        peaks[0] if single else "; ".join(peaks),
        values,
        {c: tuple(v) for c, v in parts.items()},
        tuple((n, t + context) for n, t in phases.items()),
        _inputs(w0, p0) if single else {"workloads": len(workloads)},
        INPUT_NAMES,
        headroom,
        ov,
        band=band,
        counted=counted_bytes(values),
    )
    dev = _retext(dev)
    host, disk_budget = _host_disk(
        [(w, p) for w, (p, _) in zip(workloads, resolved, strict=True)], disk
    )
    return Budget(
        workloads=tuple(_summary(w, p) for w, (p, _) in zip(workloads, resolved, strict=True)),
        device=ctx.summary() if ctx is not None else None,
        devices=(dev,),
        most_loaded=0,
        total_bytes=dev.total_bytes,
        host_ram=host,
        disk=disk_budget,
        warnings=tuple(_warnings(workloads, resolved, ctx)),
        calibration=calibration_use(ov),
        stack=ov.stack.use(frozenset({"other"}), default_framework="diffusers"),
    )


def _warnings(
    workloads: tuple[Any, ...], resolved: list[tuple[Pipeline, Outcome]], ctx: DeviceContext | None
) -> list[str]:
    out: list[str] = []
    for w, (p, _) in zip(workloads, resolved, strict=True):
        if p.class_name == "StableDiffusionPipeline" and p.preset is not None:
            out.append(
                f"{p.name}: the safety checker the repository ships is not counted (load the "
                "pipeline with safety_checker=None)"
            )
        if w.attention_slicing != "none" and p.denoiser.class_name != "UNet2DConditionModel":
            out.append(f"{p.name}: attention slicing applies to UNet pipelines only; ignored")
        # A named precision is checked by the compatibility rules (dtype.bf16); the
        # pipeline's own default only here.
        if (
            ctx is not None
            and w.precision is None
            and p.dtype == "bf16"
            and "bf16" not in ctx.native_dtypes
        ):
            out.append(f"{ctx.name} has no native bf16 support: kernels fall back or fail")
    return out
