"""Optimizers as the spec names them, with the implementation (fused / foreach / for-loop)
explicit: their peaks differ by whole parameter-sized temporaries."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import overload

import torch

from vrambudget.core.formulas.optimizer_state import BNB_MIN_8BIT_SIZE, BNB_OPTIM_BLOCKSIZE
from vrambudget.core.spec import SGD, Adafactor, AdamW, AdamW8bit

__all__ = ["AdamW8bitModel", "build_optimizer", "host_state_tensors"]

# bitsandbytes keeps the 8-bit quantization maps (256 fp32 values each, "dynamic" signed and
# unsigned) once per optimizer on the device (Optimizer8bit.name2qmap).
_QMAP_ELEMS = 256


class AdamW8bitModel(torch.optim.Optimizer):
    """bitsandbytes ``AdamW8bit`` memory: uint8 moments with one fp32 absmax per 256-element
    block for tensors of at least 4096 elements, fp32 moments below; the update kernel
    (``optimizer_update_8bit_blockwise``) works in place, without temporaries. Values follow
    plain AdamW (the blockwise quantization error is not modelled)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-5) -> None:
        super().__init__(
            params, {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
        )
        self.qmaps: list[torch.Tensor] = []

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:  # the Optimizer contract (torch/optim/sgd.py step)
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.qmaps:
                    self.qmaps = [
                        torch.empty(_QMAP_ELEMS, dtype=torch.float32, device=p.device)
                        for _ in range(2)
                    ]
                state = self.state[p]
                if not state:
                    n = p.numel()
                    if n >= BNB_MIN_8BIT_SIZE:
                        blocks = -(-n // BNB_OPTIM_BLOCKSIZE)
                        state["state1"] = torch.zeros(p.shape, dtype=torch.uint8, device=p.device)
                        state["state2"] = torch.zeros(p.shape, dtype=torch.uint8, device=p.device)
                        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                    else:
                        state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                        state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                    state["step"] = 0
                state["step"] += 1
                p.add_(p.grad, alpha=-group["lr"])  # in place, as the fused 8-bit kernel
        return loss


def build_optimizer(
    spec: AdamW | AdamW8bit | SGD | Adafactor, params: Sequence[torch.Tensor]
) -> torch.optim.Optimizer:
    match spec:
        case AdamW():
            return torch.optim.AdamW(
                params,
                lr=1e-5,
                fused=spec.implementation == "fused",
                foreach=spec.implementation == "foreach",
            )
        case SGD():
            return torch.optim.SGD(
                params,
                lr=1e-3,
                momentum=spec.momentum,
                fused=spec.implementation == "fused",
                foreach=spec.implementation == "foreach",
            )
        case Adafactor():
            if spec.beta1 is not None:
                raise ValueError("beta1")
            return torch.optim.Adafactor(params, lr=1e-2, foreach=spec.implementation == "foreach")
        case AdamW8bit():
            return AdamW8bitModel(params)


def host_state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """State tensors that a CUDA run keeps on the host: torch's per-parameter ``step`` counters
    unless the optimizer is fused or capturable (torch/optim/adam.py ``_init_group``)."""
    out: list[torch.Tensor] = []
    for group in opt.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            step = opt.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and not on_device:
                out.append(step)
    return out
