"""DeepSpeed ZeRO-3 on a model built outside deepspeed.zero.Init
(vrambudget.core.allocator.zero3_init): deepspeed.initialize moves the whole model to each
device, then partitions it one parameter at a time; the allocator keeps the segments."""

from __future__ import annotations

import math

import msgspec
import pytest

from vrambudget.core.allocator.zero3_init import (
    replay_zero3_module_init,
    replay_zero3_quantized_init,
)
from vrambudget.core.bands import band_rule
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import fit
from vrambudget.core.spec import BudgetRequest, FitRequest, Software
from vrambudget.core.stack import resolve_stack

MiB = 1 << 20


def test_the_replay_by_hand() -> None:
    """Two bf16 tensors over 4 ranks, by the caching allocator's rules (c10/cuda/
    CUDACachingAllocator.cpp get_allocation_size: > 10 MiB rounded up to 2 MiB, 1-10 MiB a 20
    MiB segment, <= 1 MiB the small pool's 2 MiB segments):

    - the move: a 16 MiB tensor (its own 16 MiB segment), a 4 MiB one (a 20 MiB segment);
    - the first's 4 MiB partition, allocated while it is still whole: the 16 MiB left in the
      second's segment takes it. Allocated 16 + 4 + 4 = 24 MiB, the peak;
    - the first tensor freed; the second's 1 MiB partition is a small-pool request: a new 2
      MiB segment. Reserved 16 + 20 + 2 = 38 MiB, the peak."""
    r = replay_zero3_module_init(((8 * MiB, 2), (2 * MiB, 2)), 4)
    assert r.model_bytes == 20 * MiB
    assert r.peak_allocated_bytes == 24 * MiB
    assert r.peak_reserved_bytes == 38 * MiB
    # Parameters offloaded: the partitions go to host memory, the device only frees.
    off = replay_zero3_module_init(((8 * MiB, 2), (2 * MiB, 2)), 4, False)
    assert (off.peak_allocated_bytes, off.peak_reserved_bytes) == (20 * MiB, 36 * MiB)


