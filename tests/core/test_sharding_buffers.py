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
GATHERED = (LAYER + 50_000_000) * 2  # DeepSpeed: largest layer + 5e7 prefetch elements, bf16
# FSDP: the root unit -- the tied 151,936 x 896 embedding (the LM head is the same tensor) and
# the final norm of 896 -- with the block being computed; in backward the next block too.
ROOT = 151_936 * 896 + 896
assert ROOT == 136_135_552
FSDP_GATHERED = (ROOT + LAYER) * 2
assert FSDP_GATHERED == 302_095_872
PREFETCH = LAYER * 2


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
        (communication_buffers.FSDP_GATHERED_PART, False, 3, False),
        (communication_buffers.FSDP_PREFETCH_PART, False, 3, False),
    ],
)
def test_what_is_allocated_at_the_optimizer_step(
    name: str, deepspeed: bool, zero: int, live: bool
) -> None:
    assert communication_buffers.live_at_step(name, deepspeed, zero) is live


def test_fsdp_frees_its_buffers_before_the_step_deepspeed_keeps_its_bucket() -> None:
    """In forward and backward the two gather differently: DeepSpeed its largest layer and a
    prefetch bucket (29,824,768 + 100,000,000 B), FSDP whole units -- the root, which it keeps
    unsharded from the forward to the end of the backward, and the block being computed
    (302,095,872 B), plus in backward the next block it prefetches (29,824,768 B). At the
    optimizer step FSDP holds only its NCCL communicator, DeepSpeed its reduce bucket too:
    exactly 988,065,536 B more (494,032,768 x 2 B)."""
    fsdp, ds = _budget({}), _budget({"libraries": {"deepspeed": "0.16.0"}})
    a, b = _phases(fsdp), _phases(ds)
    assert a["forward"] - b["forward"] == FSDP_GATHERED - GATHERED
    for moment in ("backward_start", "backward_end"):
        assert a[moment] - b[moment] == FSDP_GATHERED + PREFETCH - GATHERED
    assert b["optimizer_step"] - a["optimizer_step"] == REDUCE == 988_065_536
    # The peak (backward) carries every part.
    line = next(x for x in fsdp.devices[0].lines if x.component is C.COMMUNICATION_BUFFERS)
    assert [(p.name, p.bytes) for p in line.parts] == [
        ("NCCL data-parallel communicator (2 ranks)", NCCL),
        (communication_buffers.REDUCE_BUCKET_PART, REDUCE),
        (communication_buffers.FSDP_GATHERED_PART, FSDP_GATHERED),
        (communication_buffers.FSDP_PREFETCH_PART, PREFETCH),
    ]
    line = next(x for x in ds.devices[0].lines if x.component is C.COMMUNICATION_BUFFERS)
    assert [p.name for p in line.parts][-1] == communication_buffers.GATHERED_PART
    names = {x.name: x.assumed for x in fsdp.stack.behaviours}
    assert "FSDP gathers whole units" in names["sharding_buffers"]
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
    assert lines[C.COMMUNICATION_BUFFERS] == NCCL + REDUCE + FSDP_GATHERED + PREFETCH


def test_fsdp_keeps_mistral_7bs_untied_embedding_and_head_unsharded() -> None:
    """Mistral 7B under FSDP: the root unit is the untied 32,000 x 4,096 embedding and LM head
    and the final norm (262,148,096 parameters); a block holds q and o 4,096 x 4,096, k and v
    4,096 x 1,024, gate/up/down 3 x 4,096 x 14,336 and two norms (218,112,000). In bf16: root
    and one block 960,520,192 B, the prefetched block 436,224,000 B (its config.json: hidden
    4,096, 8 KV heads of 128, intermediate 14,336, vocab 32,000, tie_word_embeddings false)."""
    root = 2 * 32_000 * 4_096 + 4_096
    block = 2 * 4_096 * 4_096 + 2 * 4_096 * 1_024 + 3 * 4_096 * 14_336 + 2 * 4_096
    assert (root, block) == (262_148_096, 218_112_000)
    w = {
        "kind": "training",
        "model": {"source": "preset", "id": "mistral-7b-v0.1"},
        "micro_batch_size": 1,
        "sequence_length": 1024,
        "method": {"kind": "lora", "rank": 16},
        "parallelism": {"data": 2, "zero_stage": 3},
    }
    r = msgspec.convert({"workloads": [w], "software": {"framework": "fsdp"}}, BudgetRequest)
    b = estimate(r.workloads, r.device, r.headroom, software=r.software)
    line = next(x for x in b.devices[0].lines if x.component is C.COMMUNICATION_BUFFERS)
    parts = {p.name: p.bytes for p in line.parts}
    assert parts[communication_buffers.FSDP_GATHERED_PART] == (root + block) * 2 == 960_520_192
    assert parts[communication_buffers.FSDP_PREFETCH_PART] == block * 2 == 436_224_000


