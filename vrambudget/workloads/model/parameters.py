"""The architecture's tensor inventory as a module's parameters and buffers, sliced for one
tensor-parallel rank (quantized payloads and their metadata, LoRA adapters)."""

from __future__ import annotations

import re

import torch
from torch import nn

from vrambudget.core.arch import Arch, Role, TensorGroup, lora_targeted, saved_by, saved_names
from vrambudget.core.layout import per_device_shape
from vrambudget.core.quantization import quantized_roles, tensor_storage

from .plan import BuildPlan

__all__ = ["component_of"]


def _dtype(plan: BuildPlan) -> torch.dtype:
    """Unquantized parameters' dtype: fp32 under QLoRA's PEFT preparation."""
    return torch.float32 if plan.kbit_fp32 else plan.param_dtype


def _name(group: TensorGroup) -> str:
    return group.name.replace(".", "__")


class _Bank(nn.Module):
    """The parameters of one layer (or of the embeddings/head), created from tensor groups."""

    def __init__(
        self,
        groups: tuple[TensorGroup, ...],
        arch: Arch,
        plan: BuildPlan,
        saved_only: tuple[TensorGroup, ...] = (),
    ) -> None:
        """``saved_only``: modules with no parameter of their own here that get a
        ``modules_to_save`` copy (a tied LM head: its weight is the embedding's)."""
        super().__init__()
        t = plan.tensor_parallel
        q = plan.quantization
        roles = quantized_roles(q) if q is not None else frozenset()
        self.shapes: dict[str, tuple[int, int]] = {}
        self.quantized: set[str] = set()
        grad = plan.trainable == "full"
        for g in groups:
            rows, cols, count = per_device_shape(g, arch, t, 1)
            name = _name(g)
            self.shapes[name] = (rows, cols)
            shape: tuple[int, ...] = (rows,) if cols == 1 else (rows, cols)
            if g.role is Role.EXPERT:
                shape = (count, rows, cols)
            elif count > 1 and g.role is not Role.NORM:
                shape = (count, *shape)
            if q is not None and g.role in roles:
                n = count if g.role is Role.EXPERT else 1
                payload, meta = tensor_storage(q, rows, cols, 1)
                self.register_buffer(
                    name, torch.empty(n, payload, dtype=torch.uint8, device=plan.device)
                )
                self.register_buffer(
                    name + "__meta", torch.empty(n, meta, dtype=torch.uint8, device=plan.device)
                )
                self.quantized.add(name)
                continue
            if g.role is Role.NORM and count > 1:  # e.g. the 2 or 4 norms of a decoder layer
                for i in range(count):
                    self.register_parameter(
                        f"{name}__{i}",
                        nn.Parameter(
                            torch.empty(shape, dtype=_dtype(plan), device=plan.device),
                            requires_grad=grad,
                        ),
                    )
                continue
            self.register_parameter(
                name,
                nn.Parameter(
                    torch.empty(shape, dtype=_dtype(plan), device=plan.device),
                    requires_grad=grad,
                ),
            )
        if plan.trainable == "lora":
            self._save_copies(groups, saved_only, arch, plan)
            for g in groups:
                if lora_targeted(g, plan.lora_targets, plan.lora_experts):
                    rows, cols, count = per_device_shape(g, arch, t, 1)
                    lead = (count,) if g.role is Role.EXPERT else ()
                    r = plan.lora_rank
                    self.register_parameter(
                        _name(g) + "__lora_A",
                        nn.Parameter(
                            torch.empty(
                                (*lead, r, cols), dtype=plan.adapter_dtype, device=plan.device
                            )
                        ),
                    )
                    self.register_parameter(
                        _name(g) + "__lora_B",
                        nn.Parameter(
                            torch.empty(
                                (*lead, rows, r), dtype=plan.adapter_dtype, device=plan.device
                            )
                        ),
                    )

    def _save_copies(
        self,
        groups: tuple[TensorGroup, ...],
        saved_only: tuple[TensorGroup, ...],
        arch: Arch,
        plan: BuildPlan,
    ) -> None:
        """PEFT's ``ModulesToSaveWrapper``: a trainable deep copy of each named module's
        parameters, ``<name>__saved``, in the original's dtype (fp16 promoted to fp32 where the
        plan says), which :meth:`_Ops.weight` reads in place of the original."""
        fresh = {_name(g) for g in saved_only}
        for g in (*groups, *saved_only):
            name = _name(g)
            if not saved_by(g, plan.saved_modules) or name in self.quantized:
                continue  # a 4-bit module is refused by the statics (its copy cannot train)
            originals: list[tuple[str, tuple[int, ...], torch.dtype]]
            if name in fresh:
                rows, cols, _ = per_device_shape(g, arch, plan.tensor_parallel, 1)
                self.shapes[name] = (rows, cols)
                originals = [(name, (rows, cols), _dtype(plan))]
            else:  # the group's parameter, or those of its numbered modules it names
                reached = set(saved_names(g, plan.saved_modules))
                originals = [
                    (n, tuple(p.shape), p.dtype)
                    for n, p in self.named_parameters(recurse=False)
                    if n == name
                    or (
                        (m := re.fullmatch(rf"{name}__(\d+)", n)) is not None
                        and (not g.modules or g.modules[int(m.group(1))] in reached)
                    )
                ]
            for n, shape, dtype in originals:
                if dtype == torch.float16 and plan.saved_fp16_to_fp32:
                    dtype = torch.float32
                self.register_parameter(
                    n + "__saved",
                    nn.Parameter(torch.empty(shape, dtype=dtype, device=plan.device)),
                )

    def has(self, name: str) -> bool:
        return hasattr(self, name)


def component_of(name: str) -> str:
    """Component of a named parameter or buffer of a ``TransformerModel``."""
    if name.endswith("__meta"):
        return "quantization_metadata"
    if "__lora_" in name or name.endswith("__saved"):
        return "adapters"
    return "weights"
