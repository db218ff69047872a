"""Content codings of an answer: which one a request accepts (``Accept-Encoding`` with its
q-values, RFC 9110 12.5.3), which answers are worth compressing, and the compression itself.

Not Litestar's ``CompressionConfig``: it matches ``br`` / ``gzip`` as substrings of the header
(``br;q=0`` still gets brotli) and compresses after the handler's tag (docs/HTTP.md).

Levels, measured on this service's answers (``bench/http_representation.py``, table in
docs/PERFORMANCE.md): gzip level 6 (zlib's own default) and brotli quality 4. On a 109,117-byte
whole-catalog fit answer gzip 6 sends 6.8 % of the bytes in 0.43 ms and br 4 6.2 % in 0.24 ms;
gzip 9 and br 5 save 2-10 % more bytes for 1.4-1.8 times the time. On the 10-24 KiB answers the
two are within 2 % in size. The compressed form of a cacheable answer is kept
(:mod:`~vrambudget.http.representation`), so these costs are paid once per answer, not per
request. Both libraries release the GIL while they compress, so an answer of
:data:`THREAD_MIN_BYTES` or more is compressed in a worker thread while the event loop serves
other requests.
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache
from typing import Literal

import brotli

__all__ = [
    "BROTLI_QUALITY",
    "GZIP_LEVEL",
    "MIN_BYTES",
    "THREAD_MIN_BYTES",
    "Coding",
    "compress",
    "compressible",
    "is_text",
    "negotiate",
]

Coding = Literal["br", "gzip"]

MIN_BYTES = 1024
"""An answer shorter than this is sent as it is: below about 1 KiB a JSON answer shrinks by a
few hundred bytes at most (one TCP segment holds 1,460), and the coding's own framing (gzip: 18
bytes of header and trailer) eats part of that."""

THREAD_MIN_BYTES = 64 << 10
"""From this size an answer is compressed in a worker thread (about 0.2-0.3 ms of compression at
these levels for a 64 KiB JSON answer, against a thread hand-off's tens of µs), so that no large
answer holds the event loop."""

GZIP_LEVEL = 6
"""zlib's default (``Z_DEFAULT_COMPRESSION``), the usual trade-off; the measured table is in the
module docstring."""

BROTLI_QUALITY = 4
"""On the large answers up to 9 % smaller than gzip 6 in 44-60 % less time; quality 5 costs
1.6-1.8x for 6-10 % fewer bytes (module docstring)."""

# Server preference among codings a request accepts with the same q-value: br is the smaller.
_PREFERENCE: tuple[Coding, ...] = ("br", "gzip")
_ALIASES = {"x-gzip": "gzip"}  # RFC 9110 8.4.1.3: x-gzip is gzip
_Q = re.compile(r"^q=(?:(0(?:\.\d{0,3})?)|(1(?:\.0{0,3})?))$", re.IGNORECASE)

_TEXT_TYPES = re.compile(
    r"^(?:text/[a-z0-9.+-]+|application/(?:[a-z0-9.+-]+\+)?(?:json|xml|yaml|x-yaml|javascript)"
    r"|image/svg\+xml)$"
)


def _qvalues(accept_encoding: str) -> dict[str, float]:
    """``{coding: q}`` of an ``Accept-Encoding`` value, lower-cased; a malformed q-value makes
    its coding unacceptable (q=0) rather than an error."""
    out: dict[str, float] = {}
    for item in accept_encoding.split(","):
        parts = [p.strip() for p in item.split(";")]
        name = parts[0].lower()
        if not name:
            continue
        q = 1.0
        for param in parts[1:]:
            if param[:2].lower() == "q=":
                m = _Q.match(param.replace(" ", ""))
                q = float(m.group(1) or m.group(2)) if m else 0.0
        name = _ALIASES.get(name, name)
        out[name] = max(q, out.get(name, 0.0))
    return out


@lru_cache(maxsize=256)  # browsers and clients send a handful of distinct values
def negotiate(accept_encoding: str | None) -> Coding | None:
    """The coding to send an answer in, or ``None`` for the answer as it is.

    A coding the request names with q > 0 is acceptable, and so is one matched only by ``*``
    with q > 0; the highest q wins, br before gzip at equal q. No header, an empty one, or
    none acceptable: ``None`` (RFC 9110 12.5.3: identity is then sent, even where the request
    said ``identity;q=0``, which the service does not answer with 415)."""
    if not accept_encoding:
        return None
    q = _qvalues(accept_encoding)
    star = q.get("*", 0.0)
    best: Coding | None = None
    best_q = 0.0
    for coding in _PREFERENCE:
        value = q.get(coding, star)
        if value > best_q:
            best, best_q = coding, value
    return best


def compressible(media_type: str | None, size: int) -> bool:
    """Whether an answer of this media type and size is worth compressing: a textual type
    (JSON, problem+json, YAML, SVG, HTML, JavaScript, plain text) of at least
    :data:`MIN_BYTES`."""
    return size >= MIN_BYTES and media_type is not None and is_text(media_type)


def is_text(media_type: str) -> bool:
    """Whether a media type (parameters allowed) is one that compresses."""
    return bool(_TEXT_TYPES.match(media_type.split(";", 1)[0].strip().lower()))


def compress(body: bytes, coding: Coding) -> bytes:
    """``body`` in ``coding``: gzip at :data:`GZIP_LEVEL` (the gzip file format, RFC 1952),
    brotli at :data:`BROTLI_QUALITY` in its text mode."""
    if coding == "gzip":
        packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return packer.compress(body) + packer.flush()
    out: bytes = brotli.compress(body, quality=BROTLI_QUALITY, mode=brotli.MODE_TEXT)
    return out
