"""What CUDA's scaled-dot-product attention allocates, under the frameworks' own attention code.

Every attention the traced frameworks run that is not eager ends in ``torch.nn.functional.
scaled_dot_product_attention``, looked up at call time: transformers' ``sdpa_attention_forward``
(``integrations/sdpa_attention.py``: the GQA choice, ``repeat_kv`` when a mask is given, the
causal flag), diffusers' ``AttnProcessor2_0`` / ``JointAttnProcessor2_0``
(``models/attention_processor.py``) and the native backend of ``dispatch_attention_fn`` that
FLUX calls (``models/attention_dispatch.py``). Within :func:`cuda_sdpa` that function is
:func:`vrambudget.workloads.kernels.emulated_sdpa`: it allocates what the backend CUDA would
pick allocates (one rule, :func:`vrambudget.core.formulas.sdpa.sdpa_backend`, shared with the
analytic tier and the built-in builders: flash, then memory-efficient, then math), and
computes nothing (fake tensors). Diffusers' attention slicing (``SlicedAttnProcessor``) does
not call SDPA: it runs ``baddbmm`` and ``softmax`` per slice, which the trace records as they
are.

In native mode (real runs) nothing is replaced: the real kernels run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.nn.functional as F

from . import kernels

__all__ = ["cuda_sdpa"]


@contextlib.contextmanager
def cuda_sdpa() -> Iterator[None]:
    """Within: ``F.scaled_dot_product_attention`` allocates as on CUDA (trace tier only)."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = kernels.emulated_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
