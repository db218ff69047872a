"""Versioned vLLM engine constants, loaded once from ``data/vllm_calibration.json``.

Every constant carries its provenance: the calibrate-split runs of
``research/data/vllm_runs.json`` it was fitted on (by ``research/calibrate_vllm.py``, which
writes the file), or the source line it follows. A request names the engine version; the
allowed set is the file's versions.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

import msgspec

__all__ = [
    "DEFAULT_ENGINE_VERSION",
    "ENGINE_VERSIONS",
    "Constant",
    "EngineCalibration",
    "calibration",
]


class Constant(msgspec.Struct, frozen=True, kw_only=True):
    value: float
    unit: str
    provenance: str
    fitted_on: tuple[str, ...] = ()
    """Run ids (split ``calibrate``) the value was fitted on; empty for source-derived values."""


class Defaults(msgspec.Struct, frozen=True, kw_only=True):
    """Engine defaults of ``max_num_seqs`` / ``max_num_batched_tokens`` by entrypoint, on GPUs of
    at least ``large_gpu_min_bytes`` that are not A100s, and on the others
    (vllm/engine/arg_utils.py ``get_batch_defaults``)."""

    large_gpu_min_bytes: int
    large_gpu_excluded: tuple[str, ...]
    max_num_seqs_large: int
    max_num_seqs_small: int
    max_num_batched_tokens_large: dict[str, int]
    max_num_batched_tokens_small: dict[str, int]
    block_size: int
    source: str


class EngineCalibration(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    accounting: Literal["v1"]
    description: str
    hybrid_kv_cache_manager: bool
    """Sliding-window layers get their own KV-cache groups (vLLM >= 0.10); otherwise they are
    cached as full attention when the model also has full-attention layers."""
    cudagraph_in_budget: bool
    """CUDA-graph memory is subtracted from the KV budget
    (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)."""
    baseline_in_budget: bool
    """The CUDA context and NCCL initialisation (before the baseline snapshot) count against
    ``gpu_memory_utilization``."""
    defaults: Defaults
    constants: dict[str, Constant]

    def c(self, name: str) -> float:
        return self.constants[name].value


class _File(msgspec.Struct, frozen=True):
    schema: Literal["vrambudget.vllm_calibration/1"]
    default_version: str
    versions: tuple[EngineCalibration, ...]
    note: str = ""


@cache
def _file() -> _File:
    raw = resources.files("vrambudget.core.data").joinpath("vllm_calibration.json").read_bytes()
    return msgspec.json.decode(raw, type=_File)


def calibration(version: str) -> EngineCalibration:
    for v in _file().versions:
        if v.version == version:
            return v
    raise KeyError(version)


ENGINE_VERSIONS: tuple[str, ...] = tuple(v.version for v in _file().versions)
DEFAULT_ENGINE_VERSION: str = _file().default_version
