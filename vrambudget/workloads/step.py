"""The optimizer step both training programs run (the built-in builders' and the framework's):
fp32 master copies, the step with its gradients and state tagged, the masters copied back.

The masters and the optimizer are built once, at a program's first training iteration, and kept
(:class:`TrainingState`): a training loop keeps its optimizer's state from one step to the
next, so every later forward and backward runs with the moments resident. (A program that
built them per call would measure, run one iteration at a time as the probe runs it, a peak
without them -- the first GPU campaign's training runs did.)

Mixed precision with fp32 masters (Megatron / DeepSpeed): each low-precision gradient is upcast
into its master's gradient and freed, one tensor at a time, the step runs on the masters, and
the masters are copied back into the parameters. The optimizer's state tensors are tagged after
the step (a torch optimizer creates them lazily at the first one); non-fused optimizers keep
their step counters on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .marks import HOST, Marks
from .optim import build_optimizer

__all__ = ["TrainingState", "masters_of", "step", "training_state"]


@dataclass
class TrainingState:
    """What a training loop keeps across its steps: the trainable parameters, their fp32
    masters (``master_fp32``; else none) and the optimizer (its state is created lazily at the
    first step, then lives as long as it does)."""

    params: list[torch.Tensor]
    masters: list[torch.Tensor]
    opt: torch.optim.Optimizer


def training_state(model: torch.nn.Module, w: Any, marks: Marks) -> TrainingState:
    """The state of ``w``'s training loop over ``model``'s trainable parameters (build it once
    per program and keep it)."""
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    masters = masters_of(params, w.mixed_precision, marks)
    with marks.scope("optimizer_state"):
        opt = build_optimizer(w.optimizer, masters or params)
    return TrainingState(params, masters, opt)


def masters_of(
    params: Sequence[torch.Tensor], mixed_precision: str, marks: Marks
) -> list[torch.Tensor]:
    """fp32 master copies of the trainable parameters (``master_fp32`` over low-precision
    parameters), or none."""
    if mixed_precision != "master_fp32" or all(p.dtype == torch.float32 for p in params):
        return []
    with marks.scope("master_weights"), torch.no_grad():
        masters = [p.detach().float() for p in params]
    for m in masters:
        m.requires_grad_(True)
    return masters


def step(
    opt: torch.optim.Optimizer,
    params: Sequence[torch.Tensor],
    masters: Sequence[torch.Tensor],
    marks: Marks,
    *,
    max_grad_norm: float | None = None,
) -> None:
    """One optimizer step (phase ``optimizer_step``), gradients clipped to ``max_grad_norm``
    when given (``torch.nn.utils.clip_grad_norm_``, as ``Trainer`` does)."""
    from .optim import host_state_tensors

    marks.phase("optimizer_step")
    for p in params:
        if p.grad is not None:
            marks.tag(p.grad, "gradients")
    with marks.scope("optimizer_state"):
        if masters:
            for p, m in zip(params, masters, strict=True):
                m.grad = p.grad.float() if p.grad is not None else None
                if m.grad is not None:
                    marks.tag(m.grad, "gradients")
                p.grad = None
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(masters or params, max_grad_norm)
        opt.step()
        if masters:
            with torch.no_grad():
                for p, m in zip(params, masters, strict=True):
                    p.copy_(m)
    host = {id(t) for t in host_state_tensors(opt)}
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                marks.tag(v, HOST if id(v) in host else "optimizer_state", "moments and statistics")
    for q in getattr(opt, "qmaps", ()):
        marks.tag(q, "optimizer_state", "moments and statistics")
    opt.zero_grad(set_to_none=True)
