"""A transformer built from a resolved ``Arch``: the parameter tensors are exactly the
architecture's tensor inventory (``vrambudget.core.families``) sliced for one tensor-parallel
rank, so the weights a trace or a probe allocates are the weights the formulas count.

Forward code follows the families' ``transformers`` modelling code in what it allocates and
saves: pre-norm decoder layers (sandwich norms for Gemma 2/3, QK-norm for Qwen3/Gemma 3), RoPE as
``q * cos + rotate_half(q) * sin``, gated or GELU MLPs, MoE with top-k routing, DeepSeek's latent
attention, GPT-2's learned positions and BERT's post-norm encoder. Attention and LayerNorm use
``kernels`` (fused/flash memory behaviour); RMSNorm is fused, or in training the framework's
fp32 upcast the stack names (``BuildPlan.rms_norm``); everything else is plain torch.

Routing in an MoE layer is data dependent, which fake tensors cannot follow: tokens are assumed
balanced over experts (ceil(tokens x top_k / experts) each), the capacity a grouped GEMM sees
on average.

Modules: ``plan`` (:class:`BuildPlan`), ``parameters`` (the tensor inventory as parameters and
buffers), ``ops`` (linear, norm and dropout as the plan runs them; RoPE), ``attention`` (the
attention block and the KV cache), ``mlp`` (dense and MoE feed-forward) and ``transformer``
(:class:`TransformerModel`: embeddings, layers, heads).
"""

from __future__ import annotations

from .attention import KVCache
from .parameters import component_of
from .plan import BuildPlan
from .transformer import TransformerModel

__all__ = ["BuildPlan", "KVCache", "TransformerModel", "component_of"]
