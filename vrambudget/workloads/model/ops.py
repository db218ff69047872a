"""The operations whose memory depends on the plan: weights (dequantized or cast), linear
(quantized kernels, LoRA), norm, dropout; and RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vrambudget.core.spec import BitsAndBytes4bit

from .. import kernels
from ..marks import Marks
from .parameters import _Bank
from .plan import BuildPlan

# Families whose gated MLP uses GELU (tanh) instead of SiLU (Gemma: hidden_activation
# gelu_pytorch_tanh); memory is the same, the name keeps real runs faithful.
_GELU_FAMILIES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
_GEMMA_FAMILIES = _GELU_FAMILIES  # RMSNorm weight applied as (1 + w); embeddings x sqrt(h)
_EPS = 1e-6


class _Ops:
    """Linear layers, norms and casts shared by every layer; holds the per-forward autocast
    weight cache."""

    def __init__(self, plan: BuildPlan, marks: Marks, rms: bool, norm_offset: float) -> None:
        self.plan = plan
        self.marks = marks
        self.rms = rms
        self.norm_offset = norm_offset
        self.cast_cache: dict[int, torch.Tensor] = {}

    def weight(self, bank: _Bank, name: str, saved_copy: bool = True) -> torch.Tensor:
        # a modules_to_save copy, where there is one, in place of the frozen original (not for
        # a tied LM head reading the embedding's table: PEFT wraps the embedding module only)
        saved = getattr(bank, name + "__saved", None) if saved_copy else None
        w: torch.Tensor = saved if saved is not None else getattr(bank, name)
        # Parameters stored in another dtype than the compute dtype (autocast, or e.g. fp32
        # weights with fp16 compute) are cast at use, once per forward, as torch.autocast does.
        if w.dtype == self.plan.compute_dtype or not w.is_floating_point():
            return w
        key = id(w)
        cached = self.cast_cache.get(key)
        if cached is None:  # torch.autocast caches the cast of a leaf weight per region
            with self.marks.scope("runtime_workspace"):
                cached = w.to(self.plan.compute_dtype)
            self.cast_cache[key] = cached
        return cached

    def linear(
        self, bank: _Bank, name: str, x: torch.Tensor, saved_copy: bool = True
    ) -> torch.Tensor:
        bias = getattr(bank, name + "__bias", None)
        if bias is not None:
            bias = self.weight(bank, name + "__bias")
        rows, cols = bank.shapes[name]
        if name in bank.quantized:
            packed: torch.Tensor = getattr(bank, name)
            if self._dequantizes():
                with self.marks.scope("runtime_workspace"):
                    y = kernels.dequantized_linear(x, packed, rows, cols, bias)
            else:
                y = kernels.packed_linear(x, rows, bias)
        else:
            y = F.linear(x, self.weight(bank, name, saved_copy), bias)
        lora_a = getattr(bank, name + "__lora_A", None)
        if lora_a is None:
            return y
        lora_b = getattr(bank, name + "__lora_B")
        # PEFT LoraLayer.forward: the input is cast to the adapter dtype, lora_B(lora_A(x)) is
        # scaled and added, and the sum is cast back to the base output's dtype.
        xa = x.to(lora_a.dtype)
        z = F.linear(F.linear(xa, lora_a), lora_b) * (2.0 / self.plan.lora_rank)
        return (y + z).to(y.dtype)

    def _dequantizes(self) -> bool:
        return isinstance(self.plan.quantization, BitsAndBytes4bit)

    def norm(self, bank: _Bank, name: str, x: torch.Tensor) -> torch.Tensor:
        w = self.weight(bank, name)
        b = getattr(bank, name + "__bias", None)
        if b is not None:
            b = self.weight(bank, name + "__bias")
        norm = self.plan.rms_norm
        if self.rms and norm != "fused":
            # Gemma's norm multiplies in fp32 (transformers' (1.0 + self.weight.float())).
            fp32_normed = norm == "upcast_fp32_normed" or bool(self.norm_offset)
            return kernels.upcast_rms_norm(
                x, w, eps=_EPS, offset=self.norm_offset, fp32_normed=fp32_normed
            )
        return kernels.fused_norm(x, w, b, eps=_EPS, rms=self.rms, offset=self.norm_offset)

    def dropout(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        p = self.plan.dropout
        return F.dropout(x, p, training=True) if training and p > 0 else x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers ``apply_rotary_pos_emb``; cos/sin (s, d) broadcast over batch and heads."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]
