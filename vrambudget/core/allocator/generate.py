"""transformers' ``generate`` replayed through the caching-allocator model: what
``torch.cuda.max_memory_reserved()`` (and so ``nvidia-smi``) shows for a greedy decode whose KV
cache grows by ``torch.cat``.

Every decode step allocates each layer's K and V again, one token longer (``torch.cat`` in the
legacy tuple cache of transformers < 4.36 and in ``DynamicCache.update`` / ``DynamicLayer.update``
since). A freed cache block is a few kilobytes too small for the next step's request, so the
allocator cuts new segments while the old ones stay cached: reserved memory grows with
batch x generated tokens far beyond the tensors' bytes (published: Llama-2-7B fp16 on an
A100-80GB, 256 + 512 tokens, batch 8 allocates 19,997 MB at most and reserves 63,503 MB;
optimum-benchmark ``running-llamas``, research/data/corpus/inference_more.json). The allocator
releases those cached segments and retries when ``cudaMalloc`` fails, so the workload still runs
on a smaller device; what grows is the reading, not the need.

Only the large pool is replayed (requests over ``kSmallSize``, 1 MiB): the small pool's segments
are separate and hold a few MiB. The weights are not replayed either: they are loaded first into
segments they fill, which no transient reuses. The stream follows the released modelling code,
one tensor per kernel output:

* per layer: RMSNorm's fp32 round trip, Q/K/V projections, rotary embedding (``rotate_half``'s
  ``cat``), the cache ``cat``, ``repeat_kv`` copies for grouped-query attention (eager; and SDPA
  before transformers 4.42), eager attention's score, mask, fp32 softmax and cast tensors, the
  output projection, the gated MLP; residual adds. ``softmax(dtype=float32)`` of bf16 scores
  copies them to fp32 first (ATen fuses the upcast for fp16 on CUDA only).
* per step: the 4-D causal mask, the LM head and its fp32 upcast (every prompt row before
  transformers 4.45, ``logits_to_keep=1`` and generate's fp32 copy since), the grown
  ``input_ids`` and attention mask.
* cache lifetime: before 4.42 the previous step's whole cache lives until the step ends (the
  legacy round trip); since, each layer's old K and V are freed right after their ``cat``.

Sources: transformers 4.35.2 ``models/llama/modeling_llama.py`` (``LlamaAttention.forward``,
``repeat_kv``, ``LlamaRMSNorm``) and ``generation/utils.py`` ``greedy_search``; 4.42.0
``cache_utils.py`` ``DynamicCache.update``; 5.x ``cache_utils.py`` ``DynamicLayer.update``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memo import BoundedCache
from .caching import CachingAllocator
from .sizes import SMALL_SIZE_BYTES

__all__ = ["MAX_EVENTS", "GenerateReplay", "GenerateShape", "events_of", "replay_generate"]

MAX_EVENTS = 600_000
"""The most large-pool requests one replay makes (under two seconds at about 3 us each); a
longer generation is not replayed."""


@dataclass(frozen=True, slots=True)
class GenerateShape:
    """What the replayed stream depends on (one device, one greedy ``generate`` call)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    elem: int
    """Bytes per element of the compute dtype."""
    batch: int
    prompt: int
    generated: int
    keep_old_cache: bool
    """transformers < 4.42: the previous step's whole cache lives until the step ends."""
    all_prompt_logits: bool
    """transformers < 4.45: the LM head and its fp32 upcast cover every prompt row."""
    eager: bool
    """Eager attention (scores materialized); else SDPA / flash."""
    repeat_kv: bool
    """``repeat_kv`` materializes K and V at the query heads (grouped-query attention)."""
    gated: bool = True
    softmax_copy: bool = False
    """Eager attention in bf16: ``softmax(..., dtype=torch.float32)`` copies the scores to fp32
    before the kernel (ATen ``softmax`` fuses the upcast for fp16 on CUDA only)."""
    dequantize: bool = False
    """bitsandbytes 4-bit: a linear on more than one row dequantizes its weight into a
    compute-dtype temporary (``matmul_4bit``'s ``MatMul4Bit`` path; one row takes the gemv
    kernel)."""


@dataclass(frozen=True, slots=True)
class GenerateReplay:
    allocated_bytes: int
    """The replayed stream's most bytes allocated (large pool, weights excluded)."""
    reserved_bytes: int
    """Its most bytes reserved: cached segments included."""
    events: int

    @property
    def cached_bytes(self) -> int:
        """What the allocator holds beyond the allocated peak: reserved - allocated."""
        return self.reserved_bytes - self.allocated_bytes


