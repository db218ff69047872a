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

from .encoding import Coding

__all__ = ["digest", "entity_tag", "none_match"]

_TAG = re.compile(r'(?:\s*,)*\s*(?:W/)?"([\x21\x23-\x7e\x80-\xff]*)"\s*(?:,|$)')


def digest(body: bytes) -> bytes:
    """The SHA-256 of an answer as the handler wrote it (its tag and the key of its compressed
    forms)."""
    return hashlib.sha256(body).digest()


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
