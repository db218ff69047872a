"""A pipeline component's tensors as plain data: its leaf modules with parameters (grouped by
name pattern), its buffers, and which modules the loader keeps in fp32.

The closed forms (:mod:`.counts`) produce it from a ``config.json`` in microseconds; the
``workloads`` layer produces the same structure from the module tree ``diffusers`` and
``transformers`` build on the meta device (``vrambudget.workloads.diffusion.inventory``), and
the tests hold the two equal, module class by module class.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ..dtypes import bytes_of

__all__ = ["BufferGroup", "ComponentInventory", "ModuleGroup"]


class ModuleGroup(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """``count`` leaf modules of one class with the same parameters (the same layer of every
    block: ``down_blocks.{}.resnets.{}.conv1``)."""

    pattern: str
    module: str
    """Class name (``Conv2d``, ``Linear``, ``GroupNorm``, ``LayerNorm``, ``Embedding`` ...)."""
    tensors: tuple[int, ...]
    """Elements of each parameter tensor of one module (weight, bias)."""
    count: int
    keep_fp32: bool = False
    """Kept in fp32 when the component is loaded in fp16 (transformers
    ``_keep_in_fp32_modules``: T5's ``wo``)."""

    @property
    def params(self) -> int:
        """Parameters of one module."""
        return sum(self.tensors)


class BufferGroup(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    name: str
    numel: int
    dtype: Literal["float", "int64"]
    """``float``: cast with the weights (SD3's ``pos_embed``); ``int64`` stays."""
    persistent: bool


class ComponentInventory(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    """The pipeline's name for it: ``unet``, ``transformer``, ``vae``, ``text_encoder`` ..."""
    class_name: str
    groups: tuple[ModuleGroup, ...]
    buffers: tuple[BufferGroup, ...] = ()

    @property
    def num_params(self) -> int:
        return sum(g.params * g.count for g in self.groups)

    def kept_fp32_params(self, dtype: str) -> int:
        """Parameters that stay fp32 when the weights are ``dtype`` (only at fp16)."""
        if dtype != "fp16":
            return 0
        return sum(g.params * g.count for g in self.groups if g.keep_fp32)

    def buffer_bytes(self, dtype: str) -> int:
        return sum(b.numel * (bytes_of(dtype) if b.dtype == "float" else 8) for b in self.buffers)

    def weight_bytes(self, dtype: str) -> int:
        """Parameters and buffers on the device when loaded with ``torch_dtype=dtype``:
        ``params x bytes(dtype) + kept_fp32 x (4 - bytes(dtype)) + buffers``."""
        e = bytes_of(dtype)
        return (
            self.num_params * e + self.kept_fp32_params(dtype) * (4 - e) + self.buffer_bytes(dtype)
        )

    def tensor_sizes(self, dtype: str) -> list[int]:
        """Bytes of every tensor on the device (parameters, then buffers), in module order."""
        e = bytes_of(dtype)
        out: list[int] = []
        for g in self.groups:
            b = 4 if g.keep_fp32 and dtype == "fp16" else e
            out += [n * b for n in g.tensors] * g.count
        out += [b.numel * (e if b.dtype == "float" else 8) for b in self.buffers]
        return out

    def largest_module_bytes(self, dtype: str) -> int:
        """The largest leaf module's parameters: what sequential offload puts on the device at
        once (accelerate ``AlignDevicesHook`` moves one module's own parameters per forward)."""
        e = bytes_of(dtype)
        return max(
            (g.params * (4 if g.keep_fp32 and dtype == "fp16" else e) for g in self.groups),
            default=0,
        )
