"""The tensors a serving engine allocates for one rank's weights, in the order it builds its
modules, as the engine fuses them: one ``qkv_proj`` for a layer's q, k and v projections (and
one bias), one ``gate_up_proj`` for a gated MLP's gate and up projections, each routed
expert projection stacked over the rank's experts (``FusedMoE``'s ``w13_weight`` /
``w2_weight``); every other tensor of the model's inventory as it is. SGLang builds them under
``torch.device(device)`` in that order and copies the checkpoint into them in place
(``model_loader/loader.py`` ``DefaultModelLoader.load_model``; ``layers/linear.py``
``QKVParallelLinear``, ``MergedColumnParallelLinear``; ``layers/moe/fused_moe_triton/layer.py``
``FusedMoE``: ``w13_weight`` holds every local expert's gate and up projections, ``w2_weight``
their down projections).

A quantized tensor is its packed payload and its quantization metadata, two allocations. The
engine's rotary tables are not here (the caller adds them).
"""

from __future__ import annotations

from functools import lru_cache

from ..arch import Arch, Role, TensorGroup
from ..deployed import deployed_quantization
from ..dtypes import bytes_of
from ..formulas.weights import stored_bytes
from ..layout import per_device_shape
from ..quantization import quantized_roles
from ..spec import FP8, Precision
from ..statics import fixed_bytes, quantizable

__all__ = ["FUSED", "loaded_tensors"]

FUSED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}
"""Projections the engine allocates as one tensor, by the name it gives them."""


@lru_cache(maxsize=4096)
def loaded_tensors(arch: Arch, precision: Precision, tp: int) -> tuple[int, ...]:
    """Bytes of each tensor one rank of ``tp`` allocates for the weights, in allocation order:
    the embeddings, each layer, the head."""
    quant = precision.quantization
    plain_dtype = precision.weights
    if plain_dtype == "fp8":
        quant, plain_dtype = FP8(), precision.compute
    quant = deployed_quantization(quant)
    roles = quantized_roles(quant) if quant is not None else frozenset()
    plain = bytes_of(plain_dtype)

    def module(groups: tuple[TensorGroup, ...]) -> list[int]:
        """One module's tensors, fused where the engine fuses them (first place kept)."""
        fused: dict[str, list[int]] = {}
        for g in groups:
            rows, cols, count = per_device_shape(g, arch, tp, 1)
            quantized = quant is not None and g.role in roles and quantizable(g)
            payload, md = stored_bytes(
                rows, cols, fixed_bytes(g, plain_dtype) or plain, quant if quantized else None
            )
            prefix, _, leaf = g.name.removesuffix(".bias").rpartition(".")
            bias = g.name.endswith(".bias")
            name = FUSED.get(leaf) if g.role in (Role.LINEAR, Role.BIAS, Role.EXPERT) else None
            if g.role is Role.EXPERT or name is not None:
                key = f"{prefix}.{name or leaf}{'.bias' if bias else ''}"
                # one stacked tensor per projection: the rank's experts (count) in one
                sizes = fused.setdefault(key, [0, 0])
                sizes[0] += payload * count
                sizes[1] += md * count
            else:
                for i in range(count):
                    fused[f"{g.name}#{i}"] = [payload, md]
        return [b for payload, md in fused.values() for b in (payload, md) if b]

    out = module(arch.embeddings)
    for layer, n in arch.layer_runs:
        one = module(layer.tensors)
        out += one * n
    out += module(arch.head)
    return tuple(out)
