"""Model states per device (vrambudget/core/statics.py) against the ZeRO paper's hand counts."""

from __future__ import annotations

import pytest

from tests.support.workloads import workload
from vrambudget.core.deployed import deploy
from vrambudget.core.resolve import resolve_model
from vrambudget.core.statics import statics_for


def train(model_id, **kw):
    return workload(kind="training", model={"source": "preset", "id": model_id}, **kw)


PSI = 6_738_415_616  # Llama-2-7B


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        # Rajbhandari et al. 2020, Fig. 1: mixed-precision Adam keeps 2 (fp16 params) + 2
        # (grads) + 12 (fp32 params, momentum, variance) bytes per parameter.
        (0, 16 * PSI),
        (1, 4 * PSI + 12 * PSI // 8),
        (2, 2 * PSI + 14 * PSI // 8),
        (3, 16 * PSI // 8),
    ],
)
def test_zero_model_states(stage, expected):
    w = train(
        "llama-2-7b", gradient_accumulation_steps=2, parallelism={"data": 8, "zero_stage": stage}
    )
    # The persistent model states (the optimizer step adds fp32 gradients and temporaries on
    # top, see tests/trace/test_oracle.py).
    (st,) = statics_for(deploy(w), resolve_model(w.model))
    total = st.weights_bytes + st.gradient_bytes + st.master_bytes + st.optimizer_bytes
    assert total == expected
