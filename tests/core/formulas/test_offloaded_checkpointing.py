"""``checkpointing: offloaded``: full recomputation whose kept layer inputs wait in host RAM
(Unsloth's ``Unsloth_Offloaded_Gradient_Checkpointer``, torchtune's ``OffloadActivations``);
hand counts on Llama 3.1 8B LoRA at 32,768 tokens (one layer input: 32,768 x 4,096 x 2 =
268,435,456 B)."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core.catalog import preset_arch
from vrambudget.core.deployed import deploy
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.formulas.activations import (
    OFFLOADED_BACK_PART,
    device_dims,
    offloaded_inputs_bytes,
    training_activations,
)
from vrambudget.core.layout import stages
from vrambudget.core.spec import BudgetRequest, TrainingWorkload

INPUT = 32_768 * 4_096 * 2  # one layer's bf16 input


def _workload(checkpointing: str) -> dict:
    return {
        "kind": "training",
        "model": {"source": "preset", "id": "llama-3.1-8b"},
        "micro_batch_size": 1,
        "sequence_length": 32_768,
        "method": {"kind": "lora", "rank": 16},
        "checkpointing": checkpointing,
    }


def test_offloading_keeps_one_layer_input_on_the_device():
    arch = preset_arch("llama-3.1-8b")
    stage = stages(arch, 1)[0]
    acts = {}
    for ck in ("full", "offloaded"):
        w = deploy(msgspec.convert(_workload(ck), TrainingWorkload))
        total, one_layer, parts = training_activations(w, arch, stage, device_dims(arch, 1, 1))
        acts[ck] = (total, one_layer, dict(parts))
    full, off = acts["full"], acts["offloaded"]
    assert full[1] == off[1]  # the same recomputed layer
    assert full[2]["layer inputs (full recomputation)"] == 32 * INPUT == 8_589_934_592
    assert "layer inputs (full recomputation)" not in off[2]
    assert off[2][OFFLOADED_BACK_PART] == INPUT
    assert full[0] - off[0] == 31 * INPUT == 8_321_499_136
    w = deploy(msgspec.convert(_workload("offloaded"), TrainingWorkload))
    assert offloaded_inputs_bytes(w, arch, stage, 2) == 8_589_934_592
    w_full = deploy(msgspec.convert(_workload("full"), TrainingWorkload))
    assert offloaded_inputs_bytes(w_full, arch, stage, 2) == 0


def test_the_answer_puts_the_inputs_in_host_ram_and_frees_the_device():
    """The host budget lists the 32 inputs (8,589,934,592 B); at the backward's start (the
    peak) the device holds none of them, so it sits 32 inputs lower, less the allocator's
    fragmentation share that their absence also removes."""

    def answer(ck: str):
        r = msgspec.convert(
            {"workloads": [_workload(ck)], "headroom": {"fraction": 0.0}}, BudgetRequest
        )
        return estimate(r.workloads, r.device, r.headroom, software=r.software)

    full, off = answer("full"), answer("offloaded")
    host = {i.item: i.bytes for i in off.host_ram.items}
    key = "llama-3.1-8b: offloaded layer inputs (activation offloading, pinned)"
    assert host[key] == 8_589_934_592
    assert key not in {i.item for i in full.host_ram.items}
    assert off.host_ram.total_bytes == full.host_ram.total_bytes + 8_589_934_592

    def acts(b) -> int:
        return next(x.bytes for x in b.devices[0].lines if x.component.value == "activations")

    assert full.devices[0].peak_phase == off.devices[0].peak_phase == "backward_start"
    assert acts(full) - acts(off) == 32 * INPUT


@pytest.mark.parametrize("code", ["framework", "builtin"])
def test_the_trace_tier_refuses_offloading_naming_the_field(code):
    """Through the trace tier's entry with either program: the framework's own code cannot run
    it, and the built-in builders refuse it by field (fake tensors have no host memory)."""
    from vrambudget.trace.engine import trace_budget
    from vrambudget.workloads.hf.program import framework_unsupported

    w = {**_workload("offloaded"), "model": {"source": "preset", "id": "qwen2.5-0.5b"}}
    w["sequence_length"] = 64
    request = msgspec.convert(
        {"method": "trace", "trace": {"code": code}, "workloads": [w]}, BudgetRequest
    )
    assert framework_unsupported(request.workloads[0]) is not None
    with pytest.raises(InvalidWorkload) as e:
        trace_budget(request)
    assert e.value.field == "workloads[0].checkpointing"


def test_host_ram_follows_the_length_under_offloading():
    """Budgets that differ only in length share one cached host answer, except where host RAM
    holds the offloaded inputs: 16,384 tokens offload half of 32,768's."""

    def host(seq: int) -> int:
        r = msgspec.convert(
            {"workloads": [{**_workload("offloaded"), "sequence_length": seq}]}, BudgetRequest
        )
        items = estimate(r.workloads, r.device, r.headroom, software=r.software).host_ram.items
        return next(i.bytes for i in items if "offloaded layer inputs" in i.item)

    assert host(32_768) == 8_589_934_592
    assert host(16_384) == 4_294_967_296
