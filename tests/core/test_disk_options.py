"""The disk budget's optional copies (``disk.conversion_copy``, ``disk.update_copy``): each is
counted or not as the request says, every engine path follows the same options, and the
defaults answer what the service answered before the options existed (3 x the files for a
safetensors checkpoint; the file once for GGUF and for an image-generation pipeline)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from vrambudget.core.catalog import preset
from vrambudget.core.estimate import estimate
from vrambudget.core.result import DiskBudget
from vrambudget.core.spec import BudgetRequest
from vrambudget.core.units import MiB
from vrambudget.service.app import create_app

LLAMA = {"source": "preset", "id": "llama-3.1-8b"}
H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}
# The published safetensors index of meta-llama/Llama-3.1-8B: "total_size": 16060522496.
LLAMA_FILES = 16_060_522_496

INFERENCE = {"kind": "inference", "model": LLAMA}
VLLM = {"kind": "llm_serving", "engine": "vllm", "model": LLAMA}
GGUF = {
    "kind": "llm_serving",
    "engine": "llama_cpp",
    "engine_version": "b6500",
    "model": LLAMA,
    "gguf": {"n_ctx": 8192},
}
# tests/core/serving/test_gguf.py: Q4_K_M of Llama 3.1 8B, the sum of its tensors' bytes.
GGUF_FILE = 4_912_898_048
SD15 = {
    "kind": "image_generation",
    "pipeline": {"source": "preset", "id": "sd-1.5"},
    "height": 512,
    "width": 512,
}
# tests/core/diffusion/test_budget.py: the fp16 safetensors of SD 1.5's UNet, text encoder and
# VAE, 2 B per parameter.
SD15_FILES = (859_520_964 + 83_653_863 + 123_060_480) * 2

BOTH = {"conversion_copy": True, "update_copy": True}
NONE = {"conversion_copy": False, "update_copy": False}


def _disk(workload: dict[str, Any], disk: dict[str, Any] | None = None) -> DiskBudget:
    body: dict[str, Any] = {"workloads": [workload], "device": H100}
    if disk is not None:
        body["disk"] = disk
    req = msgspec.convert(body, BudgetRequest)
    return estimate(req.workloads, req.device, req.headroom, None, req.software, req.disk).disk


def _items(d: DiskBudget) -> dict[str, int]:
    return {i.item.split(": ", 1)[-1]: i.bytes for i in d.items}


def test_the_preset_files_are_the_published_total() -> None:
    assert preset("llama-3.1-8b").checkpoint.total_size_bytes == LLAMA_FILES


@pytest.mark.parametrize(
    ("disk", "copies"),
    [
        (None, 2),  # the defaults: a conversion copy and an update copy
        ({}, 2),
        (BOTH, 2),
        ({"conversion_copy": False}, 1),
        ({"update_copy": False}, 1),
        (NONE, 0),
    ],
)
@pytest.mark.parametrize("workload", [INFERENCE, VLLM], ids=["inference", "vllm"])
def test_safetensors_copies_follow_the_options(
    workload: dict[str, Any], disk: dict[str, Any] | None, copies: int
) -> None:
    d = _disk(workload, disk)
    assert d.total_bytes == (1 + copies) * LLAMA_FILES
    items = _items(d)
    assert items["model files"] == LLAMA_FILES
    conversion = (disk or {}).get("conversion_copy", True)
    update = (disk or {}).get("update_copy", True)
    assert ("temporary conversion space" in items) == conversion
    assert ("spare copy for updates" in items) == update


def test_the_default_is_three_copies_of_the_files_by_hand() -> None:
    # docs/COMPONENTS.md, worked example 1: disk 3 x 16,060,522,496 B.
    assert _disk(INFERENCE).total_bytes == 48_181_567_488 == 3 * LLAMA_FILES
    assert _disk(INFERENCE, NONE).total_bytes == 16_060_522_496


def test_a_training_checkpoint_is_not_an_optional_copy() -> None:
    train = {
        "kind": "training",
        "model": LLAMA,
        "method": {"kind": "lora", "rank": 16},
    }
    default, bare = _disk(train), _disk(train, NONE)
    checkpoint = _items(default)["training checkpoint"]
    assert checkpoint > 0 and _items(bare)["training checkpoint"] == checkpoint
    assert default.total_bytes == 3 * LLAMA_FILES + checkpoint
    assert bare.total_bytes == LLAMA_FILES + checkpoint


@pytest.mark.parametrize(
    ("workload", "files"), [(GGUF, GGUF_FILE), (SD15, SD15_FILES)], ids=["gguf", "sd-1.5"]
)
@pytest.mark.parametrize(
    ("disk", "copies"),
    [(None, 0), (NONE, 0), ({"update_copy": True}, 1), ({"conversion_copy": True}, 1), (BOTH, 2)],
)
def test_a_gguf_file_or_a_pipeline_counts_copies_only_when_asked(
    workload: dict[str, Any], files: int, disk: dict[str, Any] | None, copies: int
) -> None:
    d = _disk(workload, disk)
    assert d.total_bytes == (1 + copies) * files
    assert sum(1 for i in d.items if i.bytes == files) == 1 + copies


def test_the_api_takes_the_options_and_names_a_bad_one() -> None:
    with TestClient(create_app()) as client:
        body = {"workloads": [INFERENCE], "device": H100, "disk": NONE}
        r = client.post("/v1/budgets", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["disk"]["total_bytes"] == LLAMA_FILES
        r = client.post("/v1/budgets", json={**body, "disk": {"conversion_copy": "no"}})
        assert r.status_code in (400, 422)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "disk.conversion_copy" in r.text
        r = client.post("/v1/budgets", json={**body, "disk": {"spare_copies": 1}})
        assert r.status_code in (400, 422) and "spare_copies" in r.text


def test_a_cluster_request_from_a_fit_uses_the_fits_disk_options() -> None:
    fit = {"workloads": [VLLM], "devices": [H100], "device_counts": [1], "disk": NONE}
    body = {
        "source": {"from": "fit", "request": fit, "gpu_id": "h100-sxm5-80gb", "device_count": 1}
    }
    with TestClient(create_app()) as client:
        r = client.post("/v1/cluster-requests", json=body)
        assert r.status_code == 200, r.text
        storage = next(ln for ln in r.json()["lines"] if ln["resource"] == "ephemeral-storage")
        # the files alone, rounded up to MiB: 16,060,522,496 B = 15,316.5 MiB -> 15,317Mi
        assert -(-LLAMA_FILES // MiB) == 15_317
        assert storage["quantity"] == "15317Mi"
