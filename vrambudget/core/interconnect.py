"""The GPU-to-GPU links a layout over several GPUs assumes, from the catalog's ``interconnect``
of its GPU type, and the warning when tensor parallelism crosses PCIe.

Tensor parallelism all-reduces every layer's activations across its group on every step; the
group should sit inside one fast-link domain (an NVSwitch baseboard, an NVLink-bridged pair, an
xGMI platform). The fit layouts keep tensor parallelism within an 8-GPU node and pipeline
parallelism across (:func:`vrambudget.core.layout.node_splits`); this module says what those
groups travel over.
"""

from __future__ import annotations

from typing import Literal

from .catalog import GPU, Interconnect, gpus
from .result import LayoutInterconnect

__all__ = ["NODE_GPUS", "layout_interconnect", "pcie_bytes_per_s"]

Link = Literal["nvswitch", "nvlink", "nvlink_bridge", "xgmi", "pcie"]

NODE_GPUS = 8
"""GPUs per node the fit layouts assume (tensor parallelism stays within one)."""

_PCIE_GT_PER_S = {3: 8, 4: 16, 5: 32, 6: 64}
"""PCIe transfer rate per lane (GT/s) by generation; each generation doubles it. Gen5 x16 is
"a theoretical maximum of 128 GB/s" both directions (the catalog's H100 PCIe source)."""


def pcie_bytes_per_s(generation: int, lanes: int = 16) -> int:
    """Raw PCIe bandwidth, both directions: ``GT/s x lanes / 8 x 2`` (line coding not
    subtracted). Worked number: Gen4 x16 = 16 x 16 / 8 x 2 = 64 GB/s; Gen5 x16 = 128 GB/s."""
    return _PCIE_GT_PER_S[generation] * 1_000_000_000 * lanes // 8 * 2


def _gb(n: int) -> str:
    return f"{n / 1e9:,.0f} GB/s" if n < 1e12 else f"{n / 1e12:g} TB/s"


def _pcie(ic: Interconnect) -> tuple[int | None, str]:
    if ic.pcie_generation is None:
        return None, "PCIe"
    bw = pcie_bytes_per_s(ic.pcie_generation, ic.pcie_lanes)
    return bw, f"PCIe Gen{ic.pcie_generation} x{ic.pcie_lanes} ({_gb(bw)} per GPU)"


def layout_interconnect(
    gpu_id: str | None, device_count: int, tensor: int, pipeline: int
) -> tuple[LayoutInterconnect | None, tuple[str, ...]]:
    """(the links a layout of ``device_count`` GPUs assumes, warnings); (None, ()) on one
    device. A custom device (no catalog entry) gets an ``unknown`` statement and no warning."""
    if device_count <= 1:
        return None, ()
    g: GPU | None = gpus().get(gpu_id) if gpu_id is not None else None
    ic = g.interconnect if g is not None else None
    if ic is None:
        return (
            LayoutInterconnect(
                gpu_interconnect="unknown (not a catalog GPU)",
                tensor_parallel_over=None,
                tensor_parallel_bytes_per_s=None,
                across_nodes=device_count > NODE_GPUS,
                assumption="the links between these devices are unknown; the answer is memory only",
            ),
            (),
        )
    across = device_count > max(NODE_GPUS, ic.domain_max_gpus)
    pcie_bw, pcie_words = _pcie(ic)
    warnings: list[str] = []
    over: Link | None
    bw: int | None
    if tensor <= 1:
        over, bw = None, None
        words = f"no tensor parallelism; stages and replicas talk over {ic.summary}"
    elif ic.kind != "pcie" and tensor <= ic.domain_max_gpus:
        over, bw = ic.kind, ic.link_bytes_per_s
        words = f"tensor parallel {tensor} within one {ic.kind} domain: {ic.summary}"
    else:
        over, bw = "pcie", pcie_bw
        words = f"tensor parallel {tensor} over {pcie_words}"
        assert g is not None  # ic came from it
        warnings.append(_pcie_warning(g, ic, tensor, pipeline, pcie_words))
    if across:
        words += "; pipeline stages on different nodes talk over the cluster network (not modelled)"
    return (
        LayoutInterconnect(
            gpu_interconnect=ic.summary,
            tensor_parallel_over=over,
            tensor_parallel_bytes_per_s=bw,
            across_nodes=across,
            assumption=words,
        ),
        tuple(warnings),
    )


REFERENCE_GPU = "h100-sxm5-80gb"
"""The NVLink system the warning compares PCIe with (its catalog interconnect)."""


def _reference() -> str:
    ref = gpus()[REFERENCE_GPU]
    assert ref.interconnect is not None and ref.interconnect.link_bytes_per_s is not None
    return f"{_gb(ref.interconnect.link_bytes_per_s)} per GPU on {ref.name} (HGX)"


def _pcie_warning(g: GPU, ic: Interconnect, tensor: int, pipeline: int, pcie_words: str) -> str:
    """What crossing PCIe costs and what to choose instead, in words a user can act on."""
    if ic.kind == "pcie":
        where = f"{g.name} has no GPU-to-GPU link in this layout: {ic.summary}"
    else:
        where = (
            f"a tensor-parallel group of {tensor} spans more than one {ic.kind} domain of "
            f"{ic.domain_max_gpus} GPUs ({ic.summary})"
        )
    keep = (
        f"tensor parallel {ic.domain_max_gpus} x pipeline parallel "
        f"{tensor * pipeline // ic.domain_max_gpus}"
        if ic.kind != "pcie" and ic.domain_max_gpus > 1 and tensor % ic.domain_max_gpus == 0
        else f"pipeline parallel {tensor * pipeline} (tensor 1)"
    )
    return (
        f"tensor parallel {tensor} crosses PCIe: {where}, so every layer's all-reduce travels "
        f"over {pcie_words} instead of NVLink ({_reference()}). The memory budget does not "
        f"change, but decode and prefill spend much of each step communicating. Instead: {keep}, "
        "data-parallel replicas that each fit, fewer GPUs with more memory, or an NVLink "
        "(SXM / NVL) system."
    )
