"""One module per component of a budget: each says in words what the answer shows beside the
number (``FORMULA``, ``SOURCE``), and holds the small pure functions that compute it, with the
formula, a worked number and the source in their docstrings.

``weights`` · ``quantization_metadata`` · ``adapters`` · ``kv_cache`` · ``activations`` ·
``logits`` · ``gradients`` · ``optimizer_state`` · ``master_weights`` · ``cuda_context`` ·
``runtime_workspace`` · ``communication_buffers`` · ``allocator_overhead`` · ``headroom``.

The analytic budgets (:mod:`vrambudget.core.budget`) combine them per pipeline stage and phase;
the texts shown in answers are read from here (:data:`TEXTS`), so a number and its words live
in one module.
"""

from __future__ import annotations

from ..components import Component
from . import (
    activations,
    adapters,
    allocator_overhead,
    communication_buffers,
    cuda_context,
    gradients,
    headroom,
    kv_cache,
    logits,
    master_weights,
    optimizer_state,
    quantization_metadata,
    runtime_workspace,
    weights,
)

__all__ = ["MODULES", "TEXTS"]

MODULES = {
    Component.WEIGHTS: weights,
    Component.QUANTIZATION_METADATA: quantization_metadata,
    Component.ADAPTERS: adapters,
    Component.KV_CACHE: kv_cache,
    Component.ACTIVATIONS: activations,
    Component.LOGITS: logits,
    Component.GRADIENTS: gradients,
    Component.OPTIMIZER_STATE: optimizer_state,
    Component.MASTER_WEIGHTS: master_weights,
    Component.CUDA_CONTEXT: cuda_context,
    Component.RUNTIME_WORKSPACE: runtime_workspace,
    Component.COMMUNICATION_BUFFERS: communication_buffers,
    Component.ALLOCATOR_OVERHEAD: allocator_overhead,
    Component.HEADROOM: headroom,
}
"""The formula module of each component."""

TEXTS: dict[Component, tuple[str, str]] = {c: (m.FORMULA, m.SOURCE) for c, m in MODULES.items()}
"""(formula, source) in words, as the analytic budgets show them (overhead lines replace the
source with their device type's or calibration profile's)."""
