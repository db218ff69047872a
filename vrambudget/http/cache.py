"""A bounded LRU of encoded answers."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["AnswerCache"]


class AnswerCache:
    """Encoded answers by exact request body. The answer is a pure function of the body (the
    catalogs are fixed at start-up), so a repeated request -- a catalog page calling on every
    view -- is served without decoding or computing. Bounded LRU; errors are never cached.
    The service also keeps one for trace answers, keyed by the canonical request hash
    (``("trace", sha256)``, see ``vrambudget.service.tracing``)."""

    def __init__(self, max_entries: int) -> None:
        self._entries: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()
        self._max = max_entries

    def get(self, key: tuple[str, bytes]) -> bytes | None:
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
        return hit

    def put(self, key: tuple[str, bytes], value: bytes) -> bytes:
        if self._max:
            self._entries[key] = value
            if len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return value
