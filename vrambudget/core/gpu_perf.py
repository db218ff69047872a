"""Peak rates of catalog GPUs for the latency estimate (:mod:`vrambudget.core.roofline`): memory
bandwidth and dense peak FLOP/s per math format, each with its source (``data/gpu_perf.json``).

Kept apart from ``gpus.json`` (keyed by the same GPU ids) so that memory facts and rate facts
are edited and cited independently. A GPU without an entry has no latency estimate: its rates
are unknown here, and the answer says so rather than guessing.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

import msgspec

from .catalog import Source
from .data import data_file

__all__ = ["DenseFlops", "GPUPerf", "MathFormat", "gpu_perf", "perf_of"]

MathFormat = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4"]
"""The math format of the GEMMs: ``fp32`` on CUDA cores, the others on tensor cores."""


class DenseFlops(msgspec.Struct, frozen=True, kw_only=True):
    """Dense (no 2:4 sparsity) peak rates, FLOP/s (int8: op/s); None: no such path, or
    unknown (the entry's notes say which)."""

    fp32: int | None
    tf32: int | None
    fp16: int | None
    bf16: int | None
    fp8: int | None
    int8: int | None
    fp4: int | None


class GPUPerf(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    memory_bandwidth_bytes_per_s: int
    memory_bandwidth_source: Source
    dense_flops: DenseFlops
    flops_source: Source
    notes: str | None = None

    def peak_flops(self, fmt: MathFormat) -> int | None:
        rate: int | None = getattr(self.dense_flops, fmt)
        return rate


class _PerfFile(msgspec.Struct):
    schema: Literal["vrambudget.gpu_perf/1"]
    basis: str
    gpus: tuple[GPUPerf, ...]


@cache
def gpu_perf() -> dict[str, GPUPerf]:
    return {g.id: g for g in data_file("gpu_perf.json", _PerfFile).gpus}


def perf_of(gpu_id: str | None) -> GPUPerf | None:
    """The rates of a catalog GPU; None for a custom device or a GPU without an entry."""
    return gpu_perf().get(gpu_id) if gpu_id is not None else None
