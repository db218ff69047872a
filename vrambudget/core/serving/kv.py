"""vLLM's paged KV cache: per-layer specs, grouping, blocks, tokens and concurrency.

Follows vLLM v1 (the version in ``data/vllm_calibration.json``):

- ``vllm/v1/kv_cache_interface.py``: ``page_size_bytes`` of ``FullAttentionSpec`` (K and V),
  ``MLAAttentionSpec`` (one latent vector), ``max_memory_usage_bytes`` of full and
  ``SlidingWindowSpec`` layers;
- ``vllm/v1/core/kv_cache_utils.py``: ``get_kv_cache_groups`` (uniform, or hybrid groups of
  equal size), ``unify_hybrid_kv_cache_specs`` (hybrid manager off), ``get_num_blocks``,
  ``_report_kv_cache_config`` (tokens), ``get_max_concurrency_for_kv_cache_config`` and
  ``_max_memory_usage_bytes_from_groups`` (the start check), ``get_kv_cache_configs`` (the
  smallest block count over pipeline stages).

Everything is integer bytes; concurrency is the engine's float.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..arch import Arch
from ..layout import kv_heads_per_device, stages
from ..units import ceil_div

__all__ = [
    "KVGroups",
    "LayerSpec",
    "blocks_per_request",
    "kv_groups",
    "layer_specs",
    "max_concurrency",
    "needed_bytes",
    "num_blocks",
    "num_tokens",
    "page_size_bytes",
    "per_token_bytes",
]


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One attention layer's KV-cache spec on one GPU (vLLM ``AttentionSpec``)."""

    heads: int
    """KV heads on this GPU (1 for MLA: one latent vector per token)."""
    head_size: int
    """Elements per head per token: head_dim (K and V each: the page counts both), or MLA's
    kv_lora_rank + qk_rope_head_dim (one latent)."""
    dtype_bytes: int
    window: int | None
    """Sliding window in tokens (``SlidingWindowSpec``), None for full attention."""
    mla: bool = False


def page_size_bytes(spec: LayerSpec, block_size: int) -> int:
    """Bytes of one block of one layer.

    Full attention: ``2 x block x kv_heads' x head_dim x bytes`` (K and V;
    ``AttentionSpec.real_page_size_bytes``); MLA: ``block x (kv_lora_rank + qk_rope_head_dim)
    x bytes`` (``MLAAttentionSpec``: a single latent, ``num_kv_heads = 1``). Worked: Llama 3.1
    8B bf16, block 16: 2 x 16 x 8 x 128 x 2 = 65,536 B; DeepSeek-V2-Lite: 16 x 576 x 2 =
    18,432 B.
    """
    factor = 1 if spec.mla else 2
    return factor * block_size * spec.heads * spec.head_size * spec.dtype_bytes


def layer_specs(arch: Arch, tensor: int, dtype_bytes: int) -> list[LayerSpec]:
    """The spec of every decoder layer in model order, on one tensor-parallel rank. KV heads are
    divided by ``t`` and replicated (one per rank) when ``t`` exceeds them
    (``max(1, num_kv_heads // t)``, vLLM ``ModelConfig.get_num_kv_heads``); MLA's latent is not
    split by ``t``."""
    if arch.mla is not None:
        size, heads, mla = arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim, 1, True
    else:
        size, heads, mla = arch.head_dim, kv_heads_per_device(arch, tensor), False
    out: list[LayerSpec] = []
    for layer, n in arch.layer_runs:
        out.extend([LayerSpec(heads, size, dtype_bytes, layer.window, mla)] * n)
    return out


def per_token_bytes(specs: list[LayerSpec]) -> int:
    """K+V bytes of one token over the given layers (all cached, window not applied): the page
    size of a one-token block. Llama 3.1 8B bf16: 32 x 2 x 8 x 128 x 2 = 131,072 B."""
    return sum(page_size_bytes(s, 1) for s in specs)


@dataclass(frozen=True, slots=True)
class KVGroups:
    """The KV-cache groups of the whole model and each pipeline stage's share of them.

    ``groups[g]`` is (spec, layer indices) of group g; every group has the same page size; the
    stage's pool has ``group_size`` tensors of ``num_blocks x page`` bytes (each shared by one
    layer of every group)."""

    groups: tuple[tuple[LayerSpec, tuple[int, ...]], ...]
    stage_layers: tuple[tuple[int, int], ...]
    """[start, stop) layer indices per pipeline stage."""
    block_size: int

    @property
    def page_bytes(self) -> int:
        return page_size_bytes(self.groups[0][0], self.block_size)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def stage_group_size(self, stage: int) -> int:
        """Layers per group on this stage: ``max(len(group.layer_names))`` of its projected
        groups (``get_kv_cache_config_from_groups``)."""
        lo, hi = self.stage_layers[stage]
        return max(sum(1 for i in layers if lo <= i < hi) for _, layers in self.groups)


def _unify_hybrid(specs: list[LayerSpec]) -> list[LayerSpec]:
    """``unify_hybrid_kv_cache_specs``: with the hybrid manager off, a model with both full and
    sliding-window layers caches the sliding ones as full attention (all tokens)."""
    if any(s.window is None for s in specs) and any(s.window is not None for s in specs):
        return [LayerSpec(s.heads, s.head_size, s.dtype_bytes, None, s.mla) for s in specs]
    return specs


