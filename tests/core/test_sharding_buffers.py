"""What of the sharding buffers is allocated at each moment of a step (the ``sharding_buffers``
behaviour), and which of them torch's allocator sees."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from research.corpus import _device_view
from vrambudget.core.components import Component as C
from vrambudget.core.estimate import estimate
from vrambudget.core.formulas import communication_buffers
from vrambudget.core.spec import BudgetRequest

# Qwen2.5-0.5B, bf16 full fine-tune over two FULL_SHARD ranks: 494,032,768 trainable
# parameters (the tied embedding counted once); a decoder layer holds q and o 896 x 896, k and
# v 896 x 128 (q, k, v with biases: 896 + 128 + 128), gate/up/down 3 x 896 x 4,864 and two
# norms of 896: 14,912,384 (its config.json: hidden 896, 2 KV heads of 64, intermediate 4,864).
SHARDED = {
    "kind": "training",
    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
    "precision": {"weights": "bf16"},
    "mixed_precision": "pure",
    "micro_batch_size": 1,
    "sequence_length": 512,
    "method": {"kind": "full"},
    "parallelism": {"data": 2, "zero_stage": 3},
}
NCCL = 544_000_000  # one 2-rank communicator (NVIDIA/nccl#964)
REDUCE = 494_032_768 * 2  # min(5e8, trainable) x 2 B bf16 gradients
LAYER = 2 * 896 * 896 + 2 * 896 * 128 + (896 + 128 + 128) + 3 * 896 * 4864 + 2 * 896
assert LAYER == 14_912_384
GATHERED = (LAYER + 50_000_000) * 2  # largest layer + 5e7 prefetch elements, bf16


def _budget(software: dict[str, Any]):
    body = {"workloads": [SHARDED], "headroom": {"fraction": 0.0}, "software": software}
    r = msgspec.convert(body, BudgetRequest)
    return estimate(r.workloads, r.device, r.headroom, software=r.software)


def _phases(b) -> dict[str, int]:
    return {p.name: p.total_bytes for p in b.devices[0].phases}


@pytest.mark.parametrize(
    ("name", "deepspeed", "zero", "live"),
    [
        ("NCCL data-parallel communicator (2 ranks)", False, 3, True),
        ("DDP gradient buckets (a copy of the gradients)", False, 0, True),
        (communication_buffers.REDUCE_BUCKET_PART, False, 3, False),  # FSDP
        (communication_buffers.REDUCE_BUCKET_PART, True, 3, True),  # ZeRO-3: allocated once
        (communication_buffers.REDUCE_BUCKET_PART, True, 2, False),  # ZeRO-1/2: released
        (communication_buffers.GATHERED_PART, False, 3, False),
        (communication_buffers.GATHERED_PART, True, 3, False),
    ],
)
def test_what_is_allocated_at_the_optimizer_step(
    name: str, deepspeed: bool, zero: int, live: bool
) -> None:
    assert communication_buffers.live_at_step(name, deepspeed, zero) is live


def test_fsdp_frees_its_buffers_before_the_step_deepspeed_keeps_its_bucket() -> None:
    """Forward and backward hold the same buffers under either; at the optimizer step FSDP
    holds only its NCCL communicator, DeepSpeed its reduce bucket too: exactly 988,065,536 B
    more (494,032,768 x 2 B)."""
    fsdp, ds = _budget({}), _budget({"libraries": {"deepspeed": "0.16.0"}})
    a, b = _phases(fsdp), _phases(ds)
    for moment in ("forward", "backward_start", "backward_end"):
        assert a[moment] == b[moment]
    assert b["optimizer_step"] - a["optimizer_step"] == REDUCE == 988_065_536
    # The peak (backward) carries all three parts.
    line = next(x for x in fsdp.devices[0].lines if x.component is C.COMMUNICATION_BUFFERS)
    assert [(p.name, p.bytes) for p in line.parts] == [
        ("NCCL data-parallel communicator (2 ranks)", NCCL),
        (communication_buffers.REDUCE_BUCKET_PART, REDUCE),
        (communication_buffers.GATHERED_PART, GATHERED),
    ]
    names = {x.name: x.assumed for x in fsdp.stack.behaviours}
    assert "FSDP frees" in names["sharding_buffers"]
    assert "DeepSpeed" in {x.name: x.assumed for x in ds.stack.behaviours}["sharding_buffers"]


def test_the_torch_views_keep_the_sharding_buffers_and_leave_out_nccl() -> None:
    """torch.cuda.max_memory_allocated() counts the reduce and gather buffers (torch tensors)
    but neither the CUDA context nor NCCL's communicator (cudaMalloc'd by NCCL)."""
    b = _budget({})
    d = b.devices[0]
    lines = {x.component: x.bytes for x in d.lines}
    allocated = d.total_bytes - lines[C.CUDA_CONTEXT] - NCCL - lines[C.ALLOCATOR_OVERHEAD]
    assert _device_view(b, "torch_max_allocated") == allocated
    assert _device_view(b, "torch_max_reserved") == allocated + lines[C.ALLOCATOR_OVERHEAD]
    assert lines[C.COMMUNICATION_BUFFERS] == NCCL + REDUCE + GATHERED
