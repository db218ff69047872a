"""Generic workloads: the caller's own assets, per-item memory, caches and workspaces."""

from __future__ import annotations

from ..components import Component, Members
from ..formulas import allocator_overhead
from ..overheads import Overheads
from ..spec import GenericWorkload
from .stage import StageNumbers, finish

__all__ = ["generic_stage"]

C = Members  # the members as plain attributes (Component's read through a descriptor)
ORDER: tuple[Component, ...] = tuple(Component)


def generic_stage(w: GenericWorkload, ov: Overheads) -> StageNumbers:
    k = w.instances
    assets = sum(i.bytes for i in w.assets)
    per_item = sum(i.bytes for i in w.per_item) * w.batch_size
    caches = sum(c.bytes_per_unit * c.units for c in w.caches)
    workspaces = sum(i.bytes for i in w.workspaces)
    context = ov.process_context_bytes("inference") * k if w.uses_cuda_context else 0
    values = {c: 0 for c in ORDER}
    values[C.WEIGHTS] = assets * k
    values[C.ACTIVATIONS] = per_item * k
    values[C.KV_CACHE] = caches * k
    values[C.RUNTIME_WORKSPACE] = workspaces * k
    values[C.CUDA_CONTEXT] = context
    values[C.ALLOCATOR_OVERHEAD] = allocator_overhead.overhead(
        0, per_item * k, ov.generic_fragmentation_ppm
    )
    values.pop(C.HEADROOM)
    parts = {
        C.WEIGHTS: tuple((i.name, i.bytes) for i in w.assets),
        C.ACTIVATIONS: tuple((i.name, i.bytes * w.batch_size) for i in w.per_item),
        C.KV_CACHE: tuple((c.name, c.bytes_per_unit * c.units) for c in w.caches),
        C.RUNTIME_WORKSPACE: tuple((i.name, i.bytes) for i in w.workspaces),
        C.CUDA_CONTEXT: ov.context_parts("inference", k) if w.uses_cuda_context else (),
    }
    return finish(None, 1, [("steady", values)], parts, per_item * k)
