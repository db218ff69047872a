"""The one memo mechanism of the core: a dict bounded by entries (oldest out first).

Every cache keyed by something a caller controls (a custom device, a workload) is one of these,
so no request can grow the process's memory without bound. ``functools.lru_cache`` (with a
``maxsize``) is used where a function's arguments are the key."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["BoundedCache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(dict[K, V], Generic[K, V]):
    """A dict that forgets its oldest entry beyond ``max_entries``. Reads are plain dict reads
    (``get`` in C); only insertions pay for the bound."""

    __slots__ = ("max_entries",)

    def __init__(self, max_entries: int) -> None:
        super().__init__()
        self.max_entries = max_entries

    def put(self, key: K, value: V) -> V:
        self[key] = value
        if len(self) > self.max_entries:
            try:
                del self[next(iter(self))]
            except (KeyError, RuntimeError, StopIteration):
                # another thread evicted it first, or changed the dict meanwhile: the bound
                # holds within the entries being put at once
                pass
        return value

    def get_or(self, key: K, compute: Callable[[], V]) -> V:
        """The cached value of ``key``, computed and kept on a miss."""
        hit = self.get(key)
        return hit if hit is not None else self.put(key, compute())
