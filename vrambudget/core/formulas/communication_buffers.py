"""Communication buffers: NCCL communicators of the layout, DDP gradient buckets, ZeRO/FSDP
gather and reduce buckets.

Shown in answers::

    NCCL communicators of the layout + DDP/ZeRO buckets
"""

from __future__ import annotations

__all__ = [
    "DDP_BUCKET_NOTE",
    "FORMULA",
    "FSDP_GATHERED_PART",
    "FSDP_PREFETCH_PART",
    "GATHERED_PART",
    "NCCL_GROUP_BYTES",
    "NCCL_PAIR_BYTES",
    "NCCL_SOURCE",
    "REDUCE_BUCKET_PART",
    "SOURCE",
    "ZERO_ALLGATHER_BUCKET_ELEMENTS",
    "ZERO_PREFETCH_BUCKET_ELEMENTS",
    "ZERO_REDUCE_BUCKET_ELEMENTS",
    "ZERO_SOURCE",
    "calibrated",
    "is_nccl",
    "live_at_step",
    "live_in_forward",
    "nccl_bytes",
    "source",
    "stage_parts",
]

FORMULA = "NCCL communicators of the layout + DDP/ZeRO buckets"

# NCCL device memory per communicator, 4x A100 NVLink, PyTorch, 4 MB all-reduce: 544 MB for a
# 2-rank group, 688 MB for a larger group (NVIDIA/nccl#964). Buffers scale with channels x peers
# (NCCL_BUFFSIZE default 4 MiB per channel and peer, src/init.cc).
NCCL_PAIR_BYTES = 544 * 10**6
NCCL_GROUP_BYTES = 688 * 10**6
NCCL_SOURCE = "measured: 544 MB (2 ranks) / 688 MB (>2 ranks) per communicator, NVIDIA/nccl#964"

# DeepSpeed deepspeed/runtime/zero/config.py defaults (elements, not bytes).
ZERO_REDUCE_BUCKET_ELEMENTS = 500_000_000
ZERO_ALLGATHER_BUCKET_ELEMENTS = 500_000_000
ZERO_PREFETCH_BUCKET_ELEMENTS = 50_000_000
ZERO_SOURCE = "DeepSpeed runtime/zero/config.py: reduce_bucket_size 5e8, prefetch_bucket_size 5e7"
DDP_BUCKET_NOTE = (
    "torch DistributedDataParallel(gradient_as_bucket_view=False), the default: "
    '"the saved memory size will be equal to the total gradients size"'
)
_DOCS = (
    "torch DDP docs; DeepSpeed ZeRO config; torch distributed/fsdp/_runtime_utils.py "
    "_post_forward_reshard (FSDP keeps the root unit unsharded after the forward) and "
    "BackwardPrefetch.BACKWARD_PRE (the next block gathered during a block's backward)"
)
SOURCE = f"{NCCL_SOURCE}; {_DOCS}"


def source(communication_source: str) -> str:
    """The line's source: the device type's NCCL measurement (built-in or calibrated) and the
    bucket documentation."""
    return f"{communication_source}; {_DOCS}"


REDUCE_BUCKET_PART = "ZeRO reduce bucket"
GATHERED_PART = "ZeRO-3 gathered layer + prefetch bucket"
FSDP_GATHERED_PART = "FSDP unsharded root unit (embeddings, final norm, LM head) + one block"
FSDP_PREFETCH_PART = "FSDP backward prefetch: the next block unsharded"


def live_at_step(part_name: str, deepspeed: bool, zero_stage: int) -> bool:
    """Whether a part is still allocated during the optimizer step. A ZeRO-3 / FSDP FULL_SHARD
    rank frees each layer's gathered parameters after the layer's forward and backward, and
    FSDP frees each layer's unsharded gradient once it is reduce-scattered (torch 2.13
    distributed/fsdp/_runtime_utils.py ``_post_backward_reshard`` line 793, ``_reduce_grad``
    lines 846-847: ``flat_param.grad = None``). DeepSpeed ZeRO-1/2 release their reduce bucket
    when the backward's reduction ends (stage_1_and_2.py
    ``independent_gradient_partition_epilogue`` -> ``_release_ipg_buffers``); ZeRO-3 allocates
    its once and keeps it (stage3.py). NCCL's communicators and DDP's gradient buckets stay."""
    if part_name in (GATHERED_PART, FSDP_GATHERED_PART, FSDP_PREFETCH_PART):
        return False
    if part_name == REDUCE_BUCKET_PART:
        return deepspeed and zero_stage >= 3
    return True


