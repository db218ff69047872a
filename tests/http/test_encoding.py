"""Content-coding negotiation (RFC 9110 12.5.3), what is worth compressing, and the codings'
round trip."""

from __future__ import annotations

import gzip

import brotli
import pytest

from vrambudget.http.encoding import MIN_BYTES, compress, compressible, negotiate


@pytest.mark.parametrize(
    ("accept_encoding", "chosen"),
    [
        (None, None),
        ("", None),
        ("identity", None),
        ("gzip", "gzip"),
        ("x-gzip", "gzip"),  # RFC 9110 8.4.1.3
        ("GZIP", "gzip"),
        ("br", "br"),
        ("gzip, deflate, br", "br"),  # equal q: the server's preference, br
        ("gzip, deflate, br, zstd", "br"),
        ("deflate", None),  # not offered by the service
        ("zstd", None),
        ("br;q=0, gzip", "gzip"),  # refused by q=0
        ("br;q=0.5, gzip;q=0.8", "gzip"),  # the higher q wins
        ("br;q=0.8, gzip;q=0.5", "br"),
        ("gzip;q=1.0, br;q=0.999", "gzip"),
        ("gzip ; q=0.7 , br ; q=0.6", "gzip"),  # OWS around the separators
        ("*", "br"),
        ("*;q=0", None),
        ("*;q=0.1, br;q=0", "gzip"),  # * covers what is not named
        ("gzip;q=0, br;q=0", None),
        ("br;q=2", None),  # malformed q: that coding is refused, not a 400
        ("br;q=0.1234", None),  # four decimals: malformed
        ("gzip;level=9", "gzip"),  # other parameters are ignored
        ("identity;q=0", None),  # RFC: identity is still sent
    ],
)
def test_negotiation_follows_q_values(accept_encoding: str | None, chosen: str | None) -> None:
    assert negotiate(accept_encoding) == chosen


@pytest.mark.parametrize(
    ("media_type", "size", "worth"),
    [
        ("application/json", MIN_BYTES, True),
        ("application/json", MIN_BYTES - 1, False),
        ("application/problem+json", 4096, True),
        ("application/vnd.oai.openapi+json", 4096, True),
        ("application/json; charset=utf-8", 4096, True),
        ("application/yaml", 4096, True),
        ("image/svg+xml", 4096, True),
        ("text/html; charset=utf-8", 4096, True),
        ("text/javascript", 4096, True),
        ("text/plain; version=0.0.4", 4096, True),  # Prometheus' exposition format
        ("image/png", 1 << 20, False),  # already compressed
        ("application/octet-stream", 1 << 20, False),
        ("application/gzip", 1 << 20, False),
        (None, 4096, False),
    ],
)
def test_only_large_textual_answers_are_compressed(
    media_type: str | None, size: int, worth: bool
) -> None:
    assert compressible(media_type, size) is worth


def test_both_codings_decode_to_the_same_bytes() -> None:
    body = b'{"component":"kv_cache","bytes":1073741824},' * 500
    packed = compress(body, "gzip")
    assert packed[:2] == b"\x1f\x8b"  # the gzip file format (RFC 1952), not a raw zlib stream
    assert gzip.decompress(packed) == body
    assert brotli.decompress(compress(body, "br")) == body
    assert len(compress(body, "br")) < len(body) // 20
