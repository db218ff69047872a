"""Stand-ins for quantized linear layers, in place of the framework's ``nn.Linear``: they store
exactly the bytes the scheme's loader stores (:func:`vrambudget.core.quantization.
tensor_storage`) and allocate what its CUDA kernel allocates, since the kernels themselves
(bitsandbytes, AWQ, GPTQ/Marlin, fp8 GEMMs) do not run on fake CPU tensors.

* bitsandbytes 4-bit (``bitsandbytes/autograd/_functions.py`` ``matmul_4bit``): one token
  without gradient -> ``gemv_4bit``, no scratch; otherwise ``MatMul4Bit``: the weight
  dequantized into a compute-dtype scratch for the product (and again in the backward).
* AWQ GEMM (AutoAWQ ``WQLinear_GEMM.forward``): 8 tokens or more -> the weight dequantized to
  fp16 (``dequantize_weights_cuda``) and multiplied; fewer -> the fused kernel.
* the other schemes (GPTQ exllama/Marlin, int8, fp8, compressed-tensors, NVFP4): a fused GEMM
  that reads the packed weight in place and writes only the output.

The packed weight is a ``Params4bit`` (bitsandbytes' class name): PEFT's
``prepare_model_for_kbit_training`` casts every other 16-bit parameter to fp32 and leaves these.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vrambudget.core.quantization import tensor_storage
from vrambudget.core.spec import AWQ, BitsAndBytes4bit, Quantization

from .. import kernels

__all__ = ["Params4bit", "QuantizedLinear", "quantize_linears"]

_AWQ_DEQUANT_TOKENS = 8  # AutoAWQ WQLinear_GEMM: `if input.shape[0] * input.shape[1] >= 8`


class Params4bit(nn.Parameter):
    """A frozen packed weight (named as bitsandbytes names its class)."""


class QuantizedLinear(nn.Linear):
    """A linear layer stored as ``scheme`` stores it; ``weight`` is the packed payload."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        scheme: Quantization,
        dtype: torch.dtype,
        device: torch.device | str | None,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.scheme = scheme
        payload, meta = tensor_storage(scheme, out_features, in_features, 1)
        self.weight = Params4bit(
            torch.empty(payload, 1, dtype=torch.uint8, device=device), requires_grad=False
        )
        self.register_buffer("quant_meta", torch.empty(meta, dtype=torch.uint8, device=device))
        if bias:
            self.bias = nn.Parameter(
                torch.empty(out_features, dtype=dtype, device=device), requires_grad=False
            )
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.numel() // max(x.shape[-1], 1)
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        if isinstance(self.scheme, BitsAndBytes4bit):
            if tokens == 1 and not x.requires_grad:
                return kernels.packed_linear(x, self.out_features, bias)
            return kernels.dequantized_linear(
                x, self.weight, self.out_features, self.in_features, bias
            )
        if isinstance(self.scheme, AWQ) and tokens >= _AWQ_DEQUANT_TOKENS:
            return kernels.dequantized_linear(
                x, self.weight, self.out_features, self.in_features, bias
            )
        return kernels.packed_linear(x, self.out_features, bias)


def quantize_linears(
    model: nn.Module,
    scheme: Quantization,
    keep: Callable[[str, nn.Linear], bool],
    dtype: torch.dtype,
) -> int:
    """Replace every ``nn.Linear`` of ``model`` for which ``keep(name, module)`` is false by a
    :class:`QuantizedLinear`; the number replaced."""
    replaced = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear or keep(full, child):
                continue
            stand_in = QuantizedLinear(
                child.in_features,
                child.out_features,
                child.bias is not None,
                scheme,
                dtype,
                child.weight.device,
            )
            setattr(module, child_name, stand_in)
            replaced += 1
    return replaced