def live_in_forward(part_name: str) -> bool:
    """Whether a part is allocated in the forward: all but FSDP's prefetched next block, which
    ``BACKWARD_PRE`` gathers in backward only."""
    return part_name != FSDP_PREFETCH_PART


def is_nccl(part_name: str) -> bool:
    """Whether a part of the line is an NCCL communicator's memory, which NCCL allocates with
    ``cudaMalloc`` outside torch's caching allocator (it shows in ``nvidia-smi``, never in
    ``torch.cuda.memory_reserved()``). The other parts -- DDP gradient buckets, ZeRO/FSDP reduce
    and gather buffers -- are torch tensors, counted by the allocator like any other."""
    return part_name.startswith("NCCL")


def nccl_bytes(ranks: int) -> int:
    """One communicator's device memory: none for one rank, 544 MB for a pair, 688 MB for a
    larger group (NVIDIA/nccl#964)."""
    return 0 if ranks <= 1 else (NCCL_PAIR_BYTES if ranks == 2 else NCCL_GROUP_BYTES)


def stage_parts(
    tensor: int,
    pipeline: int,
    data: int,
    zero_stage: int,
    training: bool,
    trainable: int,
    grad_bytes: int,
    largest_layer: int,
    params: int,
    plain_bytes: int,
    fsdp_units: tuple[int, int] | None = None,
) -> list[tuple[str, int]]:
    """The buffers one device of a pipeline stage holds, by name.

    ZeRO-3 gathers parameters for the computation: DeepSpeed the largest layer and its 5e7-element
    prefetch bucket; FSDP (``fsdp_units``: the stored bytes of the root unit -- what no wrapped
    block holds -- and of the largest block; a 4-bit block gathers its packed storage) whole
    units -- the root, which it does not reshard after the forward, so that it stays unsharded
    until the end of the backward, plus the block being computed, plus in backward the next
    block prefetched (``BACKWARD_PRE``).

    Worked numbers: DDP over 8 ranks of a bf16 full fine-tune of Qwen2.5 0.5B: a 688 MB
    communicator plus a copy of the gradients, 494,032,768 x 2 = 988,065,536 B. FSDP over a
    bf16 Mistral 7B (untied 32,000 x 4,096 embedding and head, a norm of 4,096; blocks of
    218,112,000 parameters): root and one block (262,148,096 + 218,112,000) x 2 = 960,520,192 B,
    and 436,224,000 B more in backward."""
    parts: list[tuple[str, int]] = []
    if tensor > 1:
        parts.append((f"NCCL tensor-parallel communicator ({tensor} ranks)", nccl_bytes(tensor)))
    if pipeline > 1:
        parts.append(("NCCL pipeline point-to-point", NCCL_PAIR_BYTES))
    if training and data > 1:
        parts.append((f"NCCL data-parallel communicator ({data} ranks)", nccl_bytes(data)))
        if zero_stage == 0:
            parts.append(("DDP gradient buckets (a copy of the gradients)", trainable * grad_bytes))
        else:
            parts.append(
                (REDUCE_BUCKET_PART, min(ZERO_REDUCE_BUCKET_ELEMENTS, trainable) * grad_bytes)
            )
        if zero_stage >= 3 and fsdp_units is not None:
            root, block = fsdp_units
            parts.append((FSDP_GATHERED_PART, root + block))
            parts.append((FSDP_PREFETCH_PART, block))
        elif zero_stage >= 3:
            gathered = (largest_layer + min(ZERO_PREFETCH_BUCKET_ELEMENTS, params)) * plain_bytes
            parts.append((GATHERED_PART, gathered))
    return parts


def calibrated(
    comm_bytes: int, parts: tuple[tuple[str, int], ...], nccl_communicator_bytes: int | None
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """The stage's buffers with a calibrated NCCL communicator size (None: the built-in ones)
    in every NCCL part."""
    if nccl_communicator_bytes is None:
        return comm_bytes, parts
    out = tuple((n, nccl_communicator_bytes if is_nccl(n) else b) for n, b in parts)
    return sum(b for _, b in out), out
