"""Entity tags of answers and the ``If-None-Match`` precondition (RFC 9110 8.8.3, 13.1.2).

An answer's tag is strong and names its exact bytes: the first 128 bits of the SHA-256 of the
answer as the handler wrote it, and the content coding it is sent in (``"<hash>"``,
``"<hash>-gzip"``, ``"<hash>-br"``): the gzip and brotli representations are other byte
sequences, so they carry other strong tags (RFC 9110 8.8.3.3), and a cache that stored the one
it was sent revalidates with that one.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections import OrderedDict

from .encoding import Coding

__all__ = ["DigestMemo", "digest", "entity_tag", "none_match"]

_TAG = re.compile(r'(?:\s*,)*\s*(?:W/)?"([\x21\x23-\x7e\x80-\xff]*)"\s*(?:,|$)')


def digest(body: bytes) -> bytes:
    """The SHA-256 of an answer as the handler wrote it (its tag and the key of its compressed
    forms)."""
    return hashlib.sha256(body).digest()


class DigestMemo:
    """:func:`digest` of answers by object identity, bounded by entries and by bytes.

    The service's answer cache hands out the *same* bytes object for a repeated request, so its
    digest need not be computed again (a whole-catalog fit: 54 µs). An entry holds its bytes, so
    no other object can take its ``id`` while it is kept, and a hit is checked with ``is``: an
    equal answer in another object is hashed anew, never mistaken."""

    def __init__(self, max_entries: int = 256, max_bytes: int = 8 << 20) -> None:
        self._entries: OrderedDict[int, tuple[bytes, bytes]] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def of(self, body: bytes) -> bytes:
        key = id(body)
        hit = self._entries.get(key)
        if hit is not None and hit[0] is body:
            self._entries.move_to_end(key)
            return hit[1]
        value = digest(body)
        if len(body) > self._max_bytes:
            return value
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])
        self._entries[key] = (body, value)
        self._bytes += len(body)
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            _, (gone, _) = self._entries.popitem(last=False)
            self._bytes -= len(gone)
        return value


def entity_tag(body_digest: bytes, coding: Coding | None = None) -> str:
    """The strong entity tag (quoted) of the answer whose :func:`digest` is ``body_digest``,
    sent in ``coding`` (``None``: as it is)."""
    opaque = base64.urlsafe_b64encode(body_digest[:16]).rstrip(b"=").decode()
    return f'"{opaque}-{coding}"' if coding else f'"{opaque}"'


def none_match(if_none_match: str, tag: str) -> bool:
    """Whether ``If-None-Match: <if_none_match>`` *fails* for the current representation with
    the entity tag ``tag``, i.e. the client already holds it: ``*``, or a listed tag equal to
    ``tag`` under the weak comparison (RFC 9110 8.8.3.2: ``W/"x"`` matches ``"x"``), which
    If-None-Match uses (13.1.2). A malformed list matches nothing (the request is served)."""
    value = if_none_match.strip()
    if value == "*":
        return True
    opaque = tag.removeprefix("W/")
    pos = 0
    while value[pos:].strip(", \t"):
        m = _TAG.match(value, pos)
        if m is None:
            return False
        if f'"{m.group(1)}"' == opaque:
            return True
        pos = m.end()
    return False