def test_a_partition_rounds_its_elements_up_to_the_ranks() -> None:
    """_partition_param: partition_size = the numel aligned up to a multiple of the ranks,
    divided by them. 1,000,001 bf16 elements over 8 ranks: 125,001 elements, 250,002 B, which
    the allocator rounds to 250,368 B (512-byte granules)."""
    r = replay_zero3_module_init(((1_000_001, 2),), 8)
    whole = -(-2_000_002 // 512) * 512
    assert r.peak_allocated_bytes == whole + -(-250_002 // 512) * 512


def _request(zero_init: bool | None, framework: str = "deepspeed", data: int = 8) -> dict:
    software: dict = {"framework": framework}
    if zero_init is not None:
        software["zero_init"] = zero_init
    req = {
        "workloads": [
            {
                "kind": "training",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "precision": {"weights": "bf16"},
                "mixed_precision": "master_fp32",
                "micro_batch_size": 1,
                "sequence_length": 2048,
                "optimizer": {"name": "adamw"},
                "checkpointing": "full",
                "method": {"kind": "full"},
                "parallelism": {"data": data, "zero_stage": 3, "offload_optimizer": True},
            }
        ],
        "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
        "software": software,
    }
    r = msgspec.convert(req, BudgetRequest)
    return msgspec.to_builtins(estimate(r.workloads, r.device, r.headroom, software=r.software))


def test_a_model_built_whole_peaks_at_init_with_the_whole_model() -> None:
    """Llama 3.1 8B by hand: embedding and untied head 128,256 x 4,096 each; per layer q and o
    4,096 x 4,096, k and v 1,024 x 4,096, gate, up and down 4,096 x 14,336, two norms of 4,096;
    32 layers and the final norm: 8,030,261,248 parameters, 2 bytes each in bf16. The first
    parameter converted is the embedding: its partition over 8 ranks, 65,667,072 elements
    (131,334,144 B), is allocated while the whole model is there, in a new segment rounded up
    to 2 MiB (126 MiB); the 786,432 B left is under 1 MiB, so the allocator does not split it
    off (should_split) and the block counts whole."""
    b = _request(zero_init=False)
    (dev,) = b["devices"]
    assert dev["peak_phase"] == "model_init"
    lines = {ln["component"]: ln["bytes"] for ln in dev["lines"]}
    layer = 2 * 4_096 * 4_096 + 2 * 1_024 * 4_096 + 3 * 4_096 * 14_336 + 2 * 4_096
    params = 2 * 128_256 * 4_096 + 32 * layer + 4_096
    assert params == 8_030_261_248
    assert lines["weights"] == 2 * params
    partition = 128_256 * 4_096 // 8 * 2
    assert partition == 131_334_144
    assert lines["runtime_workspace"] == 126 * MiB
    for c in ("optimizer_state", "master_weights", "gradients", "activations", "logits"):
        assert lines[c] == 0, c
    (behaviour,) = [x for x in b["stack"]["behaviours"] if x["name"] == "zero3_model_init"]
    assert "module.to(device)" in behaviour["assumed"]
    assert "engine.py" in behaviour["source"]


def test_zero_init_is_the_default_and_has_no_init_phase() -> None:
    for zero_init in (None, True):
        b = _request(zero_init=zero_init)
        (dev,) = b["devices"]
        assert "model_init" not in [p["name"] for p in dev["phases"]]
        (behaviour,) = [x for x in b["stack"]["behaviours"] if x["name"] == "zero3_model_init"]
        assert "deepspeed.zero.Init" in behaviour["assumed"]
    # The whole-model phase is far above what a ZeRO-3 rank holds in training here.
    whole = _request(zero_init=False)["devices"][0]["total_bytes"]
    assert whole > _request(zero_init=None)["devices"][0]["total_bytes"]


def test_fsdp_and_one_rank_have_no_init_phase() -> None:
    """FSDP shards at wrapping (no DeepSpeed engine); one rank partitions nothing."""
    for b in (_request(None, framework="fsdp"), _request(False, data=1)):
        (dev,) = b["devices"]
        assert "model_init" not in [p["name"] for p in dev["phases"]]
    names = [x["name"] for x in _request(None, framework="fsdp")["stack"]["behaviours"]]
    assert "zero3_model_init" not in names


def test_zero_init_without_deepspeed_is_refused() -> None:
    """zero.Init is DeepSpeed's: naming it for FSDP is a mistake the answer names (422)."""
    with pytest.raises(InvalidWorkload) as e:
        _request(False, framework="fsdp")
    assert e.value.field == "software.zero_init"


def test_the_quantized_replay_by_hand() -> None:
    """A 4-bit weight quantized on the device and a 12 MiB bf16 one, over 2 ranks:

    - the weight's 16 MiB bf16 source (its own segment), its 4 MiB packed data (a 20 MiB
      segment), its 256 KiB quant_state (a small-pool 2 MiB segment): allocated 20.25 MiB,
      the peak; the source freed;
    - the bf16 weight takes 12 MiB of the source's freed 16 MiB block (split: 4 MiB left);
    - the packed weight's 2 MiB partition takes the 4 MiB block (split), the packed data is
      freed; the bf16 weight's 6 MiB partition takes the now free 20 MiB segment: allocated
      0.25 + 12 + 2 + 6 = 20.25 MiB again. Reserved 16 + 20 + 2 = 38 MiB; the quant_state is
      never partitioned."""
    q = ((16 * MiB, 4 * MiB, 256 * 1024, 2), (0, 12 * MiB, 0, 2))
    r = replay_zero3_quantized_init(q, 2)
    assert r.model_bytes == 16 * MiB + 256 * 1024
    assert r.peak_allocated_bytes == 20 * MiB + 256 * 1024
    assert r.peak_reserved_bytes == 38 * MiB


# Llama 3.1 8B at 4 bits by hand: 32 layers of q and o 4,096 x 4,096, k and v 1,024 x 4,096,
# gate/up/down 3 x 14,336 x 4,096 packed to half a byte per weight; the embedding and untied
# head 128,256 x 4,096 and 65 norms of 4,096 stay bf16 (sharded QLoRA keeps them in the storage
# dtype: no fp32 upcast).
PACKED = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14_336 * 4096) // 2
PLAIN = (2 * 128_256 * 4096 + 65 * 4096) * 2
assert PACKED + PLAIN == 5_591_539_712


def _qlora_workload(data: int, method: str, scheme: str, sequence_length: int) -> dict:
    w: dict = {
        "kind": "training",
        "model": {"source": "preset", "id": "llama-3.1-8b"},
        "precision": {"weights": "bf16"},
        "micro_batch_size": 1,
        "sequence_length": sequence_length,
        "checkpointing": "full",
        "method": {"kind": method, "rank": 8},
        "parallelism": {"data": data, "zero_stage": 3 if data > 1 else 0},
    }
    if method == "lora":
        w["precision"]["quantization"] = {"scheme": scheme}
    return w


def _qlora(
    framework: str,
    data: int = 4,
    method: str = "qlora",
    scheme: str = "bnb_4bit",
    transformers: str | None = None,
    sequence_length: int = 256,
) -> dict:
    w = _qlora_workload(data, method, scheme, sequence_length)
    software: dict = {"framework": framework}
    if transformers:
        software["libraries"] = {"transformers": transformers}
    r = msgspec.convert(
        {"workloads": [w], "headroom": {"fraction": 0.0}, "software": software}, BudgetRequest
    )
    return msgspec.to_builtins(estimate(r.workloads, r.device, r.headroom, software=r.software))


@pytest.mark.parametrize(
    ("method", "scheme"), [("qlora", "bnb_4bit"), ("lora", "bnb_4bit"), ("lora", "gptq")]
)
def test_a_quantized_model_reaches_each_deepspeed_rank_whole(method: str, scheme: str) -> None:
    """transformers never builds a quantized model under zero.Init: each DeepSpeed ZeRO-3 rank
    holds the whole quantized model on its GPU before partitioning it (bitsandbytes quantizes
    it there; GPTQ's is moved there whole). At 256 tokens that init is the peak: the whole
    packed model, its bf16 embeddings and head and all its metadata (as one GPU holds them),
    where a training step holds a quarter of the bf16 parameters; the answer names the
    behaviour, not zero.Init's."""
    b = _qlora("deepspeed", method=method, scheme=scheme)
    (dev,) = b["devices"]
    assert dev["peak_phase"] == "model_init"
    lines = {ln["component"]: ln["bytes"] for ln in dev["lines"]}
    assert lines["weights"] == PACKED + PLAIN
    one = _qlora("deepspeed", 1, method, scheme)["devices"][0]["lines"]
    meta = next(ln["bytes"] for ln in one if ln["component"] == "quantization_metadata")
    assert lines["quantization_metadata"] == meta > 0
    for c in ("optimizer_state", "gradients", "activations", "logits"):
        assert lines[c] == 0, c
    phases = {p["name"]: p["total_bytes"] for p in dev["phases"]}
    assert phases["model_init"] > max(v for k, v in phases.items() if k != "model_init")
    names = {x["name"] for x in b["stack"]["behaviours"]}
    assert "zero3_quantized_model_init" in names and "zero3_model_init" not in names


def test_fsdp_qlora_has_no_whole_model_init() -> None:
    """FSDP's QLoRA loads on rank 0's host (transformers moves each quantized weight's data
    off the GPU): no whole-model init phase, no DeepSpeed behaviour."""
    b = _qlora("fsdp")
    assert "model_init" not in [p["name"] for p in b["devices"][0]["phases"]]
    assert "zero3_quantized_model_init" not in {x["name"] for x in b["stack"]["behaviours"]}


def test_an_unquantized_deepspeed_model_names_zero_init_only() -> None:
    names = {x["name"] for x in _request(None)["stack"]["behaviours"]}
    assert "zero3_model_init" in names and "zero3_quantized_model_init" not in names


def test_the_quantized_init_follows_the_transformers_release() -> None:
    """transformers 4.39 - 4.x sends each quantized weight's packed data to the host under
    ZeRO-3 and DeepSpeed moves it back whole: the same whole model at the init's peak as 5.x,
    which keeps it on the device (only the allocator's history differs). Before 4.39
    transformers built quantized models under zero.Init too: no whole-model phase is claimed,
    nor the behaviour."""
    for release in ("4.46.3", "5.23.0"):
        dev = _qlora("deepspeed", transformers=release)["devices"][0]
        assert dev["peak_phase"] == "model_init", release
        lines = {ln["component"]: ln["bytes"] for ln in dev["lines"]}
        assert lines["weights"] == PACKED + PLAIN, release
    old = _qlora("deepspeed", transformers="4.38.2")
    assert "model_init" not in [p["name"] for p in old["devices"][0]["phases"]]
    assert "zero3_quantized_model_init" not in {x["name"] for x in old["stack"]["behaviours"]}


def test_the_band_never_reaches_below_the_whole_model_at_init() -> None:
    """The multi-GPU QLoRA band reaches far below the estimate (few sources, one of them 3.4x
    over), but each DeepSpeed rank holds the whole 4-bit model at init whatever the stack: at
    2,048 tokens the peak is mid-backward, and the band's low end is the init phase's counted
    bytes (weights by hand, the one-GPU budget's metadata and adapters, which no rank shards
    before deepspeed.initialize), not the band's ratio of the subtotal. /v1/fits reads the
    same floor: a device one byte short of it gets ``does_not_fit``, not ``fits_if_low``."""
    b = _qlora("deepspeed", sequence_length=2048)
    (dev,) = b["devices"]
    assert dev["peak_phase"] == "backward_start"
    one = {ln["component"]: ln["bytes"] for ln in _qlora("deepspeed", 1, sequence_length=2048)[
        "devices"][0]["lines"]}  # fmt: skip
    floor = PACKED + PLAIN + one["quantization_metadata"] + one["adapters"]
    assert floor == 5_729_573_760
    sub = dev["total_bytes"]  # headroom 0
    rule = band_rule(
        (dev["band"]["workload_class"],), resolve_stack(Software(framework="deepspeed"))
    )
    assert math.floor(sub * rule.low) < floor < sub
    assert dev["band"]["low_bytes"] == floor

    def verdict(capacity: int) -> str:
        w = _qlora_workload(4, "qlora", "bnb_4bit", 2048)
        req = msgspec.convert(
            {
                "workloads": [w],
                "devices": [{"source": "custom", "name": "x", "memory_total_bytes": capacity}],
                "headroom": {"fraction": 0.0},
                "software": {"framework": "deepspeed"},
                "device_counts": [4],
                "solve": [],
            },
            FitRequest,
        )
        (layout,) = fit(req).gpus[0].layouts
        assert layout.total_bytes == sub
        return layout.verdict

    assert verdict(floor - 1) == "does_not_fit"
    assert verdict(floor) == "fits_if_low"


def test_co_located_workloads_floor_their_band_at_their_peaks_not_their_inits() -> None:
    """Two such jobs sharing each device: the co-located subtotal adds each one's peak phase
    (mid-backward), when each rank holds its quarter of the 4-bit model (by hand above), the
    quant_state whole (the one-GPU budget's metadata) and the adapters whole (rank 8 on q/k/v/o:
    32 x 8 x [(4,096 + 4,096) x 2 + (4,096 + 1,024) x 2] = 6,815,744 fp32 parameters); their
    inits, each holding the whole model, need not coincide with the other's peak, so the floor
    is the peaks' sum, not twice the init's 5,729,573,760 B."""
    one = _qlora("deepspeed", 1, sequence_length=2048)["devices"][0]["lines"]
    meta = next(ln["bytes"] for ln in one if ln["component"] == "quantization_metadata")
    adapters = 4 * 32 * 8 * ((4096 + 4096) * 2 + (4096 + 1024) * 2)
    quarter = -(-(PACKED + PLAIN) // 4)
    w = _qlora_workload(4, "qlora", "bnb_4bit", 2048)
    r = msgspec.convert(
        {
            "workloads": [w, w],
            "headroom": {"fraction": 0.0},
            "software": {"framework": "deepspeed"},
        },
        BudgetRequest,
    )
    (dev,) = estimate(r.workloads, r.device, r.headroom, software=r.software).devices
    assert dev.band is not None
    assert dev.band.counted_bytes == 2 * (quarter + meta + adapters) == 2 * 1_535_918_976
    lines = {ln.component.value: ln.bytes for ln in dev.lines}
    assert dev.band.counted_bytes == sum(
        lines[c] for c in ("weights", "quantization_metadata", "adapters")
    )
