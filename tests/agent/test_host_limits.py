"""What the agent refuses at submission so that the host itself is safe, and how it splits the
CPU memory cap (vrambudget/agent/limits.py): jobs run together (``overlap``) share the cap, a
quality check's host memory is bounded on every host, and ``weights: checkpoint`` needs the
checkpoint on this host. In-process (the agent app under Litestar's test client; no child runs:
the worker is replaced by one that never takes a probe)."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

import vrambudget.agent.handlers as handlers
from tests.support.workloads import INFER, TRAIN
from vrambudget.agent.api import create_agent_app
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.limits import (
    WorkloadRefused,
    cpu_memory_limit,
    cpu_memory_limits,
    estimated_bytes,
    quality_bytes,
    validate_workload,
)
from vrambudget.agent.overlap import ProbeGroup, member_request
from vrambudget.agent.settings import AgentSettings
from vrambudget.core.probe_report import ProbeRequest
from vrambudget.core.resolve import resolve_model
from vrambudget.core.spec import InferenceWorkload, PresetModel

AUTH = {"Authorization": "Bearer t"}
GiB = 1 << 30
QWEN = {"source": "preset", "id": "qwen2.5-0.5b"}
BIG = {  # 1.5B parameters in fp32: several GiB each
    "kind": "inference",
    "model": {"source": "preset", "id": "qwen2.5-1.5b"},
    "precision": {"weights": "fp32", "compute": "fp32"},
    "batch_size": 1,
    "prompt_tokens": 64,
    "generated_tokens": 4,
}


@pytest.fixture
def idle_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    async def idle(*_: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(handlers, "_worker", idle)
    yield


def _settings(tmp_path: Path, **kw: Any) -> AgentSettings:
    return AgentSettings(data_dir=tmp_path / "data", tokens=(b"t",), **kw)


def _submit(settings: AgentSettings, body: dict[str, Any], *, cuda: bool = False) -> Any:
    app = create_agent_app(settings)
    with TestClient(app) as client:
        app.state.agent.cuda = cuda
        return client.post("/v1/probes", json=body, headers=AUTH)


def _problem(r: Any) -> tuple[str, str]:
    """(field, message) of a 422 problem."""
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    return error["field"], error["message"]


# ------------------------------------------------------------------------------- overlap --


def test_jobs_that_together_pass_the_cpu_cap_are_refused_on_overlap(
    tmp_path: Path, idle_worker: None
) -> None:
    req = msgspec.convert({"workload": BIG, "overlap": [BIG, BIG]}, ProbeRequest)
    one = estimated_bytes(req)
    assert one is not None
    # each job fits the cap alone; three of them do not
    cap = 2 * one + one // 2
    r = _submit(_settings(tmp_path, cpu_memory_limit_bytes=cap), msgspec.to_builtins(req))
    field, message = _problem(r)
    assert field == "$.overlap"
    assert f"add up to {3 * one} bytes ({one} + {one} + {one})" in message
    assert f"CPU memory cap of {cap} bytes" in message
    # two of them fit: accepted
    two = msgspec.structs.replace(req, overlap=req.overlap[:1])
    r = _submit(_settings(tmp_path, cpu_memory_limit_bytes=cap), msgspec.to_builtins(two))
    assert r.status_code == 202, r.text
    # a GPU host's jobs are on the device: no host cap applies to them
    r = _submit(
        _settings(tmp_path, cpu_memory_limit_bytes=cap), msgspec.to_builtins(req), cuda=True
    )
    assert r.status_code != 422 or _problem(r)[0] != "$.overlap"


def test_each_child_gets_its_share_of_the_cap(tmp_path: Path) -> None:
    # three tiny inference jobs: their estimates (and so the floor below) do not move with the
    # training classes' error bands, whose headroom is in a training job's estimate
    req = msgspec.convert({"workload": INFER, "overlap": [INFER, INFER]}, ProbeRequest)
    jobs = [req, member_request(req, 0), member_request(req, 1)]
    own = [cpu_memory_limit(_settings(tmp_path, cpu_memory_limit_bytes=64 * GiB), j) for j in jobs]
    # tiny jobs: each its own limit, the 4 GiB floor (max(4 GiB, 2 x estimate + 2 GiB))
    assert own == [4 * GiB] * 3
    assert cpu_memory_limits(_settings(tmp_path, cpu_memory_limit_bytes=64 * GiB), jobs) == own
    # a 6 GiB cap: 3 x 4 GiB is over it; each gets 6 GiB x 4 / 12 = 2 GiB
    six = _settings(tmp_path, cpu_memory_limit_bytes=6 * GiB)
    assert [cpu_memory_limit(six, j) for j in jobs] == [4 * GiB] * 3  # alone: 4 GiB each
    assert cpu_memory_limits(six, jobs) == [2 * GiB] * 3
    # uneven shares: limits 4 GiB and 7 GiB under a 5 GiB cap -> 5 x 4/11 and 5 x 7/11
    big = msgspec.convert({"workload": INFER, "overlap": [BIG]}, ProbeRequest)
    big_jobs = [big, member_request(big, 0)]
    wide = _settings(tmp_path, cpu_memory_limit_bytes=1 << 50)
    (small_own, big_own) = (cpu_memory_limit(wide, j) for j in big_jobs)
    assert small_own == 4 * GiB and big_own is not None
    five = _settings(tmp_path, cpu_memory_limit_bytes=5 * GiB)
    split = cpu_memory_limits(five, big_jobs)
    # alone each is min(cap, own): 4 GiB and 5 GiB, together 9 GiB
    assert split == [5 * GiB * 4 * GiB // (9 * GiB), 5 * GiB * 5 * GiB // (9 * GiB)]
    assert sum(x or 0 for x in split) <= 5 * GiB
    # no cap: no limit
    assert cpu_memory_limits(_settings(tmp_path, cpu_memory_limit_bytes=0), jobs) == [None] * 3


def test_the_group_hands_each_child_its_limit(tmp_path: Path) -> None:
    req = msgspec.convert({"workload": INFER, "overlap": [INFER, INFER]}, ProbeRequest)
    six = _settings(tmp_path, cpu_memory_limit_bytes=6 * GiB)
    group = ProbeGroup(req, ChildSettings(), None, lambda jobs: cpu_memory_limits(six, jobs))
    limits = [p._process._args[3] for p in group._processes]  # type: ignore[attr-defined]
    assert limits == [2 * GiB] * 3
    # a training job among them: its share follows its own limit (its estimate carries the
    # training band's headroom), and the shares never pass the cap
    mixed = msgspec.convert({"workload": INFER, "overlap": [TRAIN, INFER]}, ProbeRequest)
    jobs = [mixed, member_request(mixed, 0), member_request(mixed, 1)]
    group = ProbeGroup(mixed, ChildSettings(), None, lambda js: cpu_memory_limits(six, js))
    limits = [p._process._args[3] for p in group._processes]  # type: ignore[attr-defined]
    assert limits == cpu_memory_limits(six, jobs)
    assert sum(limits) <= 6 * GiB and limits[1] >= limits[0] == limits[2]


# ------------------------------------------------------------------------------- quality --


def _quality(sequences: int, tokens: int) -> ProbeRequest:
    return msgspec.convert(
        {
            "workload": {**INFER, "model": QWEN},
            "quality": {
                "reference": {"weights": "fp32"},
                "candidates": [{"label": "bf16", "precision": {"weights": "bf16"}}],
                "max_sequences": sequences,
                "sequence_tokens": tokens,
            },
        },
        ProbeRequest,
    )


@pytest.mark.parametrize("cuda", [False, True])
def test_a_quality_check_over_the_host_cap_is_refused_on_every_host(
    tmp_path: Path, idle_worker: None, cuda: bool
) -> None:
    arch = resolve_model(msgspec.convert(QWEN, PresetModel))
    models = 2 * 4 * arch.num_params  # fp32 master + one candidate
    per_sequence = 8192 * arch.vocab_size * 4  # float32 logits of 8192 positions
    req = _quality(1024, 8192)
    assert quality_bytes(req) == models + 1024 * per_sequence
    cap = models + 10 * per_sequence + 1  # room for 10 sequences of 8192 tokens
    r = _submit(
        _settings(tmp_path, cpu_memory_limit_bytes=cap), msgspec.to_builtins(req), cuda=cuda
    )
    field, message = _problem(r)
    assert field == "$.quality.max_sequences"
    assert f"would hold {models + 1024 * per_sequence} bytes" in message
    assert f"host-memory cap of {cap} bytes" in message and message.endswith("must be <= 10")
    # 10 sequences fit, on either host
    with pytest.raises(WorkloadRefused):
        validate_workload(_settings(tmp_path, cpu_memory_limit_bytes=cap), req, cpu=not cuda)
    validate_workload(
        _settings(tmp_path, cpu_memory_limit_bytes=cap), _quality(10, 8192), cpu=not cuda
    )
    # a cap under the two models: no sequence count helps
    with pytest.raises(WorkloadRefused) as err:
        validate_workload(_settings(tmp_path, cpu_memory_limit_bytes=models), req, cpu=not cuda)
    assert err.value.field == "$.quality" and "weights alone do not fit" in err.value.message


# ------------------------------------------------------------------------------- weights --

HUB = {"source": "hub", "id": "vrambudget-tests/not-on-this-host"}


def _checkpoint(directory: Path) -> None:
    """A complete checkpoint as find_checkpoint checks it: a config.json and one safetensors
    file (8-byte header length, the JSON header, the data)."""
    directory.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 128,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config))
    header = json.dumps(
        {"model.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}}
    ).encode()
    (directory / "model.safetensors").write_bytes(
        struct.pack("<Q", len(header)) + header + bytes(256)
    )


def test_weights_checkpoint_without_one_on_the_host_is_refused(
    tmp_path: Path, idle_worker: None
) -> None:
    body = {"workload": {**INFER, "model": HUB}, "weights": "checkpoint"}
    models = tmp_path / "models"
    models.mkdir()
    settings = _settings(tmp_path, model_dirs=(models,))
    field, message = _problem(_submit(settings, body))
    assert field == "$.weights"
    assert message.startswith("no usable checkpoint: vrambudget-tests/not-on-this-host is not")
    assert str(models) in message
    # ... and for an overlapping job's model too (the probe's weights apply to every job)
    mixed = {"workload": INFER, "overlap": [{**INFER, "model": HUB}], "weights": "checkpoint"}
    assert _problem(_submit(settings, mixed))[0] == "$.weights"
    # auto and synthetic fall back to synthetic weights: accepted
    assert _submit(settings, {**body, "weights": "auto"}).status_code == 202
    # with the checkpoint in a model directory: accepted
    _checkpoint(models / "not-on-this-host")
    assert _submit(settings, body).status_code == 202


def test_the_checkpoint_lookup_imports_no_torch(tmp_path: Path) -> None:
    """The agent process never imports torch (docs/ARCHITECTURE.md): the check runs there."""
    code = (
        "import sys, msgspec\n"
        "from vrambudget.agent.limits import validate_workload, WorkloadRefused\n"
        "from vrambudget.agent.settings import AgentSettings\n"
        "from vrambudget.core.probe_report import ProbeRequest\n"
        f"req = msgspec.convert({{'workload': {{**{INFER!r}, 'model': {HUB!r}}}, "
        "'weights': 'checkpoint'}, ProbeRequest)\n"
        "try:\n"
        f"    validate_workload(AgentSettings(model_dirs=({str(tmp_path)!r},)), req, cpu=True)\n"
        "except WorkloadRefused as e:\n"
        "    print(e.field)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["$.weights", "False"], out.stderr


def test_a_hub_model_s_quality_check_is_bounded_from_the_host_s_checkpoint(
    tmp_path: Path,
) -> None:
    """A Hub model is resolved in the child; the bound reads the host's copy: one stored
    tensor of 64 elements, a 256-token vocabulary (``_checkpoint``)."""
    models = tmp_path / "models"
    _checkpoint(models / "not-on-this-host")
    req = msgspec.structs.replace(
        _quality(1024, 8192),
        workload=msgspec.convert({**INFER, "model": HUB}, InferenceWorkload),
    )
    per_sequence = 8192 * 256 * 4
    cap = 2 * 4 * 64 + 3 * per_sequence + 1
    settings = _settings(tmp_path, cpu_memory_limit_bytes=cap, model_dirs=(models,))
    with pytest.raises(WorkloadRefused) as err:
        validate_workload(settings, req, cpu=False)
    assert err.value.field == "$.quality.max_sequences"
    assert f"would hold {512 + 1024 * per_sequence} bytes" in err.value.message
    assert err.value.message.endswith("must be <= 3")
    # not on the host: the child fetches the config; nothing to bound it with here
    validate_workload(_settings(tmp_path, cpu_memory_limit_bytes=cap), req, cpu=False)
