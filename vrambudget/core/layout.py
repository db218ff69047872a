"""Parallel layout: which layers each pipeline stage holds and each tensor's per-device shape.

Tensor parallelism follows Megatron-LM / vLLM: attention heads and MLP columns are divided by
t; key/value heads are divided when ``kv % t == 0`` and replicated one per device when
``t % kv == 0`` (vLLM ``QKVParallelLinear``); the vocabulary is divided (``VocabParallel``);
MLA's low-rank projections and all norms are replicated. Expert parallelism shards routed
experts (and then does not split each expert by t, as vLLM's EP). Pipeline stages get
``L // p`` layers each and the remainder goes to the stages just before the last one (vLLM
``get_pp_indices``), since the last stage also holds the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arch import Arch, LayerType, Role, Split, TensorGroup
from .errors import InvalidWorkload
from .spec import Parallelism
from .units import ceil_div

__all__ = [
    "GPUS_PER_NODE",
    "Stage",
    "check_layout",
    "device_count_candidates",
    "kv_heads_per_device",
    "node_splits",
    "per_device_shape",
    "stages",
]

GPUS_PER_NODE = 8
"""GPUs of one server: tensor parallelism stays within it, pipeline parallelism crosses servers,
and a host runs up to this many workload processes (one per GPU)."""


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    layer_runs: tuple[tuple[LayerType, int], ...]
    first: bool
    last: bool

    @property
    def num_layers(self) -> int:
        return sum(n for _, n in self.layer_runs)


def check_layout(arch: Arch, par: Parallelism, field: str = "parallelism") -> None:
    t = par.tensor
    if arch.num_heads % t:
        raise InvalidWorkload(
            f"{field}.tensor",
            f"{t} must divide the model's {arch.num_heads} attention heads "
            f"(allowed: divisors of {arch.num_heads})",
        )
    kv = arch.num_kv_heads
    if kv % t and t % kv:
        raise InvalidWorkload(
            f"{field}.tensor",
            f"{t} must divide the {kv} key/value heads or be a multiple of them",
        )
    if par.pipeline * par.virtual_stages > arch.num_layers:
        raise InvalidWorkload(
            f"{field}.pipeline",
            f"{par.pipeline} stages x {par.virtual_stages} chunks exceed the model's "
            f"{arch.num_layers} layers",
        )
    if par.expert > 1:
        if arch.moe is None:
            raise InvalidWorkload(f"{field}.expert", "the model has no experts; use 1")
        if arch.moe.num_experts % par.expert:
            raise InvalidWorkload(
                f"{field}.expert",
                f"{par.expert} must divide the {arch.moe.num_experts} routed experts",
            )
        if (par.tensor * par.data) % par.expert:
            # Experts are spread over ranks that exist: the tensor x data group (vLLM EP).
            raise InvalidWorkload(
                f"{field}.expert",
                f"{par.expert} must divide tensor x data = {par.tensor * par.data} devices",
            )


def kv_heads_per_device(arch: Arch, t: int) -> int:
    kv = arch.num_kv_heads
    return kv // t if kv % t == 0 else 1


def per_device_shape(group: TensorGroup, arch: Arch, t: int, ep: int) -> tuple[int, int, int]:
    """(rows, cols, count) of the slice of ``group`` that one device of the layout holds."""
    rows, cols, count = group.rows, group.cols, group.count
    if group.role is Role.EXPERT and ep > 1:  # routed experts: whole experts, no TP split
        return rows, cols, count // ep
    match group.split:
        case Split.COLUMN:
            return ceil_div(rows, t), cols, count
        case Split.ROW:
            return rows, ceil_div(cols, t), count
        case Split.KV_COLUMN:
            return kv_heads_per_device(arch, t) * (rows // arch.num_kv_heads), cols, count
        case Split.VOCAB:
            return ceil_div(rows, t), cols, count
        case Split.REPLICATED:
            return rows, cols, count


def _stage_sizes(num_layers: int, p: int) -> list[int]:
    sizes = [num_layers // p] * p
    for i in range(2, num_layers % p + 2):
        sizes[-i] += 1
    return sizes


def _slice_runs(
    runs: tuple[tuple[LayerType, int], ...], start: int, stop: int
) -> tuple[tuple[LayerType, int], ...]:
    out: list[tuple[LayerType, int]] = []
    pos = 0
    for layer, n in runs:
        lo, hi = max(start, pos), min(stop, pos + n)
        if lo < hi:
            out.append((layer, hi - lo))
        pos += n
        if pos >= stop:
            break
    return tuple(out)


def stages(arch: Arch, p: int) -> tuple[Stage, ...]:
    if p == 1:
        return (Stage(0, arch.layer_runs, True, True),)
    result = []
    start = 0
    for i, size in enumerate(_stage_sizes(arch.num_layers, p)):
        result.append(
            Stage(i, _slice_runs(arch.layer_runs, start, start + size), i == 0, i == p - 1)
        )
        start += size
    return tuple(result)


def node_splits(n: int) -> list[tuple[int, int]]:
    """(tensor, pipeline) splits of ``n`` devices, largest tensor-parallel size first: tensor
    parallel within one node (a divisor of n up to ``GPUS_PER_NODE``), pipeline across."""
    return [(t, n // t) for t in range(min(n, GPUS_PER_NODE), 0, -1) if n % t == 0]


def device_count_candidates(limit: int) -> list[int]:
    """Device counts tried for the smallest that fits: 1 .. 8, then whole nodes of 8."""
    return [n for n in range(1, GPUS_PER_NODE + 1) if n <= limit] + list(
        range(2 * GPUS_PER_NODE, limit + 1, GPUS_PER_NODE)
    )
