"""The rest of the machine: host RAM and disk for the workloads of a budget."""

from __future__ import annotations

from typing import Any

from .arch import Arch
from .catalog import preset
from .dtypes import bytes_of, float_dtype
from .formulas.activations import offloaded_inputs_bytes
from .layout import GPUS_PER_NODE
from .resolve import model_name
from .resolved import ResolvedModel
from .result import DiskBudget, HostBudget, Item
from .spec import (
    AWQ,
    FP8,
    GPTQ,
    MXFP4,
    NVFP4,
    AnalyticWorkload,
    BitsAndBytes4bit,
    CompressedTensors,
    DiskOptions,
    EncoderWorkload,
    GenericWorkload,
    ModelWorkload,
    Parallelism,
    PresetModel,
    TrainingWorkload,
)
from .stack import Stack
from .statics import residual_bytes, stage_statics, statics_for, training_plan
from .units import GiB

__all__ = [
    "DEFAULT_DISK",
    "PROCESS_RSS_BYTES",
    "PROCESS_RSS_HIGH_BYTES",
    "checkpoint_file_bytes",
    "file_copies",
    "host_and_disk",
    "persistent_key",
]

# transformers PreTrainedModel.save_pretrained(max_shard_size="5GB"): the largest shard a
# process reads at once when loading (safetensors, device_map on the GPU).
MAX_SHARD_BYTES = 5 * 10**9
# Resident memory of one Python process with torch and the CUDA libraries loaded: an assumption
# (typical 1.5-3 GiB) until calibrated by probes.
PROCESS_RSS_BYTES = 2 * GiB
PROCESS_RSS_HIGH_BYTES = 3 * GiB
"""The top of that typical range (the headroom of a cluster's memory request)."""
DEFAULT_DISK = DiskOptions()
"""The request's default ``disk`` options (each copy at its default)."""


def _prequantized(w: ModelWorkload | EncoderWorkload) -> bool:
    """A checkpoint stored quantized (bitsandbytes only when saved so: it quantizes while
    loading otherwise)."""
    q = w.precision.quantization
    if isinstance(q, BitsAndBytes4bit):
        return q.prequantized
    return w.precision.weights == "fp8" or isinstance(
        q, GPTQ | AWQ | FP8 | MXFP4 | NVFP4 | CompressedTensors
    )


def checkpoint_file_bytes(w: ModelWorkload | EncoderWorkload, arch: Arch) -> int:
    """Bytes of the model files to download: exactly the stored tensors when the checkpoint's
    headers are known; a pre-quantized checkpoint (GPTQ, AWQ, fp8, MXFP4, NVFP4,
    compressed-tensors, a saved bitsandbytes one) is as large as its quantized tensors;
    otherwise the published checkpoint (bitsandbytes quantizes while loading), exactly its
    safetensors total when the preset records it."""
    if isinstance(w.model, ResolvedModel) and w.model.stored_total is not None:
        return w.model.stored_total
    if _prequantized(w):
        whole = stage_statics(arch, w.precision, Parallelism(), None)  # the whole model
        return sum(s.weights_bytes + s.metadata_bytes for s in whole)
    if isinstance(w.model, PresetModel):
        facts = preset(w.model.id).checkpoint
        if facts.total_size_bytes:
            return facts.total_size_bytes
        dtype = float_dtype(facts.stored_dtype) or "bf16"
        return arch.checkpoint_num_params * bytes_of(dtype)
    return arch.checkpoint_num_params * bytes_of(w.precision.weights)  # fp8 returned above


def _name(w: AnalyticWorkload) -> str:
    if isinstance(w, GenericWorkload):
        return w.name or "generic"
    return w.name or model_name(w.model)


def _local_processes(w: AnalyticWorkload) -> int:
    devices = 1 if isinstance(w, GenericWorkload) else w.parallelism.devices
    return min(devices * w.instances, GPUS_PER_NODE)  # one process per GPU of a host


def persistent_key(w: AnalyticWorkload) -> Any:
    """What host RAM and disk depend on: not batch, context or concurrency (except where host
    RAM holds activations: offloaded checkpointing). Budgets that differ only in those share
    one cached answer."""
    if isinstance(w, GenericWorkload):
        return w
    offloaded = (
        (w.sequence_length, w.micro_batch_size, w.gradient_accumulation_steps)
        if isinstance(w, TrainingWorkload) and w.checkpointing == "offloaded"
        else None
    )
    return (
        type(w),
        w.name,
        w.model,
        w.precision,
        w.parallelism,
        w.instances,
        getattr(w, "method", None),
        getattr(w, "optimizer", None),
        getattr(w, "mixed_precision", None),
        offloaded,
    )


def host_and_disk(
    pairs: tuple[tuple[AnalyticWorkload, Arch | None], ...],
    disk: DiskOptions = DEFAULT_DISK,
    stack: Stack | None = None,
) -> tuple[HostBudget, DiskBudget]:
    """Host RAM and disk of co-located workloads (``disk``: which copies of the model files
    the disk counts) under ``stack`` (the framework's model layout: LitGPT's own LM head,
    QLoRA's unquantized dtype; None: the default stack's)."""
    return _compute_host(pairs, stack), _compute_disk(pairs, disk, stack)


