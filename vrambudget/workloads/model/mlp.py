"""The feed-forward block: gated (SiLU or GELU) and plain MLPs, and MoE with top-k routing over
balanced experts (the package docstring says why balanced)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vrambudget.core.arch import Arch, LayerType

from .. import kernels
from .ops import _GELU_FAMILIES, _Ops
from .parameters import _Bank
from .plan import BuildPlan


def _tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


_COMPOSED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # transformers' activations.py, op for op: autograd saves what their modules save
    "gelu_new": _tanh_gelu,
    "gelu_accurate": _tanh_gelu,
    "gelu_python_tanh": lambda x: (
        x * 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    ),
    "gelu_fast": lambda x: (
        0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
    ),
    "gelu_python": lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu_10": lambda x: torch.clip(F.gelu(x), -10.0, 10.0),
}
"""The activations of :data:`~vrambudget.core.formulas.activations.MODEL_CODE_ACTIVATIONS`
(``sqrtsoftplus`` and ``xielu`` run torch's kernels here: the built-in builders do not build
their families). The ops run in the compute dtype: torch.autocast's fp32 ``pow`` is not
imitated."""


class _FeedForward:
    """The MLP methods of :class:`~vrambudget.workloads.model.transformer.TransformerModel`
    (which sets these fields)."""

    arch: Arch
    plan: BuildPlan
    ops: _Ops

    # ------------------------------------------------------------------------------- MLP --

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        """A gated MLP's activation: the model code's Python composition where the plan runs
        it, else torch's kernel."""
        composed = _COMPOSED.get(self.arch.activation) if self.plan.composed_activations else None
        if composed is not None:
            return composed(x)
        if self.arch.model_type in _GELU_FAMILIES:
            return F.gelu(x, approximate="tanh")
        return F.silu(x)

    def _dense_act(self, x: torch.Tensor, approximate: str) -> torch.Tensor:
        """A plain MLP's GELU: the model code's Python composition where the plan runs it."""
        composed = _COMPOSED.get(self.arch.activation) if self.plan.composed_activations else None
        return composed(x) if composed is not None else F.gelu(x, approximate=approximate)

    def _gated(self, bank: _Bank, prefix: str, x: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        g = self._act(ops.linear(bank, prefix + "gate_proj", x))
        return ops.linear(bank, prefix + "down_proj", g * ops.linear(bank, prefix + "up_proj", x))

    def _mlp(self, bank: _Bank, layer: LayerType, x: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        if layer.moe:
            return self._moe(bank, x)
        if bank.has("mlp__c_fc"):
            return ops.linear(
                bank, "mlp__c_proj", self._dense_act(ops.linear(bank, "mlp__c_fc", x), "tanh")
            )
        if bank.has("intermediate__dense"):
            return ops.linear(
                bank,
                "output__dense",
                self._dense_act(ops.linear(bank, "intermediate__dense", x), "none"),
            )
        if bank.has("gate_proj"):
            return self._gated(bank, "", x)
        if bank.has("gate_up_proj"):  # Phi-3: fused gate_up_proj, chunked (Phi3MLP)
            gate, up = ops.linear(bank, "gate_up_proj", x).chunk(2, dim=-1)
            return ops.linear(bank, "down_proj", self._act(gate) * up)
        return ops.linear(bank, "fc2", self._dense_act(ops.linear(bank, "fc1", x), "none"))

    def _experts(self, bank: _Bank, xe: torch.Tensor) -> torch.Tensor:
        """Grouped GEMM over experts: xe (E, n, h) -> (E, n, h)."""
        ops = self.ops
        out = []
        for name in ("experts__gate_proj", "experts__up_proj"):
            if name in bank.quantized:
                rows, _ = bank.shapes[name]
                out.append(kernels.packed_linear(xe, rows))
            else:
                w = ops.weight(bank, name)
                out.append(torch.bmm(xe, w.transpose(1, 2)) + self._expert_lora(bank, name, xe))
        hidden = self._act(out[0]) * out[1]
        name = "experts__down_proj"
        if name in bank.quantized:
            return kernels.packed_linear(hidden, bank.shapes[name][0])
        w = ops.weight(bank, name)
        return torch.bmm(hidden, w.transpose(1, 2)) + self._expert_lora(bank, name, hidden)

    def _expert_lora(self, bank: _Bank, name: str, x: torch.Tensor) -> torch.Tensor | float:
        a = getattr(bank, name + "__lora_A", None)
        if a is None:
            return 0.0
        b = getattr(bank, name + "__lora_B")
        z = torch.bmm(torch.bmm(x.to(a.dtype), a.transpose(1, 2)), b.transpose(1, 2))
        return (z * (2.0 / self.plan.lora_rank)).to(x.dtype)

    def _moe(self, bank: _Bank, x: torch.Tensor) -> torch.Tensor:
        a = self.arch
        moe = a.moe
        assert moe is not None
        b, s, h = x.shape
        tokens = b * s
        flat = x.reshape(tokens, h)
        logits = F.linear(flat, self.ops.weight(bank, "router"))
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, _ = torch.topk(probs, moe.experts_per_token, dim=-1)
        weights = weights.to(x.dtype)
        k, experts = moe.experts_per_token, moe.num_experts
        per_expert = -(-tokens * k // experts)
        routed = flat.repeat_interleave(k, dim=0)  # gathered inputs, one row per (token, k)
        pad = per_expert * experts - tokens * k
        if pad:
            routed = torch.cat((routed, routed.new_zeros(pad, h)))
        ye = self._experts(bank, routed.reshape(experts, per_expert, h))
        ye = ye.reshape(experts * per_expert, h)[: tokens * k].reshape(tokens, k, h)
        y = (ye * weights[..., None]).sum(dim=1)
        if bank.has("shared_experts__gate_proj"):
            shared = self._gated(bank, "shared_experts__", flat)
            if bank.has("shared_expert_gate"):
                shared = (
                    torch.sigmoid(F.linear(flat, self.ops.weight(bank, "shared_expert_gate")))
                    * shared
                )
            y = y + shared
        return y.reshape(b, s, h)
