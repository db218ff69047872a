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


def test_release_table_is_fresh():
    """vrambudget/core/data/vllm_releases.json is research/vllm_releases.py's output of
    research/data/vllm_versions.json (what was read from each release's source)."""
    from research.vllm_releases import main

    assert main(["--check"]) == 0


def test_request_default_version_is_the_newest_modelled_release():
    from vrambudget.core.serving.calibration import CALIBRATED_VERSION, vllm_releases
    from vrambudget.core.serving.releases import engine_release

    w = msgspec.convert(
        {"workloads": [{"kind": "llm_serving", "model": LLAMA}], "device": H100}, BudgetRequest
    ).workloads[0]
    assert w.engine_version is None
    newest = max(vllm_releases(), key=lambda r: tuple(int(x) for x in r.version.split(".")))
    assert engine_release("vllm", None).modelled == newest.version
    # the release the constants were fitted on is itself a modelled release
    assert CALIBRATED_VERSION in {r.version for r in vllm_releases()}