def file_copies(name: str, files: int, disk: DiskOptions, *, by_default: bool) -> list[Item]:
    """The extra copies of a workload's model files (``files`` bytes each) that the request's
    ``disk`` options count; an option left null counts its copy when ``by_default`` (safetensors
    checkpoints) and not otherwise (a GGUF file, a diffusers pipeline). Each copy is a
    provisioning convention, not a framework requirement: ``disk.conversion_copy`` for a
    conversion or merge that writes a full new copy, ``disk.update_copy`` for a blue/green
    update. Worked: Llama 3.1 8B's 16,060,522,496 B of safetensors with both defaults: 2 x
    16,060,522,496 = 32,121,044,992 B besides the files."""
    items: list[Item] = []
    if by_default if disk.conversion_copy is None else disk.conversion_copy:
        items.append(
            Item(
                item=f"{name}: temporary conversion space",
                bytes=files,
                formula="one more copy of the model files (format conversion or "
                "merging writes a full copy before replacing)",
                source="convention (request option disk.conversion_copy)",
            )
        )
    if by_default if disk.update_copy is None else disk.update_copy:
        items.append(
            Item(
                item=f"{name}: spare copy for updates",
                bytes=files,
                formula="one copy of the model files (blue/green update)",
                source="convention (request option disk.update_copy)",
            )
        )
    return items


def _compute_host(
    pairs: tuple[tuple[AnalyticWorkload, Arch | None], ...], stack: Stack | None = None
) -> HostBudget:
    items: list[Item] = []
    processes = 0
    for w, arch in pairs:
        n = _local_processes(w)
        processes += n
        name = _name(w)
        items.append(
            Item(
                item=f"{name}: process runtime",
                bytes=n * PROCESS_RSS_BYTES,
                formula=f"{n} processes x {PROCESS_RSS_BYTES} B",
                source="assumption: torch + CUDA libraries resident set; calibrate",
            )
        )
        if isinstance(w, GenericWorkload) or arch is None:
            continue
        files = checkpoint_file_bytes(w, arch)
        load = min(files, MAX_SHARD_BYTES) * n
        items.append(
            Item(
                item=f"{name}: weight loading peak",
                bytes=load,
                formula=f"{n} processes x min(model files, 5 GB shard)",
                source="transformers save_pretrained max_shard_size='5GB'; "
                "safetensors loads one shard at a time",
            )
        )
        if isinstance(w, TrainingWorkload):
            statics = statics_for(w, arch, stack)  # the same cached statics as the device budget
            worst = max(statics, key=lambda s: s.host_step_bytes + s.host_param_bytes)
            offload = worst.host_step_bytes
            if offload:
                items.append(
                    Item(
                        item=f"{name}: offloaded optimizer state, master weights and gradient "
                        "partition (pinned)",
                        bytes=offload * n,
                        formula=f"{n} ranks x per-rank partition",
                        source="Ren et al. 2021 (ZeRO-Offload) §4",
                    )
                )
            residual = residual_bytes(w, stack)
            offloaded = max(offloaded_inputs_bytes(w, arch, s.stage, residual) for s in statics)
            if offloaded:
                items.append(
                    Item(
                        item=f"{name}: offloaded layer inputs (activation offloading, pinned)",
                        bytes=offloaded * n,
                        formula=f"{n} ranks x layers x micro-batches in flight x s x b x h x "
                        "residual bytes",
                        source="unsloth models/_utils.py Unsloth_Offloaded_Gradient_Checkpointer "
                        "(hidden_states.to('cpu')); torchtune OffloadActivations",
                    )
                )
            if worst.host_param_bytes:
                items.append(
                    Item(
                        item=f"{name}: offloaded parameters (pinned)",
                        bytes=worst.host_param_bytes * n,
                        formula=f"{n} ranks x per-rank partition",
                        source="Rajbhandari et al. 2021 (ZeRO-Infinity) §5",
                    )
                )
    return HostBudget(
        num_processes=processes, items=tuple(items), total_bytes=sum(i.bytes for i in items)
    )


def _compute_disk(
    pairs: tuple[tuple[AnalyticWorkload, Arch | None], ...],
    disk: DiskOptions,
    stack: Stack | None = None,
) -> DiskBudget:
    items: list[Item] = []
    for w, arch in pairs:
        name = _name(w)
        if isinstance(w, GenericWorkload) or arch is None:
            assets = sum(a.bytes for a in w.assets) if isinstance(w, GenericWorkload) else 0
            items.append(
                Item(
                    item=f"{name}: asset files",
                    bytes=assets,
                    formula="sum of assets",
                    source="caller",
                )
            )
            continue
        files = checkpoint_file_bytes(w, arch)
        items.append(
            Item(
                item=f"{name}: model files",
                bytes=files,
                formula="checkpoint bytes (quantized size for pre-quantized formats)",
                source="preset checkpoint facts (safetensors index) or params x dtype",
            )
        )
        items += file_copies(name, files, disk, by_default=True)
        if isinstance(w, TrainingWorkload):
            plan = training_plan(w, stack)
            untied = stack is not None and stack.untied_head
            whole = stage_statics(arch, w.precision, Parallelism(), plan, untied)  # unsharded
            if plan.method == "full":
                state = sum(s.weights_bytes + s.master_bytes + s.optimizer_bytes for s in whole)
                formula = "weights + master weights + optimizer state of the whole model"
            else:
                state = sum(s.adapter_bytes + s.master_bytes + s.optimizer_bytes for s in whole)
                formula = (
                    "adapters (and modules_to_save copies) + their master weights and "
                    "optimizer state"
                )
            items.append(
                Item(
                    item=f"{name}: training checkpoint",
                    bytes=state,
                    formula=formula,
                    source="resumable checkpoint = model states (ZeRO §3)",
                )
            )
    return DiskBudget(items=tuple(items), total_bytes=sum(i.bytes for i in items))
