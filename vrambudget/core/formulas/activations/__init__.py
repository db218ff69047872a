"""Activations: training's tensors saved for backward, inference's working set of one forward
pass -- per layer on one device, itemized tensor by tensor, and over a pipeline stage.

Shown in answers::

    training: tensors saved for backward per layer x layers x micro-batches in flight;
    inference: residual + max(attention, MLP) working set of one forward pass

Worked number: GPT layer, s = 2048, b = 1, h = 4096, a = 32 heads, bf16, eager attention without
recomputation saves ``s*b*h*(34 + 5*a*s/h)`` = 2048 x 4096 x (34 + 5 x 32 x 2048 / 4096) =
956,301,312 B (Korthikanti et al. 2022, Table 2; the formula tests check the identity).

Training counts the tensors autograd saves for backward (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", §4.1): with a GPT layer, 2-byte
activations, 1-byte dropout masks and unfused attention this itemization sums to exactly
``s*b*h*(34 + 5*a*s/h)`` bytes, and with tensor parallelism to
``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` (Table 2) -- a test checks both. The same items generalize to
gated MLPs (4 saved tensors of the intermediate width), GQA, QK-norm, sandwich norms, MoE and
flash attention (which saves Q, K, V, the output and an fp32 log-sum-exp per row instead of the
s^2 score matrix; Dao et al. 2022 §3.1).

Inference counts the transient working set of one no-grad forward pass: the residual stream and
its normalized copy plus the larger of the attention or MLP sublayer's live intermediates.
"""

from __future__ import annotations

from .dims import DeviceDims, device_dims
from .inference import inference_activations, inference_working_set
from .training import (
    ACTIVATION_PART,
    FULL_TRAINING,
    HEAD_INPUTS_PART,
    MODEL_CODE_ACTIVATIONS,
    OFFLOADED_BACK_PART,
    POW_UPCAST_ACTIVATIONS,
    RECOMPUTE_GRADS_PART,
    RECOMPUTED_PART,
    RmsNorm,
    Trainable,
    activation_extra_bytes,
    eager_softmax_backward_bytes,
    eager_softmax_fp32,
    in_flight,
    layer_input_bytes,
    lora_layer_trainable,
    lora_trainable,
    norm_saved_bytes,
    norms_per_layer,
    offloaded_inputs_bytes,
    recompute_backward_bytes,
    saved_scores_bytes,
    shares_one_norm,
    training_activations,
    training_saved,
    unsloth_covers,
    unsloth_patched,
    unsloth_recompute,
    unsloth_runs,
    unsloth_trainable,
)

__all__ = [
    "ACTIVATION_PART",
    "FORMULA",
    "FULL_TRAINING",
    "HEAD_INPUTS_PART",
    "MODEL_CODE_ACTIVATIONS",
    "OFFLOADED_BACK_PART",
    "POW_UPCAST_ACTIVATIONS",
    "RECOMPUTED_PART",
    "RECOMPUTE_GRADS_PART",
    "SOURCE",
    "DeviceDims",
    "RmsNorm",
    "Trainable",
    "activation_extra_bytes",
    "device_dims",
    "eager_softmax_backward_bytes",
    "eager_softmax_fp32",
    "in_flight",
    "inference_activations",
    "inference_working_set",
    "layer_input_bytes",
    "lora_layer_trainable",
    "lora_trainable",
    "norm_saved_bytes",
    "norms_per_layer",
    "offloaded_inputs_bytes",
    "recompute_backward_bytes",
    "saved_scores_bytes",
    "shares_one_norm",
    "training_activations",
    "training_saved",
    "unsloth_covers",
    "unsloth_patched",
    "unsloth_recompute",
    "unsloth_runs",
    "unsloth_trainable",
]

FORMULA = (
    "training: tensors saved for backward per layer x layers x micro-batches in flight; "
    "inference: residual + max(attention, MLP) working set of one forward pass"
)
SOURCE = "Korthikanti et al. 2022 §4 (Table 2); Dao et al. 2022 §3 (flash attention)"
