"""KV cache: the attention keys and values of every live sequence.

Shown in answers::

    sequences x bytes(kv) x [sum_full_layers 2*kv_heads*head_dim x context +
    sum_sliding_layers 2*kv_heads*head_dim x min(context, window)]; MLA: (kv_lora_rank +
    qk_rope_head_dim) per layer

The serving engines' paged pools (blocks, groups) are :mod:`vrambudget.core.serving.kv`.
"""

from __future__ import annotations

from ..arch import Arch
from ..dtypes import bytes_of
from ..layout import kv_heads_per_device
from ..spec import InferenceWorkload

__all__ = [
    "FORMULA",
    "SOURCE",
    "cache_bytes",
    "elem_bytes",
    "elems_per_token",
    "model_bytes_per_token",
    "state_bytes",
]

FORMULA = (
    "sequences x bytes(kv) x [sum_full_layers 2*kv_heads*head_dim x context + "
    "sum_sliding_layers 2*kv_heads*head_dim x min(context, window)]; MLA: "
    "(kv_lora_rank + qk_rope_head_dim) per layer; + sequences x recurrent state "
    "(Mamba / linear attention: conv + SSM state per layer, whatever the context)"
)
SOURCE = "Pope et al. 2022 §2; DeepSeek-V2 §2.1.2 (MLA); vLLM kv_cache_interface.py"


def elems_per_token(arch: Arch, t: int) -> int:
    """K + V elements one layer caches per token on one of ``t`` tensor-parallel ranks:
    ``2 x kv_heads_per_device x head_dim``. MLA caches the compressed latent and the decoupled
    RoPE key, shared by all heads and replicated on every rank: ``kv_lora_rank +
    qk_rope_head_dim`` (DeepSeek-V2 §2.1.2; vLLM's MLA backend).

    Worked number: Llama 3.1 8B (8 KV heads, head_dim 128) on one device: 2 x 8 x 128 = 2,048
    elements; DeepSeek-V2-Lite (MLA, 512 + 64): 576."""
    if arch.mla is not None:
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
    return 2 * kv_heads_per_device(arch, t) * arch.head_dim


def elem_bytes(w: InferenceWorkload) -> int:
    """Bytes of one cached element: the KV-cache dtype, or the compute dtype when ``auto``."""
    kv = w.precision.kv_cache
    return bytes_of(w.precision.compute if kv == "auto" else kv)


def cache_bytes(
    full_elems: int, sliding: tuple[tuple[int, int], ...], sequences: int, context: int, elem: int
) -> int:
    """``sequences x bytes(kv) x [full_elems x context + sum (elems x min(context, window))]``
    over a stage's full-attention layers (``full_elems`` per token, summed over layers) and its
    sliding-window layers (``(window, elems per token)``).

    Worked number: Llama 3.1 8B (32 layers x 2,048 elements), 8 sequences of 4,608 tokens in
    bf16: 8 x 2 x 65,536 x 4,608 = 4,831,838,208 B (4.5 GiB)."""
    per_sequence = full_elems * context
    for window, elems in sliding:
        per_sequence += elems * min(context, window)
    return per_sequence * sequences * elem


def state_bytes(elems: int, fixed_bytes: int, sequences: int, compute_bytes: int) -> int:
    """``sequences x (elems x bytes(compute) + fixed_bytes)``: the state a recurrent layer keeps
    per sequence, as the framework's cache holds it (transformers ``LinearAttentionLayer``:
    ``conv_states`` in the model dtype, ``recurrent_states`` in fp32).

    Worked number: Mamba-130m (24 layers, conv 1,536 x 4 in bf16, SSM 1,536 x 16 in fp32)
    for 8 sequences: 8 x (24 x 6,144 x 2 + 24 x 24,576 x 4) = 21,233,664 B."""
    return sequences * (elems * compute_bytes + fixed_bytes)


def model_bytes_per_token(arch: Arch, elem: int) -> int:
    """K + V bytes per token over all layers of the model on one device (full-attention width;
    sliding layers cap at their window); 0 for encoders, which cache nothing.

    Worked number: Llama 3.1 8B in bf16: 32 x 2,048 x 2 = 131,072 B per token."""
    if arch.kind != "decoder":
        return 0
    return elems_per_token(arch, 1) * arch.num_layers * elem
