"""Per-device widths of a layer under tensor and expert parallelism, and the byte sizes the
activation formulas share."""

from __future__ import annotations

from dataclasses import dataclass

from ...arch import Arch
from ...layout import kv_heads_per_device
from ...units import ceil_div

__all__ = ["FP32", "MASK", "DeviceDims", "device_dims"]

FP32 = 4
MASK = 1  # dropout masks are kept as bytes (torch bool / uint8)


@dataclass(frozen=True, slots=True)
class DeviceDims:
    """Per-device widths under tensor parallelism t and expert parallelism ep."""

    h: int
    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    f: int
    vocab: int
    vocab_full: int
    experts: int
    top_k: int
    f_expert: int
    f_shared: int
    ep: int
    t: int


def device_dims(arch: Arch, t: int, ep: int) -> DeviceDims:
    moe = arch.moe
    v_head = arch.mla.v_head_dim if arch.mla else arch.head_dim
    return DeviceDims(
        h=arch.hidden_size,
        heads=arch.num_heads // t,
        kv_heads=arch.num_heads // t if arch.mla else kv_heads_per_device(arch, t),
        qk_head_dim=arch.head_dim,
        v_head_dim=v_head,
        f=ceil_div(arch.intermediate_size, t),
        vocab=ceil_div(arch.vocab_size, t),
        vocab_full=arch.vocab_size,
        experts=(moe.num_experts // ep) if moe else 0,
        top_k=moe.experts_per_token if moe else 0,
        f_expert=(
            moe.expert_intermediate_size if ep > 1 else ceil_div(moe.expert_intermediate_size, t)
        )
        if moe
        else 0,
        f_shared=ceil_div(moe.shared_intermediate_size, t) if moe else 0,
        ep=ep,
        t=t,
    )
