"""Tensor-group builders the families' inventories are made of: linear layers (weight and
bias), norms, gated MLPs, and the run-length encoding of a layer list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..arch import LayerType, Role, Split, TensorGroup

__all__ = ["T", "compress_runs", "gated_mlp", "linear", "norm"]

T = TensorGroup


def linear(
    name: str,
    out_features: int,
    in_features: int,
    split: Split,
    *,
    role: Role = Role.LINEAR,
    bias: bool = False,
    count: int = 1,
) -> list[TensorGroup]:
    """A linear layer's weight (and bias). A row-parallel bias is replicated (added after the
    all-reduce); a column-parallel bias is split with the output features."""
    groups = [T(name, out_features, in_features, role, split, count)]
    if bias:
        bias_split = Split.REPLICATED if split is Split.ROW else split
        groups.append(T(f"{name}.bias", out_features, 1, Role.BIAS, bias_split, count))
    return groups


def norm(name: str, width: int, *, layernorm: bool) -> list[TensorGroup]:
    groups = [T(name, width, 1, Role.NORM, Split.REPLICATED)]
    if layernorm:
        groups.append(T(f"{name}.bias", width, 1, Role.NORM, Split.REPLICATED))
    return groups


def compress_runs(layers: Sequence[LayerType]) -> tuple[tuple[LayerType, int], ...]:
    """Run-length encode a layer list, keeping order (so pipeline stages can be cut from it)."""
    runs: list[list[Any]] = []
    for layer in layers:
        if runs and runs[-1][0] == layer:
            runs[-1][1] += 1
        else:
            runs.append([layer, 1])
    return tuple((layer, n) for layer, n in runs)


def gated_mlp(
    prefix: str, h: int, f: int, *, bias: bool = False, role: Role = Role.LINEAR, count: int = 1
) -> list[TensorGroup]:
    return [
        *linear(f"{prefix}gate_proj", f, h, Split.COLUMN, bias=bias, role=role, count=count),
        *linear(f"{prefix}up_proj", f, h, Split.COLUMN, bias=bias, role=role, count=count),
        *linear(f"{prefix}down_proj", h, f, Split.ROW, bias=bias, role=role, count=count),
    ]
