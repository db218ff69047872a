"""Every input dimension that multiplies the work of a request has a limit, and the limit is
in the published schema (issue 13: 10^6 layers x 65,536 stages answered 411 MB after 44 s)."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core import hf_config
from vrambudget.core.fit import FitRequest
from vrambudget.core.spec import BudgetRequest
from vrambudget.core.spec.limits import (
    MAX_DEVICES,
    MAX_FIT_DEVICE_COUNT,
    MAX_LAYERS,
    MAX_SOLVED_DEVICE_COUNT,
    MAX_STAGES,
)


def _schema() -> dict:
    (_, defs) = msgspec.json.schema_components([BudgetRequest, FitRequest])
    return defs


def test_limits_are_published_in_the_schema():
    defs = _schema()
    assert defs["DimensionsModel"]["properties"]["num_layers"]["maximum"] == MAX_LAYERS
    assert defs["Parallelism"]["properties"]["pipeline"]["maximum"] == MAX_STAGES
    fit = defs["FitRequest"]["properties"]
    assert fit["max_device_count"]["maximum"] == MAX_SOLVED_DEVICE_COUNT
    assert fit["device_counts"]["items"]["maximum"] == MAX_FIT_DEVICE_COUNT
    assert fit["device_counts"]["maxItems"] == 16
    devices = fit["devices"]["anyOf"][0]
    assert devices["maxItems"] == MAX_DEVICES
    assert defs["BudgetRequest"]["properties"]["workloads"]["maxItems"] == 16


def test_the_hf_config_layer_limit_is_the_same_number():
    meta = hf_config.LayerCount.__metadata__[0]  # type: ignore[attr-defined]
    assert meta.le == MAX_LAYERS


def _dims(layers: int) -> dict:
    return {
        "source": "dimensions",
        "hidden_size": 4096,
        "num_layers": layers,
        "num_attention_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"workloads": [{"kind": "training", "model": _dims(1_000_000)}]},
            "num_layers",
        ),
        (
            {
                "workloads": [
                    {"kind": "training", "model": _dims(1024), "parallelism": {"pipeline": 65536}}
                ]
            },
            "pipeline",
        ),
    ],
)
def test_the_issue_examples_are_refused_at_decoding(body: dict, field: str):
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.json.decode(msgspec.json.encode(body), type=BudgetRequest)


def test_fit_multipliers_are_refused_at_decoding():
    w = {"kind": "inference", "model": {"source": "preset", "id": "llama-3.1-8b"}}
    dev = {"source": "catalog", "id": "h100-sxm5-80gb"}
    for body, field in (
        ({"workloads": [w], "devices": [dev] * (MAX_DEVICES + 1)}, "devices"),
        ({"workloads": [w], "max_device_count": 4096}, "max_device_count"),
        ({"workloads": [w], "device_counts": [4096]}, "device_counts"),
    ):
        with pytest.raises(msgspec.ValidationError, match=field):
            msgspec.json.decode(msgspec.json.encode(body), type=FitRequest)
    for body in (
        {"workloads": [w], "devices": [dev] * MAX_DEVICES},
        {"workloads": [w], "max_device_count": MAX_SOLVED_DEVICE_COUNT},
        {"workloads": [w], "device_counts": [MAX_FIT_DEVICE_COUNT]},
    ):
        msgspec.json.decode(msgspec.json.encode(body), type=FitRequest)  # at the limit: fine