def test_a_forward_peak_under_fsdp_lists_no_prefetched_block() -> None:
    """The parts describe the peak phase: Mistral 7B LoRA over 2 FSDP ranks at 4 x 4,096 tokens
    (fms-acceleration's two-GPU run) peaks at the loss (the forward), where no block is
    prefetched yet; every line's parts sum to its bytes."""
    w = {
        "kind": "training",
        "model": {"source": "preset", "id": "mistral-7b-v0.1"},
        "micro_batch_size": 4,
        "sequence_length": 4096,
        "checkpointing": "full",
        "attention": "flash",
        "method": {"kind": "lora", "rank": 16},
        "parallelism": {"data": 2, "zero_stage": 3},
    }
    # transformers 4.48.1's loss (its shifted fp32 copy) puts the peak at the loss.
    sw = {"framework": "fsdp", "libraries": {"transformers": "4.48.1"}}
    r = msgspec.convert({"workloads": [w], "software": sw}, BudgetRequest)
    b = estimate(r.workloads, r.device, r.headroom, software=r.software)
    d = b.devices[0]
    assert d.peak_phase == "forward"
    for line in d.lines:
        if line.parts:
            assert sum(p.bytes for p in line.parts) == line.bytes, line.component
    comm = next(x for x in d.lines if x.component is C.COMMUNICATION_BUFFERS)
    assert communication_buffers.FSDP_PREFETCH_PART not in {p.name for p in comm.parts}


def _metadata(
    framework: str | None, data: int, *, base: bool = False, offload: bool = False, **sw: Any
) -> int:
    """The metadata line of Qwen2.5-0.5B QLoRA (or LoRA over a bnb_4bit base) over ``data``
    FULL_SHARD ranks (one device when 1)."""
    qlora = {
        **SHARDED,
        "method": {"kind": "qlora", "rank": 8, "quant_type": "nf4", "double_quant": True},
        "parallelism": {"data": data, "zero_stage": 3 if data > 1 else 0},
    }
    if base:
        qlora["method"] = {"kind": "lora", "rank": 8}
        qlora["precision"] = {
            "weights": "bf16",
            "quantization": {"scheme": "bnb_4bit", "quant_type": "nf4", "double_quant": True},
        }
    if offload:
        qlora["parallelism"] = {**qlora["parallelism"], "offload_parameters": True}
    software = {**({"framework": framework} if framework else {}), **sw} or None
    body = {"workloads": [qlora], "headroom": {"fraction": 0.0}, "software": software}
    r = msgspec.convert(body, BudgetRequest)
    b = estimate(r.workloads, r.device, r.headroom, software=r.software)
    line = next(x for x in b.devices[0].lines if x.component is C.QUANTIZATION_METADATA)
    return line.bytes


@pytest.mark.parametrize(
    ("framework", "base", "software"),
    [
        (None, False, {}),  # transformers + PEFT QLoRA under FSDP
        (None, True, {}),  # LoRA over a bnb_4bit base
        ("torchtune", True, {}),  # a bnb_4bit base is bitsandbytes' whatever runs it
        (None, False, {"libraries": {"deepspeed": "0.16.0"}}),  # ZeRO-3 partitions data only
        ("axolotl", False, {}),
    ],
)
def test_bitsandbytes_quant_state_stays_whole_on_every_rank(
    framework: str | None, base: bool, software: dict[str, Any]
) -> None:
    """bitsandbytes keeps a 4-bit layer's absmax and nested state in ``quant_state``, an
    attribute of the ``Params4bit`` and not a parameter: FSDP's flat parameters (and so its
    CPU offload) and ZeRO-3's partitions leave it whole on every GPU, so two FULL_SHARD ranks
    hold as much of it as one GPU does, with or without parameter offload."""
    one = _metadata(framework, 1, base=base, **software)
    assert one > 0
    assert _metadata(framework, 2, base=base, **software) == one
    if not software:  # parameter offload is FSDP's here
        assert _metadata(framework, 2, base=base, offload=True) == one


