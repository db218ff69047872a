"""The pools' free lists, the counters that blocks moving between them change, and freeing
(``free_block`` and ``try_merge_blocks``): what the native and the expandable paths share."""

from __future__ import annotations

from bisect import bisect_left, insort

from .blocks import _KEY_SHIFT, _Block, _Pool


class _BlockPools:
    """The free-list and freeing half of ``DeviceCachingAllocator`` (base of
    :class:`~vrambudget.core.allocator.caching.CachingAllocator`, which sets the counters)."""

    _reserved: int
    _peak_reserved: int
    _inactive: int
    _peak_inactive: int
    _requested: int

    # -- pools ---------------------------------------------------------------------------------

    def _insert_free(self, pool: _Pool, block: _Block) -> None:
        key = (block.size << _KEY_SHIFT) | block.addr
        insort(pool.keys, key)
        pool.by_key[key] = block
        if block.prev is None and block.next is None and block.segment is None:
            pool.whole[block.addr] = block

    def _remove_free(self, pool: _Pool, block: _Block) -> None:
        key = (block.size << _KEY_SHIFT) | block.addr
        keys = pool.keys
        del keys[bisect_left(keys, key)]
        del pool.by_key[key]
        pool.whole.pop(block.addr, None)

    def _insert_unmapped(self, pool: _Pool, block: _Block) -> None:
        insort(pool.unmapped_addrs, block.addr)
        pool.unmapped[block.addr] = block

    def _remove_unmapped(self, pool: _Pool, block: _Block) -> None:
        addrs = pool.unmapped_addrs
        del addrs[bisect_left(addrs, block.addr)]
        del pool.unmapped[block.addr]

    # -- stats ---------------------------------------------------------------------------------

    def _add_reserved(self, nbytes: int) -> None:
        self._reserved += nbytes
        self._peak_reserved = max(self._peak_reserved, self._reserved)

    def _add_inactive(self, nbytes: int) -> None:
        self._inactive += nbytes
        self._peak_inactive = max(self._peak_inactive, self._inactive)

    # -- freeing -------------------------------------------------------------------------------

    def _free_block(self, pool: _Pool, block: _Block) -> None:
        """``free_block``: merge with free neighbours, re-pool, adjust ``inactive_split``."""
        requested_bytes = block.requested_bytes
        net_inactive = 0
        for candidate in (block.prev, block.next):
            net_inactive -= self._try_merge_blocks(pool, block, candidate)
        self._insert_free(pool, block)
        if block.prev is not None or block.next is not None:
            net_inactive += block.size
        if block.segment is None:
            if net_inactive > 0:
                self._add_inactive(net_inactive)
            else:
                self._inactive += net_inactive
        self._requested -= requested_bytes

    def _try_merge_blocks(self, pool: _Pool, dst: _Block, src: _Block | None) -> int:
        """``try_merge_blocks``: absorb a free neighbour of the same mapped state."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            self._remove_free(pool, src)
        else:
            self._remove_unmapped(pool, src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size
