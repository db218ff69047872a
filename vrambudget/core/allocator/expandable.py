"""``expandable_segments:True``: one virtual range per pool, physical pages mapped into it on
demand and unmapped when whole pages are free (``ExpandableSegment``, ``find_expandable_block``,
``map_block``, ``try_allocate_expandable_block``, ``unmap_block``)."""

from __future__ import annotations

from .blocks import _Block, _ExpandableSegment, _Pool
from .pools import _BlockPools
from .sizes import LARGE_BUFFER_BYTES, SMALL_BUFFER_BYTES


class _ExpandableSegments(_BlockPools):
    """The expandable-segment half of ``DeviceCachingAllocator`` (base of
    :class:`~vrambudget.core.allocator.caching.CachingAllocator`, which sets the fields)."""

    _next_va: int
    _expandable_va_bytes: int

    def _release_expandable_blocks(self, pool: _Pool) -> None:
        """``release_blocks`` for expandable segments: unmap whole free pages of free blocks."""
        for block in [pool.by_key[key] for key in pool.keys]:
            self._unmap_block(pool, block)
            if block.prev is None and block.next is None and not block.mapped:
                self._remove_unmapped(pool, block)  # release_expandable_segment

    # -- expandable segments -------------------------------------------------------------------

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """``find_expandable_block``: lowest unmapped range (with a free block before it) that
        has room for size, else a new segment spanning the whole reserved address space."""
        for addr in pool.unmapped_addrs:
            candidate = pool.unmapped[addr]
            prev = candidate.prev
            if prev is not None and not prev.allocated:
                candidate = prev
            room = 0
            walk: _Block | None = candidate
            while room < size and walk is not None and not walk.allocated:
                room += walk.size
                walk = walk.next
            if room >= size:
                return candidate
        page_bytes = SMALL_BUFFER_BYTES if pool.is_small else LARGE_BUFFER_BYTES
        va_bytes = -(-self._expandable_va_bytes // page_bytes) * page_bytes
        segment = _ExpandableSegment(self._next_va, page_bytes, va_bytes)
        self._next_va += va_bytes
        block = _Block(segment.base, va_bytes, pool, segment, mapped=False)
        self._insert_unmapped(pool, block)
        return block

    def _map_block(self, pool: _Pool, to_map: _Block, size: int) -> None:
        """``map_block`` / ``ExpandableSegment::map``: back the first size bytes with pages."""
        segment = to_map.segment
        assert segment is not None and not to_map.mapped
        page = segment.page_bytes
        mapped_bytes = -(-size // page) * page  # to_map starts on a page boundary
        self._remove_unmapped(pool, to_map)
        to_map.mapped = True
        if mapped_bytes < to_map.size:
            remaining = _Block(
                to_map.addr + mapped_bytes, to_map.size - mapped_bytes, pool, segment, mapped=False
            )
            remaining.prev = to_map
            remaining.next = to_map.next
            if to_map.next is not None:
                to_map.next.prev = remaining
            to_map.next = remaining
            self._insert_unmapped(pool, remaining)
            to_map.size = mapped_bytes
        self._try_merge_blocks(pool, to_map, to_map.prev)
        self._try_merge_blocks(pool, to_map, to_map.next)
        self._insert_free(pool, to_map)
        self._add_reserved(mapped_bytes)

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """``try_allocate_expandable_block``: map pages until one free block holds size."""
        candidate = self._find_expandable_block(pool, size)
        if not candidate.mapped:
            self._map_block(pool, candidate, min(candidate.size, size))
        while candidate.size < size:
            # free -> unmapped: map part of the unmapped block; it absorbs the free one.
            nxt = candidate.next
            assert nxt is not None and not nxt.mapped
            self._map_block(pool, nxt, min(size - candidate.size, nxt.size))
            candidate = nxt
        self._remove_free(pool, candidate)
        return candidate

    def _unmap_block(self, pool: _Pool, block: _Block) -> None:
        """``unmap_block`` / ``ExpandableSegment::unmap``: give back the whole free pages."""
        segment = block.segment
        assert segment is not None
        page = segment.page_bytes
        offset = block.addr - segment.base
        begin = -(-offset // page)
        end = (offset + block.size) // page
        if begin >= end:
            return
        self._remove_free(pool, block)
        unmapped_addr = segment.base + begin * page
        unmapped_bytes = (end - begin) * page
        before = unmapped_addr - block.addr
        if before > 0:
            before_free = _Block(block.addr, before, pool, segment)
            before_free.prev = block.prev
            if block.prev is not None:
                block.prev.next = before_free
            before_free.next = block
            block.prev = before_free
            self._insert_free(pool, before_free)
        after = block.size - before - unmapped_bytes
        if after > 0:
            after_free = _Block(unmapped_addr + unmapped_bytes, after, pool, segment)
            after_free.prev = block
            after_free.next = block.next
            if block.next is not None:
                block.next.prev = after_free
            block.next = after_free
            self._insert_free(pool, after_free)
        block.addr = unmapped_addr
        block.size = unmapped_bytes
        block.mapped = False
        self._try_merge_blocks(pool, block, block.prev)
        self._try_merge_blocks(pool, block, block.next)
        self._insert_unmapped(pool, block)
        self._reserved -= unmapped_bytes
