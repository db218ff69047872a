"""DeepSpeed ZeRO-3 on a model built outside ``deepspeed.zero.Init``, replayed through the
allocator model: ``deepspeed.initialize`` moves the whole model to the device, then partitions
its parameters one at a time; the allocator keeps the freed segments until ZeRO-3 defragments
the partitions.

What DeepSpeed 0.19.2 runs (read in its sdist):

- ``runtime/engine.py`` ``_configure_distributed_model`` (lines 1569-1585): a model whose
  parameters carry no ``ds_id`` (not built under ``zero.Init``) is moved whole with
  ``self.module.to(self.device)``: every parameter allocated on the device, in module order;
- ``runtime/zero/parameter_offload.py`` then wraps it in ``Init(module=...)``, whose
  ``_convert_to_zero_parameters`` (``runtime/zero/partition_parameters.py`` lines 1129-1135)
  takes each parameter in module order: ``_zero_init_param`` broadcasts it in place from rank 0
  and ``_partition_param`` allocates its partition (``torch.empty(partition_size)``, the
  parameter's numel rounded up to a multiple of the ranks, divided by them; on the device unless
  parameters are offloaded), copies its slice in, and frees the full tensor (``free_param``);
- ``runtime/zero/stage3.py`` ``_create_fp16_partitions_with_defragmentation`` calls
  ``runtime/zero/utils.py`` ``defragment``: the partitions are copied to the host, freed, and
  ``empty_cache()`` releases every cached segment before one flat buffer is allocated. The
  init's reserved peak is over by then, but ``max_memory_reserved`` keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .replay import ALLOC, FREE, Event, replay_events

__all__ = ["Zero3ModuleInit", "replay_zero3_module_init", "replay_zero3_quantized_init"]


@dataclass(frozen=True, slots=True)
class Zero3ModuleInit:
    peak_reserved_bytes: int
    """``max_memory_reserved`` over the init."""
    peak_allocated_bytes: int
    """``max_memory_allocated`` over the init: the whole model and the first partition."""
    model_bytes: int
    """The whole model's parameters as moved to the device."""


def _events(tensors: tuple[tuple[int, int], ...], ranks: int, on_device: bool) -> list[Event]:
    events: list[Event] = []
    for i, (numel, size) in enumerate(tensors):  # module.to(device)
        events.append((ALLOC, i + 1, numel * size, 0))
    handle = len(tensors)
    for i, (numel, size) in enumerate(tensors):  # _convert_to_zero_parameters
        if on_device:
            handle += 1
            events.append((ALLOC, handle, -(-numel // ranks) * size, 0))
        events.append((FREE, i + 1, 0, 0))
    return events


@lru_cache(maxsize=64)
def replay_zero3_module_init(
    tensors: tuple[tuple[int, int], ...], ranks: int, partitions_on_device: bool = True
) -> Zero3ModuleInit:
    """The init of a model whose parameters are ``tensors`` ``(numel, bytes per element)`` in
    module order, partitioned over ``ranks`` (``partitions_on_device`` False: parameters
    offloaded, the partitions in host memory)."""
    r = replay_events(_events(tensors, ranks, partitions_on_device))
    allocated, reserved = r.phases.get(0, (0, 0))
    return Zero3ModuleInit(
        peak_reserved_bytes=reserved,
        peak_allocated_bytes=allocated,
        model_bytes=sum(n * b for n, b in tensors),
    )


def _quantized_events(
    tensors: tuple[tuple[int, int, int, int], ...], ranks: int, on_device: bool, via_host: bool
) -> list[Event]:
    events: list[Event] = []
    handle = 0
    params: list[tuple[int, int, int]] = []  # (handle, bytes, bytes per element) in order
    away: list[int] = []  # indices into params of packed data sent to the host
    for source, stored, metadata, size in tensors:  # loaded, quantized on the device
        if source:
            handle += 1
            src = handle
            events.append((ALLOC, src, source, 0))
        if stored:
            handle += 1
            params.append((handle, stored, size))
            events.append((ALLOC, handle, stored, 0))
        if metadata:
            handle += 1
            events.append((ALLOC, handle, metadata, 0))
        if source:
            events.append((FREE, src, 0, 0))
            if via_host:  # the packed data to the host, its quant_state left on the device
                events.append((FREE, params[-1][0], 0, 0))
                away.append(len(params) - 1)
    for i in away:  # deepspeed.initialize: module.to(device) brings it back, in module order
        handle += 1
        _, stored, size = params[i]
        events.append((ALLOC, handle, stored, 0))
        params[i] = (handle, stored, size)
    for param, stored, size in params:  # _convert_to_zero_parameters
        if on_device:
            handle += 1
            events.append((ALLOC, handle, -(-(stored // size) // ranks) * size, 0))
        events.append((FREE, param, 0, 0))
    return events


@lru_cache(maxsize=64)
def replay_zero3_quantized_init(
    tensors: tuple[tuple[int, int, int, int], ...],
    ranks: int,
    partitions_on_device: bool = True,
    via_host: bool = False,
) -> Zero3ModuleInit:
    """The init of a quantized model under ZeRO-3, which transformers never builds under
    ``zero.Init``: each rank holds the whole model on its own device, then ZeRO-3 partitions
    the parameters one at a time in module order. ``tensors`` are ``(source bytes, parameter
    bytes, kept bytes, bytes per stored element)`` in module order: a weight quantized on the
    device is first its 16-bit ``source`` there, then its packed parameter and what stays
    beside it (bitsandbytes' quant_state: not a parameter, never partitioned); GPTQ's and
    AWQ's packed weights are buffers, all kept; an unquantized parameter has neither source nor
    kept bytes. ``via_host``: transformers 4.39 - 4.x sends each weight's packed data to the
    host once quantized (its quant_state stays), and ``deepspeed.initialize`` moves it back
    whole before partitioning; 5.x leaves it on the device. ``model_bytes``: the parameter and
    kept bytes."""
    r = replay_events(_quantized_events(tensors, ranks, partitions_on_device, via_host))
    allocated, reserved = r.phases.get(0, (0, 0))
    return Zero3ModuleInit(
        peak_reserved_bytes=reserved,
        peak_allocated_bytes=allocated,
        model_bytes=sum(stored + metadata for _, stored, metadata, _ in tensors),
    )
