"""The source's ``Block``, ``BlockPool`` and ``ExpandableSegment``: plain records, no rules."""

from __future__ import annotations

# A free block's sort key is size << _KEY_SHIFT | address, which orders like
# BlockComparatorSize (size, then ptr) for the one stream modelled.
_KEY_SHIFT = 80


class _ExpandableSegment:
    """One reserved virtual range that physical pages are mapped into (``ExpandableSegment``)."""

    __slots__ = ("base", "page_bytes", "va_bytes")

    def __init__(self, base: int, page_bytes: int, va_bytes: int) -> None:
        self.base = base
        self.page_bytes = page_bytes
        self.va_bytes = va_bytes


class _Block:
    """The source's ``Block``: a range of a segment, linked to its neighbours by prev/next."""

    __slots__ = (
        "addr",
        "allocated",
        "mapped",
        "next",
        "pool",
        "prev",
        "requested_bytes",
        "segment",
        "size",
    )

    def __init__(
        self,
        addr: int,
        size: int,
        pool: _Pool,
        segment: _ExpandableSegment | None = None,
        mapped: bool = True,
    ) -> None:
        self.addr = addr
        self.size = size
        self.pool = pool
        self.requested_bytes = 0
        self.allocated = False
        self.mapped = mapped
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.segment = segment


class _Pool:
    """``BlockPool``: free mapped blocks sorted like ``blocks``; unmapped ones by address.

    ``whole`` indexes the free blocks that are a whole (unsplit) cudaMalloc segment, the only
    ones ``release_blocks`` can return, so that releasing never scans the split ones.
    """

    __slots__ = ("by_key", "is_small", "keys", "unmapped", "unmapped_addrs", "whole")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.keys: list[int] = []
        self.by_key: dict[int, _Block] = {}
        self.whole: dict[int, _Block] = {}
        self.unmapped_addrs: list[int] = []
        self.unmapped: dict[int, _Block] = {}


def _expandable_size(block: _Block) -> int:
    """What ``get_free_block`` ranks an expandable block by: its size plus an unmapped tail."""
    nxt = block.next
    return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)
