"""Entity tags and the If-None-Match comparison (RFC 9110 8.8.3, 13.1.2)."""

from __future__ import annotations

import base64
import hashlib

import pytest

from vrambudget.http.validators import DigestMemo, digest, entity_tag, none_match


def test_the_tag_is_the_truncated_sha256_of_the_bytes_and_names_the_coding() -> None:
    body = b'{"total_bytes":17179869184}'
    # by hand: the first 16 bytes of SHA-256, base64url without padding (22 characters)
    expected = base64.urlsafe_b64encode(hashlib.sha256(body).digest()[:16]).decode().rstrip("=")
    assert len(expected) == 22
    assert digest(body) == hashlib.sha256(body).digest()
    assert entity_tag(digest(body)) == f'"{expected}"'
    assert entity_tag(digest(body), "gzip") == f'"{expected}-gzip"'
    assert entity_tag(digest(body), "br") == f'"{expected}-br"'
    assert entity_tag(digest(body + b" ")) != entity_tag(digest(body))


TAG = '"abc-br"'


@pytest.mark.parametrize(
    ("if_none_match", "matches"),
    [
        ('"abc-br"', True),
        ('W/"abc-br"', True),  # weak comparison: W/ is ignored
        ('"x", "abc-br"', True),
        ('"x",W/"abc-br"', True),
        (' , "x" ,, "abc-br" ', True),  # empty list elements are allowed
        ("*", True),
        ('"abc"', False),  # another representation (identity) of the same answer
        ('"abc-gzip"', False),
        ('"ABC-BR"', False),  # opaque tags compare octet by octet
        ('"x"', False),
        ("abc-br", False),  # unquoted: malformed, matches nothing
        ('"abc-br', False),
        ("", False),
    ],
)
def test_if_none_match_uses_the_weak_comparison(if_none_match: str, matches: bool) -> None:
    assert none_match(if_none_match, TAG) is matches


def test_a_weak_current_tag_compares_weakly_too() -> None:
    assert none_match('"abc"', 'W/"abc"')


def test_the_digest_memo_knows_an_answer_by_its_object_and_stays_bounded() -> None:
    memo = DigestMemo(max_entries=2, max_bytes=100)
    a = b"a" * 40
    assert memo.of(a) == hashlib.sha256(a).digest() and len(memo) == 1
    assert memo.of(a) == hashlib.sha256(a).digest() and len(memo) == 1  # the same object: a hit
    twin = bytes(bytearray(a))  # equal bytes, another object: hashed anew, kept apart
    assert twin is not a and memo.of(twin) == hashlib.sha256(a).digest() and len(memo) == 2
    c = b"c" * 40  # a third: the oldest goes (entries bound)
    assert memo.of(c) == hashlib.sha256(c).digest() and len(memo) == 2
    d = b"d" * 90  # 40 + 90 > 100 bytes: only d is left
    assert memo.of(d) == hashlib.sha256(d).digest() and len(memo) == 1
    big = b"e" * 101  # larger than the bound on its own: hashed, not kept
    assert memo.of(big) == hashlib.sha256(big).digest() and len(memo) == 1
