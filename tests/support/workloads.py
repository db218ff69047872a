"""Workloads as the API decodes them, and the tiny probe workloads the agent tests run."""

from __future__ import annotations

import msgspec

from vrambudget.agent.examples import TINY_MODEL
from vrambudget.core.spec import Workload


def workload(**fields: object) -> Workload:
    """Decode a workload exactly as the API would (defaults, tags and checks included)."""
    return msgspec.convert(fields, Workload)


# A model small enough that a real CPU probe of it takes about a second.
TINY = TINY_MODEL
# The smallest model a probe child builds (one layer): for tests of the probe plumbing.
TINIEST = {
    "source": "dimensions",
    "hidden_size": 64,
    "num_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}
FP32 = {"weights": "fp32", "compute": "fp32"}
INFER = {
    "kind": "inference",
    "model": TINY,
    "batch_size": 2,
    "prompt_tokens": 32,
    "generated_tokens": 4,
    "precision": FP32,
}
TRAIN = {
    "kind": "training",
    "model": TINY,
    "sequence_length": 32,
    "precision": FP32,
    "mixed_precision": "pure",
    "optimizer": {"name": "adamw", "implementation": "for_loop"},
}