@lru_cache(maxsize=1024)
def kv_groups(
    arch: Arch,
    tensor: int,
    pipeline: int,
    dtype_bytes: int,
    block_size: int,
    hybrid: bool,
    draft: tuple[LayerSpec, ...] = (),
) -> KVGroups:
    """Group the layers as ``get_kv_cache_groups`` does.

    One spec for all layers: one group. Several (full + sliding windows): layers of each spec,
    split into groups of ``group_size`` = the fewest layers of any spec (or the most, when that
    is under 1.5 x the fewest), layer ``i`` of a spec's list going to its group ``i mod
    num_groups`` (``_get_kv_cache_groups_uniform_page_size``). Gemma 3 27B (52 sliding + 10
    full layers): group_size 10, 6 sliding groups + 1 full = 7 groups. ``draft``: a speculative
    drafter's attention layers, after the target's, on the last stage (vLLM builds the drafter
    on the last pipeline rank).
    """
    specs = layer_specs(arch, tensor, dtype_bytes) + list(draft)
    if not hybrid:
        specs = _unify_hybrid(specs)
    by_spec: dict[LayerSpec, list[int]] = {}
    for i, s in enumerate(specs):
        by_spec.setdefault(s, []).append(i)
    spans: list[tuple[int, int]] = []
    for st in stages(arch, pipeline):
        start = spans[-1][1] if spans else 0
        spans.append((start, start + st.num_layers))
    spans[-1] = (spans[-1][0], spans[-1][1] + len(draft))
    if len(by_spec) == 1:
        ((spec, layers),) = by_spec.items()
        return KVGroups(((spec, tuple(layers)),), tuple(spans), block_size)
    counts = [len(v) for v in by_spec.values()]
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    groups: list[tuple[LayerSpec, tuple[int, ...]]] = []
    for spec, layers in by_spec.items():
        n = ceil_div(len(layers), group_size)
        groups.extend((spec, tuple(layers[i::n])) for i in range(n))
    return KVGroups(tuple(groups), tuple(spans), block_size)


def num_blocks(available_bytes: int, page_bytes: int, group_size: int) -> int:
    """``get_num_blocks``: ``available // page_size // num_layers``, at least 0. Worked: Llama
    3.1 8B on an H100 with 62,394,539,130 B available: 62,394,539,130 // 65,536 // 32 = 29,751
    blocks."""
    if group_size == 0:
        return 0
    return max(available_bytes // page_bytes // group_size, 0)


def num_tokens(blocks: int, groups: KVGroups) -> int:
    """The "GPU KV cache size: N tokens" the engine logs: ``num_blocks // num_groups x
    block_size`` (``_report_kv_cache_config``). 29,751 blocks of 16: 476,016 tokens."""
    return blocks // groups.num_groups * groups.block_size


def _spec_blocks(spec: LayerSpec, block: int, max_model_len: int, batched_tokens: int) -> int:
    """Blocks one request of ``max_model_len`` tokens needs in one layer
    (``max_memory_usage_bytes / page_size``): full attention ``cdiv(len, block)``; a sliding
    window keeps ``min(window - 1 + max_num_batched_tokens, len)`` tokens, one block more since
    the window need not start on a block boundary."""
    if spec.window is None:
        return ceil_div(max_model_len, block)
    tokens = min(spec.window - 1 + batched_tokens, max_model_len)
    return ceil_div(tokens, block) + 1


def blocks_per_request(groups: KVGroups, max_model_len: int, batched_tokens: int) -> int:
    """Blocks of the shared pool one request of ``max_model_len`` needs, over all groups
    (``get_max_concurrency_for_kv_cache_config``: ``cdiv(group_size x sum_g max_memory_g,
    page x group_size)``). Llama 3.1 8B at 8,192 tokens: 512."""
    return sum(
        _spec_blocks(spec, groups.block_size, max_model_len, batched_tokens)
        for spec, _ in groups.groups
    )


def max_concurrency(
    blocks: int, groups: KVGroups, max_model_len: int, batched_tokens: int
) -> float:
    """ "Maximum concurrency for L tokens per request": ``num_blocks / blocks_per_request``.
    29,751 / 512 = 58.11x."""
    return blocks / blocks_per_request(groups, max_model_len, batched_tokens)


def needed_bytes(groups: KVGroups, stage: int, max_model_len: int, batched_tokens: int) -> int:
    """KV bytes one request of ``max_model_len`` needs on one stage's GPU
    (``_max_memory_usage_bytes_from_groups``: group_size x page x blocks over the groups
    present on the stage); the engine refuses to start when this exceeds the available memory
    (``check_enough_kv_cache_memory``)."""
    lo, hi = groups.stage_layers[stage]
    present = [spec for spec, layers in groups.groups if any(lo <= i < hi for i in layers)]
    blocks = sum(_spec_blocks(s, groups.block_size, max_model_len, batched_tokens) for s in present)
    return groups.stage_group_size(stage) * groups.page_bytes * blocks
