"""A checkpoint's stored tensors (its safetensors headers) applied to an ``Arch``: every tensor
the model loads, with the exact bytes its header gives, whatever the packing (AWQ ``qweight``,
bitsandbytes ``absmax``, MXFP4 ``_blocks`` / ``_scales``, fp8 ``weight_scale_inv`` ...).

Which stored tensors a model loads: those under a module the framework builds (the inventory's
module paths; without one, any module of the layer stack and the top level), in a layer the
model has (DeepSeek-V3 stores a multi-token-prediction layer 61 that inference stacks skip), and
not a buffer the framework recomputes (older Llama checkpoints store ``rotary_emb.inv_freq``).
Tensors the framework creates that the checkpoint does not store (non-persistent buffers) keep
the inventory's sizes. Payload and quantization metadata are told apart by the tensor's name
(the loaders' own names: ``qweight`` / ``scales`` / ``qzeros``, ``weight_scale``, ``absmax``).
"""

from __future__ import annotations

from collections.abc import Callable

from .arch import Arch
from .checkpoint import StoredGroup
from .families.tensors import compress_runs
from .inventory import ModelInventory
from .quantization import BNB_OFFSET_BYTES

__all__ = ["METADATA_SUFFIXES", "is_metadata", "loaded_by", "with_stored_tensors"]

METADATA_SUFFIXES = (
    "scales",
    "qzeros",
    "g_idx",
    "weight_scale",
    "weight_scale_inv",
    "weight_scale_2",
    "input_scale",
    "input_scale_inv",
    "weight_zero_point",
    "weight_global_scale",
    "input_global_scale",
    "weight_shape",
    "absmax",
    "quant_map",
    "nested_absmax",
    "nested_quant_map",
    "SCB",
    "weight_format",
    "k_scale",
    "v_scale",
    "zeros",
)
"""Final name components of quantization metadata (AutoGPTQ/AutoAWQ ``scales``/``qzeros``/
``g_idx``; compressed-tensors ``weight_scale``/``weight_zero_point``/``weight_global_scale``/
``weight_shape``; fp8 ``weight_scale(_inv)``; bitsandbytes ``absmax``/``quant_map``/
``nested_*``/``quant_state.*``/``SCB``; MXFP4 ``*_scales``)."""

_EMBEDDING_MODULES = ("embed_tokens", "word_embeddings", "wte", "embed_in", "embeddings", "shared")


def is_metadata(pattern: str) -> bool:
    parts = pattern.split(".")
    leaf = parts[-1]
    if "quant_state" in parts:
        return True
    return leaf in METADATA_SUFFIXES or leaf.endswith("_scales")


def _unpacked_at_load(pattern: str) -> bool:
    """Stored tensors the loader turns into Python state and does not keep on the device:
    bitsandbytes' ``quant_state.bitsandbytes__nf4`` JSON (``functional.py`` 515-517
    ``QuantState.from_dict``) and LLM.int8's one-byte ``weight_format``."""
    parts = pattern.split(".")
    return "quant_state" in parts or parts[-1] == "weight_format"


def _module_path(pattern: str) -> str:
    """``model.layers.{}.self_attn.q_proj.qweight`` -> ``model.layers.{}.self_attn.q_proj``;
    bitsandbytes' ``q_proj.weight.absmax`` and ``q_proj.weight.quant_state.x`` too."""
    parts = pattern.split(".")
    parts = parts[: parts.index("quant_state")] if "quant_state" in parts else parts[:-1]
    if parts and parts[-1] in ("weight", "bias"):
        parts = parts[:-1]
    return ".".join(parts)


def _inventory_modules(inv: ModelInventory) -> tuple[set[str], set[str]]:
    """(module paths the framework builds, names of its non-persistent buffers)."""
    modules: set[str] = set()
    recomputed: set[str] = set()
    for t in inv.tensors:
        modules.add(t.pattern.rpartition(".")[0])
        if t.kind == "buffer" and not t.persistent:
            recomputed.add(t.pattern)
    for alias, _ in inv.tied:
        recomputed.add(alias)  # a tied alias shares the storage it is tied to
    return modules, recomputed


