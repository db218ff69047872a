"""torchtune 0.1's QLoRA model init replayed through the allocator model: every NF4 weight is
quantized on the GPU three times, each through torchao 0.1's unchunked ``to_nf4``, whose
nearest-value search holds 64 bytes per weight element; the allocator keeps the segments, so
``max_memory_reserved`` after init is far above the model's own bytes.

What torchtune 0.1.1 runs (read in its wheel and in torchao 0.1's, which it pins:
``Requires-Dist: torchao ==0.1``):

- ``models/llama2/_component_builders.py`` ``lora_llama2`` builds one template layer under the
  recipe's ``with self._device`` (the GPU): each ``LoRALinear`` with ``quantize_base`` creates
  an ``nn.Linear`` (its bf16 weight) and keeps ``to_nf4(linear.weight)``
  (``modules/peft/lora.py`` line 94);
- ``modules/transformer.py`` ``_get_clones`` deep-copies the template once per layer (line 93);
  torchtune registers NF4's ``clone`` as ``to_nf4(t.get_original_weight())``
  (``utils/_register_nf4_dispatch_ops.py`` lines 11-19): a dequantize and a requantize;
- the recipe's ``load_state_dict`` copies each checkpoint weight in through NF4's ``copy_``,
  which torchtune registers as ``to_nf4(src.to(dest.device))`` (same file, lines 22-42): the
  checkpoint's weight on the GPU, quantized there, the old quantized tensors dropped.

torchao 0.1 ``dtypes/nf4tensor.py``: ``from_tensor`` runs ``double_quantize_scalers`` then
``convert_to_norm_float_weight``, whose ``quantize_tensor_nearest`` computes
``(value.unsqueeze(-1) - nf4).abs()`` (lines 438-446): two (numel, 16) bf16 tensors. torchao
0.2.0 quantizes in chunks of 2**20 elements (``CHUNK_SIZE``), so this is 0.1's alone.

Checked: for Llama-2-7B with ``qlora_llama2_7b`` (LoRA and NF4 on q, k, v, output_proj and the
MLP) the replay's reserved peak is 9,135,194,112 B, where torchtune's QLoRA tutorial of
2024-04-15 (docs/source/tutorials/qlora_finetune.rst, commit 0914d5c) prints "Peak memory
reserved, model init 9.13 GB" (``memory_stats_log``: bytes / 1e9).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .replay import ALLOC, FREE, Event, replay_events

__all__ = ["Nf4Init", "replay_nf4_init"]


@dataclass(frozen=True, slots=True)
class Nf4Init:
    peak_reserved_bytes: int
    """``max_memory_reserved`` over the init (what the allocator keeps afterwards)."""
    peak_allocated_bytes: int
    end_allocated_bytes: int
    """The model's tensors once loaded (the replay's own count of them)."""
    events: int
    """Allocations and frees replayed."""


class _Stream:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._next = 0

    def alloc(self, nbytes: int) -> int:
        self._next += 1
        self.events.append((ALLOC, self._next, nbytes, 0))
        return self._next

    def free(self, *handles: int) -> None:
        self.events += [(FREE, h, 0, 0) for h in handles]


def _absmax(s: _Stream, n: int) -> int:
    """``get_block_absmax(x, 64)``: ``blocks.abs().max(dim=1).values`` (lines 133-150)."""
    a = s.alloc(2 * n)
    values, indices = s.alloc(n // 32), s.alloc(n // 8)
    s.free(indices, a)
    return values


def _to_nf4(s: _Stream, n: int) -> tuple[int, ...]:
    """``to_nf4`` of a bf16 tensor of ``n`` elements: the tensors it keeps."""
    lut = s.alloc(32)  # the 16 bf16 NF4 values
    # double_quantize_scalers (lines 292-349): the block scalers, their mean removed, requantized
    # to int8 in blocks of 256; quantization_factor[:, 0] keeps its whole (n/64 x 256) storage.
    v1 = _absmax(s, n)
    s1 = s.alloc(n // 32)
    s.free(v1)
    a2, v2 = s.alloc(n // 32), s.alloc(max(n // 8192, 2))
    s.free(a2)
    twice, factor = s.alloc(n // 32), s.alloc(n // 32)
    s.free(twice)
    q1, q2 = s.alloc(n // 32), s.alloc(n // 32)
    s.free(q1)
    q3 = s.alloc(n // 32)
    s.free(q2)
    scalers = s.alloc(n // 64)
    s.free(q3, s1, v2)
    # convert_to_norm_float_weight (lines 378-410) and quantize_tensor_nearest (438-446)
    v = _absmax(s, n)
    scaled = s.alloc(2 * n)
    diff0 = s.alloc(32 * n)  # value - nf4: (n, 16) bf16
    diff = s.alloc(32 * n)  # .abs()
    s.free(diff0)
    mins, indices = s.alloc(2 * n), s.alloc(8 * n)  # .min(dim=-1): values, int64 indices
    s.free(mins, diff)
    high = s.alloc(4 * n)  # indices[::2] << 4 (int64)
    packed = s.alloc(4 * n)  # | indices[1::2]
    s.free(high)
    data = s.alloc(n // 2)  # .to(torch.uint8)
    s.free(packed, indices, scaled, v)
    return (lut, factor, scalers, data)


def _original_weight(s: _Stream, n: int) -> int:
    """``NF4Tensor.get_original_weight`` (lines 409-435): the bf16 weight it returns."""
    t = s.alloc(n // 2)
    first = s.alloc(4 * n)  # (data >> 4).to(torch.long)
    s.free(t)
    t = s.alloc(n // 2)
    second = s.alloc(4 * n)
    s.free(t)
    d1, d2 = s.alloc(n), s.alloc(n)  # nf4[first], nf4[second]: n/2 bf16 each
    x = s.alloc(n // 32)  # dequantize_scalers
    scalers = s.alloc(n // 32)
    s.free(x)
    r = s.alloc(n)  # repeated.flatten()
    f1 = s.alloc(n)
    s.free(r)
    r = s.alloc(n)
    f2 = s.alloc(n)
    s.free(r)
    out = s.alloc(2 * n)  # torch.stack(..., dim=-1).reshape(shape)
    s.free(f1, f2, d1, d2, first, second, scalers)
    return out


@lru_cache(maxsize=64)
def replay_nf4_init(
    projections: tuple[tuple[int, int, bool], ...],
    layers: int,
    rank: int,
    embedding_bytes: int,
    head_bytes: int,
    hidden: int,
) -> Nf4Init:
    """The init of a decoder of ``layers`` identical layers whose projections
    ``(in, out, adapted)`` are, in module order, LoRA + NF4 layers of ``rank`` (bf16 adapters)
    where adapted and plain bf16 ``nn.Linear`` otherwise (torchtune 0.1 quantizes only the
    adapted ones); the embedding and an unquantized head of the given bytes, two bf16 norms
    per layer. A plain weight is built and cloned on the GPU and loaded in place."""
    s = _Stream()
    template: list[tuple[int, ...]] = []
    for n_in, n_out, adapted in projections:  # the template layer
        w = s.alloc(2 * n_in * n_out)
        if adapted:
            template.append(_to_nf4(s, n_in * n_out))
            s.free(w)
            template.append((s.alloc(2 * rank * n_in), s.alloc(2 * rank * n_out)))
        else:
            template.append((w,))
    template.append((s.alloc(2 * hidden), s.alloc(2 * hidden)))
    s.alloc(embedding_bytes)
    s.alloc(head_bytes)
    model: list[list[tuple[int, ...] | None]] = []
    for _ in range(layers):  # _get_clones: deepcopy of the template, NF4 clone requantizes
        clones: list[tuple[int, ...] | None] = []
        for n_in, n_out, adapted in projections:
            n = n_in * n_out
            if adapted:
                g = _original_weight(s, n)
                clones.append(_to_nf4(s, n))
                s.free(g)
                s.alloc(2 * rank * n_in)
                s.alloc(2 * rank * n_out)
            else:
                s.alloc(2 * n)
                clones.append(None)
        s.alloc(2 * hidden)
        s.alloc(2 * hidden)
        model.append(clones)
    for t in template:
        s.free(*t)
    s.alloc(2 * hidden)  # the final norm
    for clones in model:  # load_state_dict: copy_ quantizes each checkpoint weight on the GPU
        for i, (n_in, n_out, _) in enumerate(projections):
            old = clones[i]
            if old is None:
                continue  # a plain weight is copied in place
            x = s.alloc(2 * n_in * n_out)
            new = _to_nf4(s, n_in * n_out)
            s.free(*old)
            s.free(x)
            clones[i] = new
    r = replay_events(s.events)
    return Nf4Init(
        peak_reserved_bytes=max(res for _, res in r.phases.values()),
        peak_allocated_bytes=max(a for a, _ in r.phases.values()),
        end_allocated_bytes=r.stats.allocated_bytes,
        events=len(s.events),
    )
