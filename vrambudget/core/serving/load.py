"""What vLLM's "Model loading took" counts beyond the tensors' own bytes.

vLLM 0.19.0 measures the weights memory as torch's *allocated* bytes after loading minus before
(``gpu_model_runner.load_model`` inside ``DeviceMemoryProfiler``; ``CudaPlatform.
get_current_memory_usage`` = ``empty_cache(); reset_peak_memory_stats(); max_memory_allocated()``).
Allocated bytes count caching-allocator *blocks*, not requests, so two things the tensor sizes
miss are in it:

* **Block rounding.** A parameter of 10 MiB or more gets a segment rounded up to 2 MiB; when the
  remainder is 1 MiB or less the block is not split and the whole segment counts as allocated
  (``should_split``: ``remaining > kSmallSize``); the rotary table's fp32 temporaries leave free
  blocks that later parameters split. This module replays vLLM's parameter allocations (fused
  ``qkv_proj`` / ``gate_up_proj`` / stacked experts ``w13`` / ``w2``, in construction order:
  embeddings, then per layer attention, the rope on its first use, MLP, norms; then the final
  norm and the head) through the caching-allocator model (``..allocator``). Gemma 2 2B: each
  81 MiB ``gate_up_proj`` holds an 82 MiB block: +1 MiB x 26 layers, +1 MiB for the embedding.
* **Import-time workspaces.** The MLA backend selection (``MLAAttention.__init__`` ->
  ``get_attn_backend`` -> ``CudaPlatform.get_valid_backends``) imports every candidate backend's
  module; ``v1/attention/backends/mla/flashinfer_mla.py`` allocates ``g_fi_workspace =
  torch.zeros(128 MiB)`` at import, on every GPU, and on compute capability 10.x
  ``cutlass_mla.py`` adds ``SM100Workspace(128 MiB)``. Read in the vllm 0.19.0 wheel (PyPI); an
  explicit ``--attention-backend`` imports only the chosen one (not modelled).

Unquantized and quantized weights alike are replayed as allocated at construction; quantized
methods that repack after loading (Marlin, fp8 padding) may place blocks differently.

SGLang builds its modules the same way (``QKVParallelLinear``, ``MergedColumnParallelLinear``,
``FusedMoE``'s stacked ``w13_weight`` / ``w2_weight``) but keeps the rotary table in fp32 on CUDA
(``rotary_embedding.py``: the cast to the model dtype only off CUDA) and measures its weights line
("Load weight end ... mem usage") as the device's free memory before and after loading, the
cache emptied (``model_runner.py`` ``load_model``, ``get_available_gpu_memory``): the segments
the weights' blocks sit in, ``reserved_bytes``. Qwen3-14B over 4 GPUs: each rank's q/k/v
projection is 17.5 MiB, o_proj 12.5, gate_up 85, down 42.5 -- segments of 18, 14, 86 and 44
MiB, 4.5 MiB a layer beyond the tensors, 180 MiB over 40 layers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import count

from ..allocator import CachingAllocator
from ..arch import Arch, Role, TensorGroup
from ..layout import Stage, per_device_shape, stages
from ..quantization import quantized_roles, tensor_storage
from ..spec import Quantization
from ..statics import head_groups
from .rope import ropes, rotary_dim

__all__ = ["MLA_IMPORT_WORKSPACE_BYTES", "LoadMemory", "load_memory"]

MiB = 1 << 20
MLA_IMPORT_WORKSPACE_BYTES = 128 * MiB
"""``FLASHINFER_MLA_WORKSPACE_BUFFER_SIZE`` (and ``cutlass_mla``'s ``SM100Workspace`` size)."""


@dataclass(frozen=True, slots=True)
class LoadMemory:
    tensor_bytes: int
    """The parameters' and rotary tables' own bytes."""
    allocated_bytes: int
    """What the caching allocator counts for them (blocks)."""
    rotary_bytes: int
    """The rotary tables this stage builds (only the ropes its layers use)."""
    reserved_bytes: int
    """The segments the caching allocator keeps for them once the cache is emptied."""

    @property
    def rounding_bytes(self) -> int:
        return self.allocated_bytes - self.tensor_bytes


_FUSED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "q_a_proj": "fused_qkv_a_proj",
    "kv_a_proj_with_mqa": "fused_qkv_a_proj",
}


