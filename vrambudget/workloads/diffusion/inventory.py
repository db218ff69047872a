"""A pipeline component built by its own library from its ``config.json`` on the meta device
(shapes and dtypes, no memory), and its inventory as the core's plain data.

diffusers components (``UNet2DConditionModel``, ``AutoencoderKL``, ``SD3Transformer2DModel``,
``FluxTransformer2DModel``) are built with the class's ``from_config`` (the path of
``from_pretrained``: ``configuration_utils.py`` ``ConfigMixin.from_config``) and cast to the
weights dtype, as ``from_pretrained(torch_dtype=...)`` loads them (none of the four keeps
modules in fp32: no ``_keep_in_fp32_modules``). transformers text encoders go through
:mod:`vrambudget.workloads.hf` (the config class's ``from_dict`` and ``_from_config``), with the
model's dtype plan applied (``modeling_utils.py`` ``_get_dtype_plan``: T5 keeps ``wo`` in fp32
at fp16).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from vrambudget.core.diffusion.inventory import BufferGroup, ComponentInventory, ModuleGroup
from vrambudget.core.errors import InvalidWorkload

__all__ = [
    "DIFFUSERS_CLASSES",
    "TORCH_DTYPES",
    "build_component",
    "framework_inventory",
    "library",
]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
DIFFUSERS_CLASSES = (
    "UNet2DConditionModel",
    "AutoencoderKL",
    "SD3Transformer2DModel",
    "FluxTransformer2DModel",
)
_INT = re.compile(r"(?<=\.)\d+(?=\.|$)")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """diffusers and transformers log about config keys they ignore."""
    loggers = [logging.getLogger(n) for n in ("diffusers", "transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _diffusers(class_name: str, config: Mapping[str, Any], dtype: torch.dtype) -> nn.Module:
    import diffusers

    cls = getattr(diffusers, class_name)
    with _quiet():
        with torch.device("meta"):
            model: nn.Module = cls.from_config(dict(config))
        return model.to(dtype=dtype).eval()


def _transformers(class_name: str, config: Mapping[str, Any], dtype: torch.dtype) -> nn.Module:
    import transformers

    from ..hf.config import build_config
    from ..hf.inventory import build_meta_model

    cfg = build_config(config)
    cls = getattr(transformers, class_name)
    model = build_meta_model(cfg, cls, dtype)
    plan = model._get_dtype_plan(dtype)
    if plan:
        keep = re.compile(r"(^|\.)(" + "|".join(re.escape(k) for k in plan) + r")(\.|$)")
        for name, module in model.named_modules():
            if name and keep.search(name):
                module.to(dtype=torch.float32)
    return model


def library() -> str:
    """``diffusers 0.42.1, transformers 5.23.0``: the code the components are built with."""
    import diffusers
    import transformers

    return f"diffusers {diffusers.__version__}, transformers {transformers.__version__}"


def build_component(class_name: str, config: Mapping[str, Any], dtype: str) -> nn.Module:
    """``class_name`` built from ``config`` on the meta device in ``dtype`` (``fp16``,
    ``bf16``, ``fp32``), in eval mode."""
    torch_dtype = TORCH_DTYPES[dtype]
    try:
        if class_name in DIFFUSERS_CLASSES:
            return _diffusers(class_name, config, torch_dtype)
        return _transformers(class_name, config, torch_dtype)
    except InvalidWorkload:
        raise
    except Exception as exc:  # noqa: BLE001 - the config is the caller's
        raise InvalidWorkload("config", f"{class_name} could not be built: {exc}") from None


def framework_inventory(
    class_name: str, config: Mapping[str, Any], role: str
) -> ComponentInventory:
    """The inventory of the module tree the library builds: every module that owns
    parameters, grouped by name pattern; fp32 modules of an fp16 build marked ``keep_fp32``."""
    model = build_component(class_name, config, "fp16")
    rows: dict[tuple[str, str, tuple[int, ...], bool], int] = {}
    seen: set[int] = set()  # a tied parameter (T5's shared embedding) is counted once
    for name, module in model.named_modules(remove_duplicate=False):
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        if not own:
            continue
        tensors = tuple(p.numel() for p in own)
        fp32 = any(p.dtype == torch.float32 for p in own)
        key = (_INT.sub("{}", name), type(module).__name__, tensors, fp32)
        rows[key] = rows.get(key, 0) + 1
    groups = tuple(
        ModuleGroup(pattern=p, module=m, tensors=t, count=c, keep_fp32=f)
        for (p, m, t, f), c in rows.items()
    )
    persistent = {
        f"{mn}.{bn}" if mn else bn
        for mn, mod in model.named_modules()
        for bn in mod._buffers
        if bn not in mod._non_persistent_buffers_set
    }
    buffers = tuple(
        BufferGroup(
            name=name,
            numel=b.numel(),
            dtype="float" if b.dtype.is_floating_point else "int64",
            persistent=name in persistent,
        )
        for name, b in model.named_buffers()
    )
    return ComponentInventory(role=role, class_name=class_name, groups=groups, buffers=buffers)