def test_torchtune_nf4_shards_its_scalers_and_offloads_them() -> None:
    """torchtune's torchao NF4 shards its scalers with the data (half, rounded up, on each of
    two ranks), and CPU offload moves them to the host with the shards."""
    one = _metadata("torchtune", 1)
    assert one > 0 and _metadata("torchtune", 2) == -(-one // 2)
    assert _metadata("torchtune", 2, offload=True) == 0


def test_the_answer_names_where_quantization_state_lives() -> None:
    """Sharded QLoRA's answer lists the ``quantization_state_sharding`` behaviour with the
    stack's rule (bitsandbytes whole, torchtune's NF4 sharded); one device's does not."""

    def behaviours(framework: str | None, data: int) -> dict[str, str]:
        qlora = {
            **SHARDED,
            "method": {"kind": "qlora", "rank": 8},
            "parallelism": {"data": data, "zero_stage": 3 if data > 1 else 0},
        }
        body = {
            "workloads": [qlora],
            "software": {"framework": framework} if framework else None,
        }
        r = msgspec.convert(body, BudgetRequest)
        b = estimate(r.workloads, r.device, r.headroom, software=r.software)
        return {x.name: x.assumed for x in b.stack.behaviours}

    assert "quantization_state_sharding" not in behaviours(None, 1)
    assert "every rank keeps all of it" in behaviours(None, 2)["quantization_state_sharding"]
    assert "FSDP2 shards them" in behaviours("torchtune", 2)["quantization_state_sharding"]


# Qwen2.5-0.5B's projections per layer: q and o 896 x 896, k and v 128 x 896, gate/up/down
# 3 x 4,864 x 896; 24 layers. 4-bit GPTQ / AWQ pack each into in x out / 2 bytes (qweight).
PROJECTIONS = 24 * (2 * 896 * 896 + 2 * 128 * 896 + 3 * 4864 * 896)
PACKED = PROJECTIONS // 2
assert PACKED == 178_913_280
# What stays a parameter: the tied embedding 151,936 x 896 and 49 norms of 896, bf16; the
# q/k/v biases (896 + 128 + 128 per layer) are the QuantLinear's buffers under GPTQ / AWQ.
PLAIN = (151_936 * 896 + 49 * 896) * 2
BIASES = 24 * (896 + 128 + 128) * 2
assert PLAIN + BIASES == 272_412_416


def _buffer_quantized(scheme: str, data: int, offload: bool = False, **software: Any):
    """LoRA (r 8) over a 4-bit ``scheme`` base of Qwen2.5-0.5B over ``data`` FULL_SHARD
    ranks; the weights and metadata lines, the communication parts and the behaviours."""
    w = {
        **SHARDED,
        "precision": {"weights": "bf16", "quantization": {"scheme": scheme}},
        "method": {"kind": "lora", "rank": 8},
        "parallelism": {
            "data": data,
            "zero_stage": 3 if data > 1 else 0,
            **({"offload_parameters": True} if offload else {}),
        },
    }
    body = {"workloads": [w], "headroom": {"fraction": 0.0}, "software": software or None}
    r = msgspec.convert(body, BudgetRequest)
    b = estimate(r.workloads, r.device, r.headroom, software=r.software)
    lines = {x.component: x for x in b.devices[0].lines}
    comm = {p.name: p.bytes for p in lines[C.COMMUNICATION_BUFFERS].parts or ()}
    behaviours = {x.name for x in b.stack.behaviours}
    return lines[C.WEIGHTS].bytes, lines[C.QUANTIZATION_METADATA].bytes, comm, behaviours


@pytest.mark.parametrize("scheme", ["gptq", "awq"])
@pytest.mark.parametrize("software", [{}, {"framework": "deepspeed"}])
def test_gptq_and_awq_bases_stay_whole_on_every_rank(scheme: str, software: dict[str, Any]) -> None:
    """GPTQ's and AWQ's packed weights, scales, zero points and biases are module buffers
    (``register_buffer`` in auto_gptq's and AutoAWQ's QuantLinear), and ZeRO-3 and FSDP shard,
    gather and offload parameters only: over two ranks each GPU keeps the whole packed base,
    its biases and all its metadata; only the embedding and norms are halved; parameter
    offload leaves the packed base on the GPU; FSDP's units gather no packed weight."""
    w1, m1, _, one = _buffer_quantized(scheme, 1, **software)
    assert w1 == PACKED + BIASES + PLAIN
    w2, m2, comm, two = _buffer_quantized(scheme, 2, **software)
    assert w2 == PACKED + BIASES + PLAIN // 2 == 315_147_136
    assert m2 == m1 > 0
    assert "quantized_buffers_sharding" in two and "quantized_buffers_sharding" not in one
    if not software:  # FSDP: the root unit and a block's two norms, bf16
        assert comm[communication_buffers.FSDP_PREFETCH_PART] == 2 * 896 * 2
        w_off, m_off, _, _ = _buffer_quantized(scheme, 2, offload=True)
        assert (w_off, m_off) == (PACKED + BIASES, m1)


def test_bitsandbytes_4bit_weights_are_still_sharded() -> None:
    """bitsandbytes' packed 4-bit weight is a parameter (``Params4bit``): halved over two
    ranks, as the embedding is (its quant_state is not: the tests above)."""
    w1, _, _, _ = _buffer_quantized("bnb_4bit", 1)
    w2, _, _, behaviours = _buffer_quantized("bnb_4bit", 2)
    assert w1 == PACKED + BIASES + PLAIN
    assert w2 == PACKED // 2 + (BIASES + PLAIN) // 2
    assert "quantized_buffers_sharding" not in behaviours


def test_lora_over_a_bnb_base_names_its_quantization_state() -> None:
    """LoRA over a ``bnb_4bit`` base keeps bitsandbytes' quant_state whole as QLoRA does, and
    its answer says so."""
    w = {
        **SHARDED,
        "precision": {"weights": "bf16", "quantization": {"scheme": "bnb_4bit"}},
        "method": {"kind": "lora", "rank": 8},
    }
    r = msgspec.convert({"workloads": [w]}, BudgetRequest)
    b = estimate(r.workloads, r.device, r.headroom, software=r.software)
    names = {x.name: x.assumed for x in b.stack.behaviours}
    assert "every rank keeps all of it" in names["quantization_state_sharding"]
    assert "quantized_buffers_sharding" not in names
