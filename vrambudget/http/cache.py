"""A bounded LRU of encoded answers, bounded by entries and by bytes."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["KEY_OVERHEAD_BYTES", "AnswerCache"]

KEY_OVERHEAD_BYTES = 256
"""What one entry costs beyond its answer and key bytes (the OrderedDict node, the key tuple,
the bytes objects' headers), counted so that many tiny answers are bounded too."""


class AnswerCache:
    """Encoded answers by a key of the canonical request -- ``(kind, sha256 of the decoded
    request re-encoded)``, never the raw body, so whitespace-padded or reordered variants of
    one request share one entry and a key costs 32 bytes, not up to the body limit. The answer
    is a pure function of the request (the catalogs are fixed at start-up), so a repeated
    request -- a catalog page calling on every view -- is served without computing. Bounded
    LRU by entries *and* by bytes (answer + key + :data:`KEY_OVERHEAD_BYTES` per entry); an
    answer larger than the byte bound on its own is not kept. Errors are never cached. The
    service keeps one for analytic answers and one for trace answers (``("trace", sha256)``,
    see ``vrambudget.service.tracing``)."""

    def __init__(self, max_entries: int, max_bytes: int | None = None) -> None:
        self._entries: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes the entries are counted at (answers, keys and the per-entry overhead)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _cost(key: tuple[str, bytes], value: bytes) -> int:
        return len(value) + len(key[1]) + len(key[0]) + KEY_OVERHEAD_BYTES

    def get(self, key: tuple[str, bytes]) -> bytes | None:
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
        return hit

    def put(self, key: tuple[str, bytes], value: bytes) -> bytes:
        if not self._max:
            return value
        cost = self._cost(key, value)
        if self._max_bytes is not None and cost > self._max_bytes:
            return value
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= self._cost(key, old)
        self._entries[key] = value
        self._bytes += cost
        while len(self._entries) > self._max or (
            self._max_bytes is not None and self._bytes > self._max_bytes
        ):
            k, v = self._entries.popitem(last=False)
            self._bytes -= self._cost(k, v)
        return value