def _fused_name(g: TensorGroup, names: set[str]) -> str:
    """vLLM's parameter for a checkpoint tensor: q/k/v into ``qkv_proj`` (not MLA's lone
    ``q_proj``), gate/up into ``gate_up_proj``, MLA's q_a/kv_a into ``fused_qkv_a_proj``."""
    stem, bias = (g.name[:-5], ".bias") if g.name.endswith(".bias") else (g.name, "")
    prefix, _, base = stem.rpartition(".")
    fused = _FUSED.get(base)
    if fused == "qkv_proj" and f"{prefix + '.' if prefix else ''}k_proj" not in names:
        fused = None
    if fused == "fused_qkv_a_proj" and not {"q_a_proj", "kv_a_proj_with_mqa"} <= names:
        fused = None
    return f"{prefix + '.' if prefix else ''}{fused or base}{bias}"


def _sizes(
    groups: tuple[TensorGroup, ...],
    arch: Arch,
    t: int,
    ep: int,
    e: int,
    quant: Quantization | None,
    layer: int | None,
) -> list[tuple[str, int]]:
    """(parameter, bytes) on one device, fused as vLLM creates them, in order. ``layer`` None:
    the groups of one layer (or single tensors); routed experts are one stacked tensor per
    projection. ``layer`` i: the i-th of groups repeated per layer (a vision tower's)."""
    roles = quantized_roles(quant) if quant is not None else frozenset()
    names = {g.name for g in groups}
    out: dict[str, int] = {}
    for g in groups:
        rows, cols, count = per_device_shape(g, arch, t, ep)
        if layer is not None and count > 1:
            count = 1  # this layer's copy
        if quant is not None and g.role in roles:
            payload, meta = tensor_storage(quant, rows, cols, 1)
        else:
            payload, meta = rows * cols * e, 0
        name = _fused_name(g, names)
        n = count if g.role is Role.EXPERT else 1  # stacked experts: one tensor
        if g.role is not Role.EXPERT and layer is None and count > 1:
            for i in range(count):  # e.g. a layer's norms: separate tensors
                out[f"{name}[{i}]"] = payload
                if meta:
                    out[f"{name}.scales[{i}]"] = meta
            continue
        out[name] = out.get(name, 0) + payload * n
        if meta:
            out[name + ".scales"] = out.get(name + ".scales", 0) + meta * n
    return list(out.items())


def _extras(
    arch: Arch, t: int, ep: int, e: int, quant: Quantization | None
) -> list[tuple[str, int]]:
    """Tensors outside the text stack (Gemma 3's vision tower): the single ones, then the
    repeated ones layer by layer (q/k/v fused per layer as ``SiglipAttention``'s qkv_proj)."""
    single = tuple(g for g in arch.extras if g.count == 1)
    repeated = tuple(g for g in arch.extras if g.count > 1)
    layers = max((g.count for g in repeated), default=0)
    out = _sizes(single, arch, t, ep, e, quant, None)
    for i in range(layers):
        out += _sizes(tuple(g for g in repeated if g.count > i), arch, t, ep, e, quant, i)
    return out


