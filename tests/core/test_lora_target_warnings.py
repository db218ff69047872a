"""LoRA target names that match nothing (vrambudget/core/budget/inputs.py): PEFT refuses a
config none of whose names match, and silently skips a name when another one matches
(peft 0.17.1 tuners/tuners_utils.py BaseTuner.inject_adapter); the answer says which."""

from __future__ import annotations

import msgspec

from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest


def _warnings(targets: list[str]) -> tuple[str, ...]:
    req = msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "training",
                    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
                    "method": {"kind": "lora", "target_modules": targets},
                }
            ]
        },
        BudgetRequest,
    )
    return tuple(estimate(req.workloads, req.device, req.headroom).warnings)


def test_a_name_that_matches_nothing_beside_one_that_matches_is_named() -> None:
    (warning,) = [w for w in _warnings(["q_proj", "query_key_value"]) if "LoRA" in w]
    assert warning.startswith(
        "LoRA target module(s) query_key_value match no projection of this model and get no "
        "adapter (its projections: down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, "
        "v_proj)"
    )


def test_no_name_matching_says_peft_refuses_it() -> None:
    (warning,) = [w for w in _warnings(["query_key_value"]) if "LoRA" in w]
    assert "adapters, gradients and optimizer state are 0" in warning
    assert "PEFT refuses such a config" in warning


def test_names_that_all_match_say_nothing() -> None:
    assert not [w for w in _warnings(["q_proj", "v_proj", "down_proj"]) if "LoRA" in w]