def loaded_by(
    stack: str | None, num_layers: int, inv: ModelInventory | None
) -> Callable[[StoredGroup], bool]:
    """Whether the model loads a stored tensor group (see the module docstring); the
    inventory's modules are gathered once per checkpoint."""
    modules, recomputed = _inventory_modules(inv) if inv is not None else (set(), set())

    def loaded(g: StoredGroup) -> bool:
        if g.pattern.endswith("inv_freq") or _unpacked_at_load(g.pattern):
            return False
        in_stack = stack is not None and g.pattern.startswith(stack) and bool(g.layers)
        if in_stack and min(g.layers) >= num_layers:
            return False  # only layers the model does not have (DeepSeek-V3's MTP layer 61)
        if inv is None:
            return True
        if g.pattern in recomputed:
            return False
        # a module the framework builds, or a submodule of one (bitsandbytes' quant state)
        parts = _module_path(g.pattern).split(".")
        return any(".".join(parts[:i]) in modules for i in range(len(parts), 0, -1))

    return loaded


def _offset_bytes(pattern: str) -> int:
    """Device bytes a tensor's loading adds: bitsandbytes keeps a double-quantized state's fp32
    ``offset`` on the device (``functional.py`` 523, ``QuantState.from_dict``), one per
    ``nested_absmax``."""
    return BNB_OFFSET_BYTES if pattern.endswith("nested_absmax") else 0


def _stack_of(arch: Arch, stored: tuple[StoredGroup, ...], inv: ModelInventory | None) -> str:
    if inv is not None and inv.stack is not None:
        return inv.stack
    # The stack is the numbered list with as many layers as the model has.
    counts: dict[str, int] = {}
    for g in stored:
        if "{}" in g.pattern and g.layers:
            prefix = g.pattern[: g.pattern.index("{}") + 2]
            counts[prefix] = max(counts.get(prefix, 0), len(g.layers))
    fitting = [p for p, n in counts.items() if n >= arch.num_layers]
    return min(fitting, key=len) if fitting else "model.layers.{}"


def _top_bucket(pattern: str, vocab: int, shape: tuple[int, ...]) -> str:
    module = _module_path(pattern).rsplit(".", 1)[-1]
    if module in _EMBEDDING_MODULES and shape and shape[0] == vocab:
        return "embeddings"
    if module in ("lm_head", "proj_out", "embed_out") or (
        "norm" in module and pattern.count(".") <= 2
    ):
        return "head"
    return "extras"


def with_stored_tensors(
    arch: Arch, stored: tuple[StoredGroup, ...], inv: ModelInventory | None
) -> Arch:
    """``arch`` with the checkpoint's exact bytes per layer and per top-level bucket: the
    tensors (and so LoRA targets, activations, splits) stay the architecture's; the bytes are
    the loaded stored tensors' (see the module docstring)."""
    from dataclasses import replace

    stack = _stack_of(arch, stored, inv)
    loaded = loaded_by(stack, arch.num_layers, inv)
    per_layer: dict[int, list[int]] = {}
    top: dict[str, list[int]] = {}
    for g in stored:
        if not loaded(g):
            continue
        column = 1 if is_metadata(g.pattern) else 0
        nbytes = g.nbytes + _offset_bytes(g.pattern)
        if g.pattern.startswith(stack) and g.layers:
            each = nbytes * (g.count // len(g.layers))
            for i in g.layers:
                if i < arch.num_layers:  # a layer the model has (not an MTP layer)
                    per_layer.setdefault(i, [0, 0])[column] += each
        else:
            bucket = _top_bucket(g.pattern, arch.vocab_size, g.shape)
            top.setdefault(bucket, [0, 0])[column] += nbytes * g.count
    flat = [layer for layer, n in arch.layer_runs for _ in range(n)]
    layers = [
        replace(layer, stored=tuple(per_layer.get(i, (0, 0))))  # type: ignore[arg-type]
        for i, layer in enumerate(flat)
    ]
    buckets = {"embeddings": arch.embeddings, "head": arch.head, "extras": arch.extras}
    for name, groups in buckets.items():
        if groups and name not in top:
            top[name] = [0, 0]  # the architecture has it, the checkpoint does not store it
    stored_top = tuple((name, b[0], b[1]) for name, b in top.items() if buckets.get(name))
    # Stored bytes of a bucket the architecture lacks (a tied head stored twice) are not loaded.
    return replace(arch, layer_runs=compress_runs(layers), stored_top=stored_top)
