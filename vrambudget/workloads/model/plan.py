"""What the builder needs besides the architecture: dtypes, quantization, attention kernel,
training mode (full, LoRA), checkpointing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vrambudget.core.formulas.activations import RmsNorm
from vrambudget.core.spec import Quantization

__all__ = ["Attention", "BuildPlan"]

Attention = Literal["sdpa", "flash", "eager"]


@dataclass(frozen=True)
class BuildPlan:
    """Everything the builder needs besides the architecture."""

    tensor_parallel: int
    param_dtype: torch.dtype
    """Storage dtype of unquantized parameters."""
    compute_dtype: torch.dtype
    quantization: Quantization | None
    attention: Attention
    device: torch.device
    trainable: Literal["none", "full", "lora"] = "none"
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    lora_experts: bool = True
    """The target names reach routed experts (the stack's modelling code builds them as
    modules: :attr:`vrambudget.core.stack.Stack.lora_reaches_experts`)."""
    saved_modules: tuple[str, ...] = ()
    """PEFT's ``modules_to_save``: each named module's parameters get a trainable copy, which
    the forward uses in place of the frozen original."""
    saved_fp16_to_fp32: bool = False
    """An fp16 copy is trained in fp32 (Unsloth)."""
    tie_saved_head: bool = False
    """A tied LM head shares the embedding's saved copy (PEFT's ``ensure_weight_tying``)."""
    adapter_dtype: torch.dtype = torch.float32
    autocast: bool = False
    """fp32 parameters cast to the compute dtype at each use (torch.autocast's weight cache)."""
    dropout: float = 0.0
    checkpointing: Literal["none", "selective", "full"] = "none"
    kbit_fp32: bool = False
    """QLoRA as PEFT prepares it: the parameters that are not 4-bit are fp32
    (``prepare_model_for_kbit_training``)."""
    composed_activations: bool = False
    """The MLP runs the activation the config names as transformers' module does: a Python
    composition of elementwise ops for ``gelu_new`` and the others of
    :data:`~vrambudget.core.formulas.activations.MODEL_CODE_ACTIVATIONS` (the framework's
    model code is transformers'); false: torch's kernel."""
    rms_norm: RmsNorm = "fused"
    """The framework's RMSNorm the program imitates: ``fused`` one kernel (``F.rms_norm``),
    ``upcast`` / ``upcast_fp32_normed`` the framework's module in fp32
    (:func:`vrambudget.workloads.kernels.upcast_rms_norm`)."""