def _rope_steps(
    rows: int, rotary: int, e: int, kind: str, fp32_table: bool
) -> Iterator[tuple[str, int]]:
    """The rope table's construction on the GPU (``RotaryEmbedding._compute_cos_sin_cache`` in
    fp32, then ``.to(dtype)`` unless ``fp32_table``): ("+name", bytes) allocates, ("-name", 0)
    frees."""
    half = rows * (rotary // 2) * 4
    yield "+t", rows * 4
    if kind == "linear":
        yield "+t_scaled", rows * 4
        yield "-t", 0
    yield "+freqs", half
    yield "+cos", half
    yield "+sin", half
    if kind == "yarn":  # cos * mscale, sin * mscale (YaRN and DeepSeek's yarn)
        yield "+cos_m", half
        yield "-cos", 0
        yield "+sin_m", half
        yield "-sin", 0
    yield "+cache", rows * rotary * 4
    for name in ("freqs", "cos_m", "sin_m") if kind == "yarn" else ("freqs", "cos", "sin"):
        yield f"-{name}", 0
    yield "-t_scaled" if kind == "linear" else "-t", 0
    if not fp32_table:
        yield "+table", rows * rotary * e
        yield "-cache", 0


@lru_cache(maxsize=4096)
def load_memory(
    arch: Arch,
    e: int,
    quant: Quantization | None,
    t: int,
    pipeline: int,
    ep: int,
    fp32_rope: bool = False,
) -> tuple[LoadMemory, ...]:
    """Per pipeline stage (one process each, its own allocator): what "Model loading took"
    counts, the import-time MLA workspaces aside (exact 128 MiB segments, never freed: they
    change no other block, so the caller adds them per GPU type). ``fp32_rope``: the rotary
    tables stay fp32 (SGLang on CUDA). Cached per layout: the replay is a few hundred
    allocations (about 1 ms)."""
    return tuple(
        _replay(arch, stage, pipeline, e, quant, t, ep, fp32_rope)
        for stage in stages(arch, pipeline)
    )


def _split_layer(groups: tuple[TensorGroup, ...]) -> tuple[tuple[TensorGroup, ...], ...]:
    """A layer's groups as vLLM constructs them: attention, MLP (or MoE), the layer norms."""
    norms = tuple(g for g in groups if g.role is Role.NORM and g.name == "layernorms")
    mlp = tuple(
        g
        for g in groups
        if g.role in (Role.EXPERT, Role.ROUTER)
        or g.name.startswith(("gate_proj", "up_proj", "down_proj", "shared_expert"))
    )
    attn = tuple(g for g in groups if g not in norms and g not in mlp)
    return attn, mlp, norms


def _replay(
    arch: Arch,
    stage: Stage,
    pipeline: int,
    e: int,
    quant: Quantization | None,
    t: int,
    ep: int,
    fp32_rope: bool,
) -> LoadMemory:
    alloc = CachingAllocator()
    ids = count(1)
    live: dict[str, int] = {}
    tensor_bytes = rotary_bytes = 0

    def allocate(sizes: list[tuple[str, int]]) -> None:
        nonlocal tensor_bytes
        for _name, n in sizes:
            if n:
                alloc.malloc(next(ids), n)
                tensor_bytes += n

    def run(groups: tuple[TensorGroup, ...]) -> None:
        allocate(_sizes(groups, arch, t, ep, e, quant, None))

    if stage.first:
        allocate(_extras(arch, t, ep, e, quant))
        run(arch.embeddings)
    kinds = ropes(arch)
    local, scaled = (kinds[0], kinds[1]) if len(kinds) == 2 else (None, kinds[0])
    built: set[str] = set()
    rotary = rotary_dim(arch)
    for layer, n in stage.layer_runs:
        attn, mlp, norms = _split_layer(layer.tensors)
        for _ in range(n):
            run(attn)
            key = "local" if local is not None and layer.window is not None else "scaled"
            if key not in built:  # get_rope is cached: the first layer that uses it builds it
                built.add(key)
                rows, kind = local if key == "local" else scaled  # type: ignore[misc]
                for step, size in _rope_steps(rows, rotary, e, kind, fp32_rope):
                    if step[0] == "+":
                        live[step[1:]] = h = next(ids)
                        alloc.malloc(h, size)
                    else:
                        alloc.free(live.pop(step[1:]))
                table = rows * rotary * (4 if fp32_rope else e)
                tensor_bytes += table
                rotary_bytes += table
            run(mlp)
            run(norms)
    if stage.last:
        run(head_groups(arch, pipeline))
    alloc.empty_cache()
    return LoadMemory(tensor_bytes, alloc.allocated_bytes, rotary_bytes, alloc.reserved_bytes)