class _Count:
    """Counts the large-pool requests of a stream without replaying them."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def alloc(self, nbytes: int) -> int:
        if nbytes <= SMALL_SIZE_BYTES:
            return 0
        self.n += 1
        return self.n

    def free(self, *handles: int) -> None:
        pass


def events_of(g: GenerateShape) -> int:
    """About how many large-pool requests the replay of ``g`` makes: the last decode step's
    per layer (the largest) x layers x steps, plus the prefill's (counted, not replayed)."""
    last, prefill = _Count(), _Count()
    _layer(last, g, g.batch, 1, g.prompt + g.generated, 0, (1, 1))  # type: ignore[arg-type]
    _layer(prefill, g, g.batch * g.prompt, g.prompt, g.prompt, 0, (0, 0))  # type: ignore[arg-type]
    return g.layers * (last.n * max(g.generated - 1, 0) + prefill.n)


class _Stream:
    """Large-pool requests into one allocator; handle 0 stands for a small-pool tensor."""

    __slots__ = ("alloc_", "n")

    def __init__(self, expandable: bool) -> None:
        self.alloc_ = CachingAllocator(expandable_segments=expandable)
        self.n = 0

    def alloc(self, nbytes: int) -> int:
        if nbytes <= SMALL_SIZE_BYTES:  # = round_size(nbytes) <= kSmallSize (512 divides it)
            return 0
        self.n += 1
        self.alloc_.malloc(self.n, nbytes)
        return self.n

    def free(self, *handles: int) -> None:
        for h in handles:
            if h:
                self.alloc_.free(h)


def _rmsnorm(s: _Stream, rows: int, h: int, e: int) -> int:
    """``LlamaRMSNorm``: fp32 copy, pow, mean, rsqrt, product, cast back, weight product (the
    copy and the cast are no-ops in fp32)."""
    if rows * h * 4 <= SMALL_SIZE_BYTES:  # its largest tensor is small: all of it is
        return 0
    x32 = s.alloc(rows * h * 4) if e != 4 else 0
    sq = s.alloc(rows * h * 4)
    var = s.alloc(rows * 4)
    s.free(sq)
    eps = s.alloc(rows * 4)
    r = s.alloc(rows * 4)
    s.free(eps)
    y32 = s.alloc(rows * h * 4)
    s.free(x32, var, r)
    if e != 4:
        y = s.alloc(rows * h * e)
        s.free(y32)
    else:
        y = y32
    out = s.alloc(rows * h * e)
    s.free(y)
    return out


def _linear(s: _Stream, g: GenerateShape, rows: int, n_in: int, n_out: int) -> int:
    """A projection's output (and, for a dequantizing kernel, its weight's temporary)."""
    if g.dequantize and rows > 1:
        w = s.alloc(n_in * n_out * g.elem)
        out = s.alloc(rows * n_out * g.elem)
        s.free(w)
        return out
    return s.alloc(rows * n_out * g.elem)


