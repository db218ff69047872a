"""The rotary tables vLLM precomputes: how many, how many rows, how wide (one place for these
facts; ``vllm.py`` budgets them, ``load.py`` replays their construction).

vLLM's ``RotaryEmbedding`` keeps a ``cos_sin_cache`` buffer of ``rows x rotary_dim`` in the
model dtype, one per distinct rope (``get_rope`` is cached), counted in "Model loading took".
"""

from __future__ import annotations

import math

from ..arch import Arch
from ..errors import InvalidWorkload

__all__ = ["rope_table_positions", "ropes", "rotary_cache_bytes", "rotary_dim"]


def rotary_dim(arch: Arch) -> int:
    """Columns of a table: the head dim (MLA: the decoupled rope part of the key)."""
    return arch.mla.qk_rope_head_dim if arch.mla else arch.head_dim


def rope_table_positions(arch: Arch) -> int:
    """Rows of the ``cos_sin_cache`` that vLLM's ``get_rope`` builds for the model's own rope
    (vllm/model_executor/layers/rotary_embedding): ``linear`` and ``dynamic`` scaling tabulate
    ``max_position x factor`` rows, ``yarn`` (and DeepSeek's ``deepseek_yarn``) ``original x
    factor``, ``longrope`` its short and long tables (``original + max_position``); ``default``
    and ``llama3`` ``max_position``. Gemma 3 27B (linear, factor 8): 131,072 x 8 = 1,048,576."""
    p, r = arch.max_positions, arch.rope_scaling
    if r is None:
        return p
    if r.kind in ("longrope", "su"):  # Phi-3: factor lists, no factor; original at top level
        return (r.original_max_positions or p) + p
    if r.factor is None or r.factor <= 0:  # no usable factor: vLLM would refuse; not scaled
        return p
    if r.kind in ("linear", "dynamic"):
        return _rows(p * r.factor)
    if r.kind == "yarn":  # transformers: original defaults to max_position_embeddings
        return _rows((r.original_max_positions or p) * r.factor)
    return p


def _rows(scaled: float) -> int:
    """A table's rows; a factor so large that the product is no finite number (1e308 x the
    positions) is the caller's error, never an ``OverflowError``."""
    if not math.isfinite(scaled):
        raise InvalidWorkload(
            "model.config.rope_scaling.factor",
            "the rope scaling factor times the positions is not a finite number of table rows",
        )
    return math.ceil(scaled)


def ropes(arch: Arch) -> list[tuple[int, str]]:
    """(rows, kind) of each distinct rope, in the order the layers first use them: Gemma 3's
    local (sliding) layers have a default rope of their own, then its global layers' scaled
    one; every other model has one."""
    r = arch.rope_scaling
    scaled = (rope_table_positions(arch), r.kind if r else "default")
    if arch.model_type in ("gemma3", "gemma3_text"):
        return [(arch.max_positions, "default"), scaled]
    return [scaled]


def rotary_cache_bytes(arch: Arch, e: int) -> int:
    """All of a model's rotary tables (one stage holding every layer; a pipeline stage builds
    only the ropes its layers use, ``load.py``). Llama 3.1 8B: 131,072 x 128 x 2 = 33,554,432
    B; Gemma 3 4B: (131,072 + 1,048,576) x 256 x 2 = 603,979,776 B."""
    return sum(rows for rows, _ in ropes(arch)) * rotary_dim(arch) * e
