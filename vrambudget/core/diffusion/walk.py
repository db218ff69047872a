"""The analytic tier's account of one pipeline call: the tensors each phase allocates and frees,
in the order the library's code allocates them (sizes from the formulas of :mod:`.unet`,
:mod:`.dit`, :mod:`.vae`, :mod:`.text`), replayed through the caching-allocator model
(:mod:`vrambudget.core.allocator`, a model of ``c10/cuda/CUDACachingAllocator.cpp``) for the
reserved bytes.

A walk is a list of events (the stream format of :mod:`vrambudget.core.allocator.replay`, which
the trace tier's recorder writes too), not a closed form, because what the allocator reserves
depends on the order and the sizes of the requests (a freed 1 GiB block is split for a 512 MiB
request and cannot serve the next 1 GiB one); the live bytes at every point are exact sums of
the formulas.

Tensors below 1 MiB are left out except where many are live at once (the weights): they go to
the allocator's small pool and do not change the large-pool peaks that dominate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..allocator.replay import ALLOC, EMPTY_CACHE, FREE, replay_events

__all__ = ["Outcome", "Walk", "replay"]


@dataclass
class Walk:
    """Events (kind, handle, bytes, phase index), the live bytes and their peak."""

    events: list[tuple[int, int, int, int]] = field(default_factory=list)
    tags: dict[int, str] = field(default_factory=dict)
    parts: dict[int, str] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)
    live: int = 0
    peak: int = 0
    part: str | None = None
    """The part activations allocated from now on are listed under (the running component)."""
    flash_hw: bool = True
    """The device runs SDPA's FlashAttention kernel (and the memory-efficient one in bf16):
    :func:`vrambudget.core.formulas.sdpa.flash_hardware`."""
    bf16: bool = False
    """The pipeline's 16-bit dtype is bfloat16 (below sm80 the memory-efficient kernel takes
    fp16 and fp32 only)."""
    _sizes: dict[int, int] = field(default_factory=dict)
    _next: int = 0

    def phase(self, name: str) -> None:
        self.phases.append(name)

    def alloc(self, nbytes: int, tag: str = "activations", part: str | None = None) -> int:
        """A new tensor of ``nbytes``; returns its handle."""
        self._next += 1
        h = self._next
        self.events.append((ALLOC, h, nbytes, len(self.phases) - 1))
        if tag != "activations":
            self.tags[h] = tag
        if part is None and tag == "activations":
            part = self.part
        if part is not None:
            self.parts[h] = part
        self._sizes[h] = nbytes
        self.live += nbytes
        if self.live > self.peak:
            self.peak = self.live
        return h

    def free(self, *handles: int) -> None:
        for h in handles:
            self.events.append((FREE, h, 0, len(self.phases) - 1))
            self.live -= self._sizes.pop(h)

    def size(self, handle: int) -> int:
        """Bytes of the live tensor ``handle``."""
        return self._sizes[handle]

    def temp(self, *sizes: int) -> None:
        """Tensors allocated in turn and all freed at once (a kernel's scratch)."""
        hs = [self.alloc(n) for n in sizes]
        self.free(*hs)

    def empty_cache(self) -> None:
        self.events.append((EMPTY_CACHE, 0, 0, len(self.phases) - 1))


@dataclass(frozen=True, slots=True)
class Outcome:
    peak_allocated: int
    """``max_memory_allocated()`` (allocator blocks: 512-byte rounded, unsplit remainders)."""
    peak_reserved: int
    peak_phase: str
    components: dict[str, int]
    """Requested bytes of each tag live at the allocated peak."""
    parts: dict[str, dict[str, int]]
    """Per tag, the bytes of each named part live at the allocated peak."""
    phase_reserved: tuple[tuple[str, int], ...]
    """(phase, the most bytes reserved during it) in order; a repeated phase name is merged."""


def replay(w: Walk) -> Outcome:
    """Replay ``w`` through the caching-allocator model (default options)."""
    r = replay_events(w.events)
    per_reserved: dict[str, int] = {}
    for ph, (_, reserved) in r.phases.items():
        name = w.phases[ph] if ph >= 0 else "setup"
        per_reserved[name] = max(reserved, per_reserved.get(name, -1))
    components: dict[str, int] = {}
    parts: dict[str, dict[str, int]] = {}
    for h, n in r.live.items():
        tag = w.tags.get(h, "activations")
        components[tag] = components.get(tag, 0) + n
        part = w.parts.get(h)
        if part is not None:
            bucket = parts.setdefault(tag, {})
            bucket[part] = bucket.get(part, 0) + n
    ph = w.events[r.peak_index][3] if w.events else -1
    return Outcome(
        peak_allocated=r.stats.peak_allocated_bytes,
        peak_reserved=r.stats.peak_reserved_bytes,
        peak_phase=w.phases[ph] if ph >= 0 else "setup",
        components=components,
        parts=parts,
        phase_reserved=tuple(per_reserved.items()),
    )