def _rope(s: _Stream, size: int) -> int:
    """``q * cos + rotate_half(q) * sin`` on a ``size``-byte tensor."""
    if size <= SMALL_SIZE_BYTES:
        return 0
    a = s.alloc(size)
    neg = s.alloc(size // 2)
    rot = s.alloc(size)
    s.free(neg)
    b = s.alloc(size)
    s.free(rot)
    out = s.alloc(size)
    s.free(a, b)
    return out


def _layer(
    s: _Stream, g: GenerateShape, rows: int, t: int, length: int, hidden: int, old: tuple[int, int]
) -> tuple[int, tuple[int, int]]:
    """One decoder layer on ``rows`` = batch x ``t`` tokens attending to ``length`` positions;
    returns the new hidden states and this layer's new (K, V)."""
    e, b = g.elem, g.batch
    q_bytes = rows * g.heads * g.head_dim * e
    kv_bytes = rows * g.kv_heads * g.head_dim * e
    x = _rmsnorm(s, rows, g.hidden, e)
    q = _linear(s, g, rows, g.hidden, g.heads * g.head_dim)
    k = _linear(s, g, rows, g.hidden, g.kv_heads * g.head_dim)
    v = _linear(s, g, rows, g.hidden, g.kv_heads * g.head_dim)
    qr = _rope(s, q_bytes)
    s.free(q)
    kr = _rope(s, kv_bytes)
    s.free(k)
    if old[0] or old[1] or length > t:
        cache = b * g.kv_heads * length * g.head_dim * e
        kc = s.alloc(cache)
        s.free(kr)
        vc = s.alloc(cache)
        s.free(v)
        if not g.keep_old_cache:
            s.free(*old)
    else:
        kc, vc = kr, v
    rk = rv = 0
    if g.repeat_kv:
        full = b * g.heads * length * g.head_dim * e
        rk, rv = s.alloc(full), s.alloc(full)
    if g.eager:
        scores = b * g.heads * t * length
        w1 = s.alloc(scores * e)
        w2 = s.alloc(scores * e)
        s.free(w1)
        w3 = s.alloc(scores * e)
        s.free(w2)
        if g.softmax_copy:  # softmax(dtype=float32) of bf16 scores: input.to(float32) first
            up = s.alloc(scores * 4)
            sm = s.alloc(scores * 4)
            s.free(up)
        else:  # fp16 on CUDA: the fused half-to-float softmax (fp32: no cast at all)
            sm = s.alloc(scores * 4)
        p = s.alloc(scores * e) if e != 4 else sm  # .to(dtype); then the scores are dropped
        s.free(w3)
        if p != sm:
            s.free(sm)
        ctx = s.alloc(q_bytes)
    else:
        p = 0
        ctx = s.alloc(q_bytes)
    flat = s.alloc(q_bytes)  # transpose(1, 2).contiguous()
    s.free(ctx)
    o = _linear(s, g, rows, g.heads * g.head_dim, g.hidden)
    # the attention forward returns: its probabilities, rotated query and expanded K/V go
    s.free(flat, p, qr, rk, rv, x)
    h1 = s.alloc(rows * g.hidden * e)
    s.free(o, hidden)
    x = _rmsnorm(s, rows, g.hidden, e)
    if g.gated:
        gate = _linear(s, g, rows, g.hidden, g.intermediate)
        act = s.alloc(rows * g.intermediate * e)
        s.free(gate)
        up = _linear(s, g, rows, g.hidden, g.intermediate)
        mul = s.alloc(rows * g.intermediate * e)
        s.free(act, up)
    else:
        up = _linear(s, g, rows, g.hidden, g.intermediate)
        mul = s.alloc(rows * g.intermediate * e)
        s.free(up)
    down = _linear(s, g, rows, g.intermediate, g.hidden)
    s.free(mul, x)
    h2 = s.alloc(rows * g.hidden * e)
    s.free(down, h1)
    return h2, (kc, vc)


def _replay(g: GenerateShape, expandable: bool) -> GenerateReplay:
    n = events_of(g)
    if n > MAX_EVENTS:
        raise ValueError(f"about {n:,} requests to replay, above the replay limit {MAX_EVENTS:,}")
    s = _Stream(expandable)
    _call(s, g)
    stats = s.alloc_.stats()
    return GenerateReplay(stats.peak_allocated_bytes, stats.peak_reserved_bytes, stats.num_allocs)


def _call(s: _Stream, g: GenerateShape) -> None:
    """One ``generate`` call; everything it allocated is freed when it returns."""
    b, e, P = g.batch, g.elem, g.prompt
    ids = s.alloc(b * P * 8)
    mask2d = s.alloc(b * P * 8)
    cache: list[tuple[int, int]] = [(0, 0)] * g.layers
    kept_logits = 0
    length = 0
    for step in range(g.generated):
        t = P if step == 0 else 1
        length += t
        rows = b * t
        m1 = s.alloc(b * t * length * e)
        mask = s.alloc(b * t * length * e)
        s.free(m1)
        hidden = s.alloc(rows * g.hidden * e)
        new: list[tuple[int, int]] = []
        for layer in range(g.layers):
            hidden, kv = _layer(s, g, rows, t, length, hidden, cache[layer])
            new.append(kv)
        x = _rmsnorm(s, rows, g.hidden, e)
        s.free(hidden)
        head_rows = rows if g.all_prompt_logits else b
        logits = s.alloc(head_rows * g.vocab * e)
        s.free(x, mask)
        if g.all_prompt_logits:
            # logits.float() (a no-op in fp32); next_token_logits views it until the next
            # step's outputs.
            up = s.alloc(head_rows * g.vocab * 4) if e != 4 else logits
            if up != logits:
                s.free(logits)
            s.free(kept_logits)
            kept_logits = up
            scores = s.alloc(b * g.vocab * 4)  # the logits processors' output
            s.free(scores)
        else:
            # outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32); del outputs
            scores = s.alloc(b * g.vocab * 4)
            s.free(logits, scores)
        ids2 = s.alloc(b * length * 8 + b * 8)
        s.free(ids)
        ids = ids2
        m2 = s.alloc(b * length * 8 + b * 8)
        s.free(mask2d)
        mask2d = m2
        if g.keep_old_cache:
            for kv in cache:
                s.free(*kv)
        cache = new
    for kv in cache:
        s.free(*kv)
    s.free(kept_logits, ids, mask2d)


_REPLAYS: BoundedCache[tuple[GenerateShape, bool], GenerateReplay] = BoundedCache(256)


def replay_generate(g: GenerateShape, *, expandable_segments: bool = False) -> GenerateReplay:
    """The replay of one greedy ``generate`` of shape ``g`` (memoized; a shape above
    :data:`MAX_EVENTS` raises ``ValueError``)."""
    return _REPLAYS.get_or((g, expandable_segments), lambda: _replay(g, expandable_segments))
