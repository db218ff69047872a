"""What torch's own readings of a device budget leave out."""

from __future__ import annotations

from ..components import Component
from ..formulas import communication_buffers
from ..result import DeviceBudget

__all__ = ["outside_allocator_bytes"]


def outside_allocator_bytes(device: DeviceBudget) -> int:
    """Device memory torch's caching allocator never sees: the CUDA context and NCCL's
    communicators (``cudaMalloc``'d by NCCL). DDP buckets and ZeRO/FSDP reduce and gather
    buffers are torch tensors, so ``max_memory_allocated`` / ``max_memory_reserved`` keep them."""
    out = 0
    for line in device.lines:
        if line.component is Component.CUDA_CONTEXT:
            out += line.bytes
        elif line.component is Component.COMMUNICATION_BUFFERS:
            out += sum(p.bytes for p in line.parts if communication_buffers.is_nccl(p.name))
    return out
