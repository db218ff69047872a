"""torch's foreach AdamW step before and after pytorch#104898 (2.1): ``denom =
torch._foreach_add(exp_avg_sq_sqrt, eps)`` out of place kept two state-sized intermediates per
parameter; from 2.1 the offset is in place and one remains."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.workloads import preset_body, training_statics
from vrambudget.core.spec import Software
from vrambudget.core.stack import resolve_stack

QWEN_05B = 494_032_768  # Qwen2.5 0.5B parameters (the formulas' worked number)


def _step_temporaries(torch: str, implementation: str = "foreach") -> tuple[int, list[str]]:
    software = {"framework": "transformers", "torch_version": torch}
    body = preset_body(
        "training",
        "qwen2.5-0.5b",
        software=software,
        optimizer={"name": "adamw", "implementation": implementation},
        method={"kind": "full"},
    )
    st = training_statics(body)
    stack = resolve_stack(msgspec.convert(software, Software))
    said = [b.assumed for b in stack.behaviours if b.name == "optimizer_step_intermediates"]
    return st.step_temporary_bytes, said


@pytest.mark.parametrize(("torch", "intermediates"), [("2.0.1", 2), ("2.1.0", 1), ("2.6.0", 1)])
def test_foreach_adamw_intermediates_by_torch_release(torch: str, intermediates: int) -> None:
    """fp32 state (master_fp32): 494,032,768 x 4 B per intermediate."""
    step, said = _step_temporaries(torch)
    assert step == QWEN_05B * 4 * intermediates
    (text,) = said
    assert ("two state-sized" in text) == (intermediates == 2)


def test_the_for_loop_step_is_unchanged() -> None:
    """The single-tensor step's two temporaries of the largest tensor, either release."""
    assert _step_temporaries("2.0.1", "for_loop")[0] == _step_temporaries("2.6.0", "for_loop")[0]
