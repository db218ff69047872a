"""The vLLM calibration (vrambudget/core/serving/calibration.py): fresh against research/, and the
request default is a calibrated version."""

from __future__ import annotations

import msgspec

from vrambudget.core.spec import BudgetRequest

H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}


# --------------------------------------------------------------------------- wire rules --

LLAMA = {"source": "preset", "id": "llama-3.1-8b"}


def test_calibration_file_is_fresh():
    from research.calibrate_vllm import main

    assert main(["--check"]) == 0


def test_request_default_version_is_a_calibrated_one():
    from vrambudget.core.serving.calibration import (
        DEFAULT_ENGINE_VERSION,
        ENGINE_VERSIONS,
    )

    assert DEFAULT_ENGINE_VERSION in ENGINE_VERSIONS
    w = msgspec.convert(
        {"workloads": [{"kind": "llm_serving", "model": LLAMA}], "device": H100}, BudgetRequest
    ).workloads[0]
    assert w.engine_version == DEFAULT_ENGINE_VERSION
